"""TF through real rclpy nodes in one process: the camera mount from /tf_static, the TF output's
transforms, the refusal to publish a child frame someone else publishes, and clean destruction.

Each test gets its own Context with DDS discovery off (nothing leaves the process) and a random
domain; one background executor thread spins every node; waits poll a condition with a deadline.
The tf2_ros backend runs where tf2_ros imports (a ROS distro) and is skipped, with the reason,
in the venv.
"""
import random

import numpy as np
import pytest

from helpers import need_module  # noqa: I001 (before the ROS imports it guards)

rclpy = need_module("rclpy", module_level=True)
tf2_msgs = need_module("tf2_msgs.msg", module_level=True)
from builtin_interfaces.msg import Time  # noqa: E402
from rclpy.context import Context  # noqa: E402

from helpers import (BASE_OPTICAL, BASE_TO_LINK, LINK_TO_OPTICAL, OPTICAL_BASE, RZ90, H, rigid,  # noqa: E402
                     background_spin, transform_matrix, wait_until)

from lingbot_ros.ros.executor import PoolExecutor  # noqa: E402
from lingbot_ros.ros.messages import transform_stamped  # noqa: E402
from lingbot_ros.ros.qos import TF_QOS, TF_STATIC_QOS  # noqa: E402
from lingbot_ros.ros.tf_lookup import TfLookup  # noqa: E402
from lingbot_ros.ros.tf_output import TfConflictWatch, TfOutput  # noqa: E402

pytestmark = pytest.mark.ros
TIMEOUT = 20.0
TFMessage = tf2_msgs.TFMessage
RZ180 = [[-1, 0, 0], [0, -1, 0], [0, 0, 1]]

TF2_ROS = "scripts/install_tf2.sh builds it from ../shared/vendor/geometry2; scripts/setup.sh runs it"
NEEDS_TF2_ROS = pytest.mark.usefixtures("tf2_ros")


@pytest.fixture
def tf2_ros():
    return need_module("tf2_ros", TF2_ROS)


@pytest.fixture(params=["tf_static", "tf2_ros"])
def backend(request):
    """Each TF lookup backend; tf2_ros where it imports (missing() where it does not)."""
    if request.param == "tf2_ros":
        need_module("tf2_ros", TF2_ROS)
    return request.param

# Where rclpy's message info names the publisher, the watch names the other node exactly.
try:   # Kilted's rclpy declares the message info it passes, publisher gid included
    from rclpy.subscription import MessageInfo
    HAS_PUBLISHER_GID = "publisher_gid" in MessageInfo.__annotations__
except ImportError:   # Jazzy's passes a plain dict: whether it names the publisher is not declared
    HAS_PUBLISHER_GID = False


def wait(condition, what: str):
    return wait_until(condition, what, TIMEOUT)


def wait_pose(lookup, what: str) -> np.ndarray:
    """Poll ``lookup()`` (a [4, 4] array or None) until it finds the transform."""
    return wait(lambda: [pose for pose in [lookup()] if pose is not None], what)[0]


def stamp(sec: int, nanosec: int = 0) -> Time:
    return Time(sec=sec, nanosec=nanosec)


class Ros:
    """One context, its nodes and the executor thread spinning them."""

    def __init__(self):
        self.context = Context()
        rclpy.init(context=self.context, domain_id=random.SystemRandom().randint(1, 100))
        self.executor = PoolExecutor(2, context=self.context)
        self.nodes = []
        self.spin = background_spin(self.executor)

    def node(self, name: str):
        node = rclpy.create_node(name, context=self.context)
        self.nodes.append(node)
        self.executor.add_node(node)
        return node

    def close(self):
        self.spin.stop()
        for node in self.nodes:
            node.destroy_node()
        self.context.try_shutdown()
        assert not self.spin.running


@pytest.fixture
def ros(monkeypatch):
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "OFF")
    env = Ros()
    yield env
    env.close()


def tf_message(*edges) -> TFMessage:
    """TFMessage of (parent, child, geometry_msgs/Transform or [4, 4], stamp) edges."""
    msg = TFMessage()
    for parent, child, transform, at in edges:
        pose = transform if isinstance(transform, np.ndarray) else transform_matrix(transform)
        msg.transforms.append(transform_stamped(pose, at, parent, child))
    return msg


def publish_robot_tree(robot):
    """The robot's URDF frames, latched on /tf_static, as robot_state_publisher sends them."""
    publisher = robot.create_publisher(TFMessage, "/tf_static", TF_STATIC_QOS)
    publisher.publish(tf_message(("base_link", "camera_link", BASE_TO_LINK, stamp(0)),
                                 ("camera_link", "camera_optical_frame", LINK_TO_OPTICAL, stamp(0))))
    return publisher


# -- the camera mount ----------------------------------------------------------------------------

def test_the_mount_comes_from_tf_static_published_before_the_lookup_started(ros, backend):
    publish_robot_tree(ros.node("robot"))   # published first: transient local delivers it late
    lookup = TfLookup(ros.node("mapper"), backend=backend)
    assert lookup.backend == backend
    base_camera = wait_pose(lambda: lookup.lookup("base_link", "camera_optical_frame"), "base_link -> camera")
    np.testing.assert_allclose(base_camera, BASE_OPTICAL, atol=1e-9)
    np.testing.assert_allclose(lookup.lookup("camera_optical_frame", "base_link"), OPTICAL_BASE, atol=1e-9)


def test_a_camera_beside_the_base_is_found_through_their_common_root(ros, backend):
    robot = ros.node("robot")
    publisher = robot.create_publisher(TFMessage, "/tf_static", TF_STATIC_QOS)
    lookup = TfLookup(ros.node("mapper"), backend=backend)
    publisher.publish(tf_message(("base_footprint", "base_link", rigid(np.eye(3), (0, 0, 0.1)), stamp(0)),
                                 ("base_footprint", "mast", rigid(np.eye(3), (0.2, 0, 0.5)), stamp(0)),
                                 ("mast", "cam", rigid(RZ90, (0, 0, 0.1)), stamp(0))))
    base_camera = wait_pose(lambda: lookup.lookup("base_link", "cam"), "base_link -> cam")
    np.testing.assert_allclose(base_camera, rigid(RZ90, (0.2, 0, 0.5)), atol=1e-9)


def test_without_tf2_ros_a_missing_mount_and_odometry_say_why(ros):
    publish_robot_tree(ros.node("robot"))
    lookup = TfLookup(ros.node("mapper"), backend="tf_static")
    wait(lambda: lookup.lookup("base_link", "camera_optical_frame") is not None, "the robot tree")
    assert lookup.lookup("base_link", "camera_color_optical_frame") is None
    assert "'camera_color_optical_frame' not on /tf_static" in lookup.last_failure
    assert not lookup.dynamic
    assert lookup.lookup_at("odom", "base_link", stamp(5)) is None
    assert "needs tf2_ros" in lookup.last_failure and "from a topic" in lookup.last_failure


@NEEDS_TF2_ROS
def test_with_tf2_ros_odometry_is_interpolated_at_the_image_stamp(ros):
    robot = ros.node("robot")
    publisher = robot.create_publisher(TFMessage, "/tf", TF_QOS)
    lookup = TfLookup(ros.node("mapper"), backend="tf2_ros")
    wait(lambda: publisher.get_subscription_count(), "the listener's /tf subscription")
    publisher.publish(tf_message(("odom", "base_link", rigid(np.eye(3), (1.0, 0, 0)), stamp(10)),))
    publisher.publish(tf_message(("odom", "base_link", rigid(np.eye(3), (2.0, 0, 0)), stamp(11)),))
    odom_base = wait_pose(lambda: lookup.lookup_at("odom", "base_link", stamp(10, 250_000_000)), "odom -> base")
    np.testing.assert_allclose(odom_base, rigid(np.eye(3), (1.25, 0, 0)), atol=1e-9)
    assert lookup.lookup_at("odom", "base_link", stamp(20)) is None   # no extrapolation
    assert "odom -> base_link" in lookup.last_failure


def test_a_destroyed_lookup_leaves_no_subscription(ros, backend):
    node = ros.node("mapper")
    before = len(list(node.subscriptions))
    lookup = TfLookup(node, backend=backend)
    assert node.count_subscribers("/tf_static") == 1
    lookup.destroy()
    assert len(list(node.subscriptions)) == before
    wait(lambda: node.count_subscribers("/tf_static") == 0 and node.count_subscribers("/tf") == 0,
         "no /tf or /tf_static subscriber in the graph")


# -- the TF output -------------------------------------------------------------------------------

class TfProbe:
    """Records every transform on /tf."""

    def __init__(self, node):
        self.transforms = []
        node.create_subscription(TFMessage, "/tf", lambda msg: self.transforms.extend(msg.transforms), TF_QOS)


# T_odom_base: (1, 2, 0), yaw 90; T_map_base: (3, 1, 0), yaw 180. By hand, T_map_odom =
# T_map_base @ inverse(T_odom_base): inverse(T_odom_base) = yaw -90, (-2, 1, 0); so yaw 90 and
# (3, 1, 0) + RZ180 @ (-2, 1, 0) = (5, 0, 0). (Check: RZ90 @ (1, 2, 0) + (5, 0, 0) = (3, 1, 0).)
ODOM_BASE = rigid(RZ90, (1.0, 2.0, 0.0))
MAP_BASE = rigid(RZ180, (3.0, 1.0, 0.0))
MAP_CAMERA = rigid(np.eye(3), (0.5, -0.5, 1.5))


@pytest.mark.parametrize("mode, child, translation, quaternion", [
    ("map_to_odom", "odom", (5.0, 0.0, 0.0), (0.0, 0.0, H, H)),
    ("map_to_base", "base_link", (3.0, 1.0, 0.0), (0.0, 0.0, 1.0, 0.0)),
    ("map_to_camera", "lingbot_camera", (0.5, -0.5, 1.5), (0.0, 0.0, 0.0, 1.0)),
])
def test_each_mode_publishes_its_edge_at_the_image_stamp(ros, mode, child, translation, quaternion):
    probe = TfProbe(ros.node("probe"))
    output = TfOutput(ros.node("mapper"), mode, "map", "odom", "base_link", "lingbot_camera")
    wait(lambda: output._publisher.get_subscription_count() >= 2, "the probe's /tf subscription")
    assert output.publish(stamp(42, 5), MAP_BASE, MAP_CAMERA, ODOM_BASE)
    (t,) = wait(lambda: probe.transforms, "the transform")
    assert (t.header.frame_id, t.child_frame_id) == ("map", child)
    assert (t.header.stamp.sec, t.header.stamp.nanosec) == (42, 5)
    got = t.transform
    np.testing.assert_allclose([got.translation.x, got.translation.y, got.translation.z], translation, atol=1e-12)
    np.testing.assert_allclose([got.rotation.x, got.rotation.y, got.rotation.z, got.rotation.w], quaternion,
                               atol=1e-12)
    assert output.conflict is None and output.describe() == f"publishing map -> {child} ({mode})"


def test_map_to_odom_skips_a_frame_without_odometry(ros):
    output = TfOutput(ros.node("mapper"), "map_to_odom", "map", "odom", "base_link", "lingbot_camera")
    assert output.publish(stamp(1), MAP_BASE, MAP_CAMERA, None) is False


def test_mode_none_creates_nothing_and_bad_settings_are_named(ros):
    node = ros.node("mapper")
    before = (list(node.publishers), list(node.subscriptions))
    output = TfOutput(node, "none", "map", "odom", "base_link", "lingbot_camera")
    assert (list(node.publishers), list(node.subscriptions)) == before
    assert output.publish(stamp(1), MAP_BASE, MAP_CAMERA, ODOM_BASE) is False
    with pytest.raises(ValueError, match="tf_mode 'map_to_world': use one of none, map_to_odom"):
        TfOutput(node, "map_to_world", "map", "odom", "base_link", "lingbot_camera")
    with pytest.raises(ValueError, match="child frame must differ from map_frame"):
        TfOutput(node, "map_to_odom", "map", "map", "base_link", "lingbot_camera")


def test_another_publisher_of_the_child_on_tf_stops_the_output_with_an_error(ros, capfd):
    probe = TfProbe(ros.node("probe"))
    output = TfOutput(ros.node("mapper"), "map_to_odom", "map", "odom", "base_link", "lingbot_camera")
    wait(lambda: output._publisher.get_subscription_count() >= 2, "the probe's /tf subscription")
    for i in range(3):   # our own transforms come back on /tf: they are no conflict
        assert output.publish(stamp(100 + i), MAP_BASE, MAP_CAMERA, ODOM_BASE)
    wait(lambda: len(probe.transforms) == 3, "our 3 transforms")
    other = ros.node("localizer").create_publisher(TFMessage, "/tf", TF_QOS)
    wait(lambda: other.get_subscription_count() >= 2, "the watch's /tf subscription")
    other.publish(tf_message(("world", "odom", np.eye(4), stamp(200))))
    conflict = wait(lambda: output.conflict, "the conflict")
    assert (conflict.child, conflict.parent, conflict.topic) == ("odom", "world", "/tf")
    if conflict.publisher:   # this rclpy's message info names the publisher
        assert (conflict.publisher, conflict.suspects) == ("/localizer", ())
        who = "node /localizer"
    else:   # the nodes publishing /tf, less this one
        assert (conflict.publisher, conflict.suspects) == ("", ("/localizer",))
        who = "another publisher (other nodes publishing /tf: /localizer)"
    assert output.publish(stamp(201), MAP_BASE, MAP_CAMERA, ODOM_BASE) is False
    assert output.describe() == "TF refused: " + conflict.message
    assert conflict.message.startswith(f"frame 'odom' already has parent 'world' on /tf from {who}: ")
    assert conflict.message in capfd.readouterr().err


@pytest.mark.skipif(not HAS_PUBLISHER_GID, reason="this rclpy's message info has no publisher gid: the "
                                                  "watch then tells transforms apart by stamp and parent only")
def test_another_node_publishing_our_very_transform_is_a_conflict_too(ros):
    # Two mapping nodes on one camera: same stamps, same parent. Only the publisher tells them apart.
    output = TfOutput(ros.node("mapper"), "map_to_odom", "map", "odom", "base_link", "lingbot_camera")
    twin = ros.node("mapper_twin").create_publisher(TFMessage, "/tf", TF_QOS)
    wait(lambda: twin.get_subscription_count() >= 1, "the watch's /tf subscription")
    assert output.publish(stamp(7), MAP_BASE, MAP_CAMERA, ODOM_BASE)
    twin.publish(tf_message(("map", "odom", MAP_BASE @ np.linalg.inv(ODOM_BASE), stamp(7))))
    conflict = wait(lambda: output.conflict, "the conflict")
    assert (conflict.child, conflict.parent, conflict.publisher) == ("odom", "map", "/mapper_twin")


def test_a_child_already_in_the_static_tree_is_refused_at_start(ros):
    static = ros.node("robot").create_publisher(TFMessage, "/tf_static", TF_STATIC_QOS)
    static.publish(tf_message(("map", "lingbot_camera", np.eye(4), stamp(0))))
    output = TfOutput(ros.node("mapper"), "map_to_camera", "map", "odom", "base_link", "lingbot_camera")
    conflict = wait(lambda: output.conflict, "the static conflict")
    assert (conflict.child, conflict.parent, conflict.topic) == ("lingbot_camera", "map", "/tf_static")
    assert "/robot" in conflict.message
    assert output.publish(stamp(1), MAP_BASE, MAP_CAMERA, ODOM_BASE) is False


def test_the_raw_tf_filter_skips_other_frames_without_deserialising_and_finds_ours(ros, monkeypatch):
    from rclpy.serialization import serialize_message
    from lingbot_ros.ros import input_checks

    watch = TfConflictWatch(ros.node("mapper"), ["odom"])
    decoded = []
    real = input_checks.deserialize_message
    monkeypatch.setattr(input_checks, "deserialize_message", lambda data, kind: decoded.append(1) or real(data, kind))
    no_gid = {"publisher_gid": None}
    # Other robots' trees: names that contain ours, and ours as a parent only.
    for edges in ((("world", "robot2/odom", np.eye(4), stamp(5)),), (("odom2", "odomx", np.eye(4), stamp(5)),)):
        watch._on_tf_raw(serialize_message(tf_message(*edges)), no_gid)
    assert not decoded and watch.conflict is None
    watch._on_tf_raw(serialize_message(tf_message(("odom", "base_link", np.eye(4), stamp(5)))), no_gid)
    assert watch.conflict is None   # decoded (the parent is named 'odom'), and not a conflict
    watch._on_tf_raw(serialize_message(tf_message(("robot2/map", "base_link", np.eye(4), stamp(5)),
                                                  ("world", "odom", np.eye(4), stamp(6)))), no_gid)
    assert watch.conflict is not None and (watch.conflict.child, watch.conflict.parent) == ("odom", "world")


def test_without_a_publisher_name_the_recorded_stamps_tell_our_transforms_from_others(ros):
    # rclpy releases without a publisher gid in the message info: ownership falls back to the
    # (child, stamp, parent) the node reported before publishing.
    node = ros.node("mapper")
    watch = TfConflictWatch(node, ["odom"])
    node.create_publisher(TFMessage, "/tf", TF_QOS)            # our own: not a suspect
    ros.node("localizer").create_publisher(TFMessage, "/tf", TF_QOS)
    watch.published("odom", "map", 5_000_000_000)
    no_gid = {"publisher_gid": None}
    watch._on_tf(tf_message(("map", "odom", np.eye(4), stamp(5))), no_gid)
    watch._on_tf(tf_message(("map", "base_link", np.eye(4), stamp(6))), no_gid)   # not a watched child
    assert watch.conflict is None
    watch._on_tf(tf_message(("map", "odom", np.eye(4), stamp(6))), no_gid)        # a stamp we never sent
    conflict = watch.conflict
    assert (conflict.child, conflict.parent, conflict.publisher, conflict.suspects) == (
        "odom", "map", "", ("/localizer",))
    assert "from another publisher (other nodes publishing /tf: /localizer)" in conflict.message


def test_a_destroyed_output_leaves_no_publisher_or_subscription(ros):
    node = ros.node("mapper")
    observer = ros.node("observer")
    before = (list(node.publishers), list(node.subscriptions))
    output = TfOutput(node, "map_to_odom", "map", "odom", "base_link", "lingbot_camera")

    def ours(infos):   # the node, and the tap node its /tf watch reads through (ros/tap.py)
        return [i for i in infos if i.node_name == "mapper" or i.node_name.startswith("mapper_tap_")]

    wait(lambda: len(ours(observer.get_subscriptions_info_by_topic("/tf"))) == 1
         and len(ours(observer.get_subscriptions_info_by_topic("/tf_static"))) == 1
         and len(ours(observer.get_publishers_info_by_topic("/tf"))) == 1, "the output in the graph")
    output.destroy()
    output.destroy()   # idempotent
    assert (list(node.publishers), list(node.subscriptions)) == before
    wait(lambda: not ours(observer.get_subscriptions_info_by_topic("/tf"))
         and not ours(observer.get_subscriptions_info_by_topic("/tf_static"))
         and not ours(observer.get_publishers_info_by_topic("/tf")), "the output gone from the graph")
    assert output.publish(stamp(1), MAP_BASE, MAP_CAMERA, ODOM_BASE) is False
