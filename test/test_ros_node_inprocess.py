"""MapNode in-process with the tiny fixture: outputs, model-failure recovery, cache cap, stamp jumps.

The node and a probe node share one context with DDS discovery off (nothing leaves the process);
a background executor spins both. Images enter through the node's real image callback, called
from the test thread as the executor would; everything else (worker, publishers, timers) runs
as in production.
"""
import os
import threading

import cv2
import numpy as np
import pytest

from helpers import need_module  # noqa: I001 (before the ROS imports it guards)

rclpy = need_module("rclpy", module_level=True)
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from geometry_msgs.msg import PoseStamped  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.lifecycle import TransitionCallbackReturn  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import CameraInfo, Image, PointCloud2  # noqa: E402

from helpers import SETUP, background_spin, missing, need_path, stamp_ns, unpack_points, wait_until  # noqa: E402

from lingbot_ros.mapping.placement.geometry import quaternion_to_rotation, rotation_to_quaternion  # noqa: E402
from lingbot_ros.io.image_codec import fill_image, image_to_rgb  # noqa: E402
from lingbot_ros.ros.executor import PoolExecutor  # noqa: E402
from lingbot_ros.ros.node import MapNode, MapStatus  # noqa: E402

if MapStatus is None:
    missing("the generated lingbot_ros interfaces (lingbot_ros.msg)", SETUP, module_level=True)

pytestmark = [pytest.mark.ros, pytest.mark.usefixtures("torch_single_thread")]
TIMEOUT = 20.0
WIDTH, HEIGHT = 112, 84          # model input for 640x480 images at image_width 112
_BASE = cv2.resize((np.random.default_rng(2).random((60, 80)) * 255).astype(np.uint8), (640, 480),
                   interpolation=cv2.INTER_CUBIC)


def wait(condition, what: str):
    return wait_until(condition, what, TIMEOUT)


class Live:
    """A configured, active MapNode plus a probe recording its outputs."""

    TOPICS = {"pose": PoseStamped, "camera_pose": PoseStamped, "depth/image": Image, "depth/camera_info": CameraInfo,
              "confidence/image": Image, "confidence/camera_info": CameraInfo, "map": PointCloud2}

    def __init__(self, node_params: dict):
        self.context = Context()
        rclpy.init(context=self.context, domain_id=1 + os.getpid() % 100)
        self.node = MapNode(context=self.context, parameter_overrides=[
            Parameter(name, value=value) for name, value in node_params.items()])
        assert self.node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        assert self.node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        self.probe = rclpy.create_node("probe", context=self.context)
        self.received = {topic: [] for topic in self.TOPICS}
        for topic, msg_type in self.TOPICS.items():
            qos = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL if topic == "map"
                             else DurabilityPolicy.VOLATILE)
            self.probe.create_subscription(msg_type, f"/map_node/{topic}",
                                           self.received[topic].append, qos)
        # Deeper than the publisher's latched depth 1, so no status is lost between callbacks.
        self.statuses: list = []
        self.probe.create_subscription(MapStatus, "/map_node/status", self.statuses.append,
                                       QoSProfile(depth=100, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                                                  reliability=ReliabilityPolicy.RELIABLE))
        self.diagnostics: list = []
        self.probe.create_subscription(DiagnosticArray, "/diagnostics", self.diagnostics.append, 10)
        self.executor = PoolExecutor(3, context=self.context)
        self.executor.add_node(self.node)
        self.executor.add_node(self.probe)
        self.spin = background_spin(self.executor)
        outputs = self.node.outputs
        wait(lambda: all(getattr(outputs, k).get_subscription_count() for k in
                         ("pose", "depth", "depth_info", "confidence", "confidence_info", "map", "status")),
             "the probe's subscriptions")
        self.sent = 0

    def send(self, stamp_s: float, shift_px: int = 0) -> Image:
        """One 640x480 rgb8 image through the node's image callback; waits until it is handled."""
        msg = fill_image(Image(), np.dstack([np.roll(_BASE, shift_px, axis=1)] * 3), "rgb8")
        msg.header.stamp.sec, msg.header.stamp.nanosec = int(stamp_s), round(stamp_s % 1 * 1e9)
        msg.header.frame_id = "cam"
        self.node.inputs.accept(msg, image_to_rgb)
        self.sent += 1
        def handled() -> bool:   # every frame sent is placed, buffered for phase 1, failed, rejected or held
            s = self.node.mapper.snapshot
            return (s.processed + s.init_frames + s.failed + s.rejected + s.held_frames == self.sent
                    and not self.node.worker.busy and not len(self.node.worker.inbox))
        wait(handled, f"frame {self.sent} handled")
        return msg

    def status(self, condition, what: str):
        """The first status that meets ``condition``."""
        return wait(lambda: next((s for s in self.statuses if condition(s)), None), what)

    def close(self):
        self.spin.stop()
        self.node.release()
        self.node.destroy_node()
        self.probe.destroy_node()
        self.context.try_shutdown()
        assert not self.spin.running


@pytest.fixture
def live(shared_dir, monkeypatch):
    fixture = shared_dir / "fixtures" / "tiny_default"
    need_path(fixture / "ckpt.pt", "tiny fixture")
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "OFF")
    started = []

    def start(**overrides) -> Live:
        node_params = {"checkpoint": str(fixture / "ckpt.pt"), "model_config": str(fixture / "config.json"),
                       "device": "cpu", "image_width": WIDTH, "num_scale_frames": 3,
                       "sliding_window": 4, "warmup": False, "autostart": False,
                       "process_all_frames": True, "min_confidence": 0.0,
                       "diagnostics_period_s": 0.2, "map_publish_period_s": 0.2, **overrides}
        started.append(Live(node_params))
        return started[-1]

    yield start
    for env in started:
        env.close()


def test_configure_keeps_the_lifecycle_and_parameter_services(live):
    # Regression: the node once replaced rclpy.Node's own service list at configure, so the
    # executor stopped serving get_state / change_state / set_parameters.
    names = [s.srv_name for s in live().node.services]
    assert len(names) == len(set(names))
    for name in ("/map_node/get_state", "/map_node/change_state", "map_node/set_parameters",
                 "~/reset", "~/rollback_last_frame", "~/flush_deferred_evictions", "~/save_map"):
        assert name in names


def test_warmup_runs_the_model_and_leaves_an_empty_stream(live):
    # Regression: the warm-up frame was only buffered for phase 1 (num_scale_frames > 1) and
    # thrown away by the reset, so the model never ran before the first real frame.
    env = live(warmup=True)   # warm-up at configure, before any frame
    stats = env.node.mapper.session.stats()
    assert stats.kv_cache is not None, "warm-up did not run the model (no KV cache allocated)"
    assert stats.frames_seen == stats.frames_stored == stats.frames_buffered == 0
    env.send(10.0)
    # Buffered for phase 1: not processed until it has its pose (a save would not hold it yet).
    first = env.status(lambda s: s.init_frames == 1, "the first real frame buffered")
    assert first.state == MapStatus.STATE_INITIALISING and first.frames_processed == 0


def test_depth_confidence_camera_info_and_map_outputs(live):
    env = live()
    images = [env.send(10 + 0.1 * i, shift_px=8 * i) for i in range(4)]
    stamps = [stamp_ns(m.header) for m in images]
    wait(lambda: all(len(env.received[t]) == 4 for t in ("pose", "depth/image", "depth/camera_info",
                                                          "confidence/image", "confidence/camera_info")),
         "4 of each output")
    for topic in ("depth/image", "confidence/image"):
        assert [stamp_ns(m.header) for m in env.received[topic]] == stamps
        for msg in env.received[topic]:
            assert (msg.encoding, msg.width, msg.height, msg.step) == ("32FC1", WIDTH, HEIGHT, 4 * WIDTH)
            assert msg.header.frame_id == "cam" and not msg.is_bigendian
            values = np.frombuffer(bytes(msg.data), np.float32)
            assert values.size == WIDTH * HEIGHT and np.isfinite(values).all()
    assert (np.frombuffer(bytes(env.received["depth/image"][-1].data), np.float32) > 0).all()
    # depth_image_proc pairs an image with the camera_info of the same stamp beside it.
    for image_topic in ("depth", "confidence"):
        infos = {stamp_ns(m.header): m for m in env.received[f"{image_topic}/camera_info"]}
        for image in env.received[f"{image_topic}/image"]:
            info = infos[stamp_ns(image.header)]
            assert (info.width, info.height, info.header.frame_id) == (image.width, image.height,
                                                                       image.header.frame_id)
    for msg in env.received["depth/camera_info"]:
        k = np.reshape(msg.k, (3, 3))
        assert (msg.width, msg.height, msg.header.frame_id) == (WIDTH, HEIGHT, "cam")
        assert k[0, 0] > 0 and k[1, 1] > 0 and k[2, 2] == 1 and k[1, 0] == k[2, 0] == k[2, 1] == 0
    assert [stamp_ns(m.header) for m in env.received["depth/camera_info"]] == stamps
    assert [stamp_ns(m.header) for m in env.received["pose"]] == stamps

    # ~/map: the latched accumulated cloud, stamped with the last image, every keyframe merged.
    cloud = wait(lambda: next((m for m in reversed(env.received["map"])
                               if stamp_ns(m.header) == stamps[-1]), None), "a map after frame 4")
    xyz, rgb = unpack_points(cloud)
    assert cloud.header.frame_id == "map" and cloud.width == len(xyz) > 0
    np.testing.assert_array_equal(xyz, env.node.mapper.map_points()[0])


def test_model_failure_on_one_frame_is_reported_and_the_next_frame_processed(live, monkeypatch, capfd):
    env = live()
    for i in range(4):
        env.send(10 + 0.1 * i, shift_px=8 * i)
    session = env.node.mapper.session
    real_step = session.step

    def fail_once(*args, **kwargs):
        monkeypatch.setattr(session, "step", real_step)
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(session, "step", fail_once)
    env.send(10.4)
    failed = env.status(lambda s: s.frames_failed == 1 and s.restarts == 1, "the status after the restart")
    assert "model failed on the frame stamped 10.400: RuntimeError: CUDA out of memory (simulated)" \
        in failed.last_error
    assert failed.state == MapStatus.STATE_RESTARTED and failed.state_text == "restarted: model error"
    assert failed.keyframes == 0 and failed.restarts == 1
    assert "stream restarted, continuing" in capfd.readouterr().err

    env.send(10.5)
    after = env.status(lambda s: s.init_frames == 1 and s.frames_failed == 1, "the next frame buffered for phase 1")
    assert after.state == MapStatus.STATE_INITIALISING and after.frames_processed == 4
    assert after.frames_failed == 1
    assert env.node.mapper.snapshot.trajectory_poses == 4      # the map and trajectory carried on


def test_cache_cap_restarts_keeps_the_map_and_announces_it(live, capfd):
    env = live(max_keyframes=4, long_run_policy="reset")
    for i in range(4):
        env.send(10 + 0.1 * i, shift_px=8 * i)
    reason = "cache cap: 4 keyframes stored (max_keyframes=4)"
    capped = env.status(lambda s: s.restarts == 1, "a status after the cap")
    assert capped.state == MapStatus.STATE_RESTARTED and capped.state_text == f"restarted: {reason}"
    assert capped.keyframes == 0 and capped.frames_processed == 4
    assert f"stream restarted (map continues from the last pose): {reason}" in capfd.readouterr().err
    map_points = len(env.node.mapper.map_points()[0])
    assert map_points > 0

    for i in range(3):
        env.send(10.4 + 0.1 * i, shift_px=8 * i)
    tracking = env.status(lambda s: s.frames_processed == 7, "tracking again")
    assert tracking.state == MapStatus.STATE_TRACKING and tracking.keyframes == 3
    assert tracking.restarts == 1 and tracking.frames_failed == 0
    assert env.node.mapper.snapshot.trajectory_poses == 7 and len(env.node.mapper.map_points()[0]) >= map_points


def test_stamp_gap_and_backward_jump_restart_the_stream(live, capfd):
    env = live(max_stamp_gap_s=1.0)
    for i in range(4):
        env.send(10 + 0.1 * i, shift_px=8 * i)
    env.send(20.0)                                       # 9.7 s after the last frame: held
    env.status(lambda s: s.frames_held == 1, "the frame past the gap held")
    env.send(20.1)                                       # it follows: the gap was real
    gap = env.status(lambda s: s.restarts == 1, "the restart on the gap")
    assert gap.state_text == ("initialising 2/3 (restarted: gap of 9.700 s between image stamps "
                              "(max_stamp_gap_s=1))")
    assert env.node.mapper.snapshot.trajectory_poses == 0 and len(env.node.mapper.map_points()[0]) == 0
    env.send(5.0)                                        # a looped bag
    back = env.status(lambda s: s.restarts == 2, "the restart on the backward stamp")
    assert back.state_text == "initialising 1/3 (restarted: image stamp went back by 15.100 s (bag looped?))"
    last = env.status(lambda s: s.frames_processed == 6, "the frames at 20 s placed, the one at 5 s buffered")
    assert last.state == MapStatus.STATE_INITIALISING and last.init_frames == 1
    err = capfd.readouterr().err
    assert "gap of 9.700 s" in err and "image stamp went back" in err


def _matrix(position, orientation) -> np.ndarray:
    pose = np.eye(4)
    pose[:3, :3] = quaternion_to_rotation(np.array([orientation.x, orientation.y, orientation.z, orientation.w]))
    pose[:3, 3] = [position.x, position.y, position.z]
    return pose


def _tf_env(live, **params):
    tf2_msgs = need_module("tf2_msgs.msg")
    env = live(**params)
    transforms = []
    env.probe.create_subscription(tf2_msgs.TFMessage, "/tf", transforms.append, 50)
    wait(lambda: env.node.robot.tf._publisher.get_subscription_count(), "the probe's /tf subscription")
    return env, transforms, tf2_msgs


def test_tf_map_to_camera_matches_the_camera_pose(live):
    env, transforms, _ = _tf_env(live, tf_mode="map_to_camera")
    images = [env.send(20 + 0.1 * i, shift_px=8 * i) for i in range(4)]
    wait(lambda: len(transforms) == 4 and len(env.received["camera_pose"]) == 4, "4 transforms and 4 poses")
    for tf_msg, pose, image in zip(transforms, env.received["camera_pose"], images):
        (t,) = tf_msg.transforms
        assert (t.header.frame_id, t.child_frame_id) == ("map", "lingbot_camera")
        assert stamp_ns(t.header) == stamp_ns(pose.header) == stamp_ns(image.header)
        np.testing.assert_allclose(_matrix(t.transform.translation, t.transform.rotation),
                                   _matrix(pose.pose.position, pose.pose.orientation), atol=1e-6)


def test_the_mount_from_tf_static_places_the_base_and_map_to_odom_corrects_the_odometry(live):
    """A URDF-like /tf_static base_link -> cam, and the robot's odometry on ~/odometry_in: ~/pose is
    the base (camera pose = base pose @ mount), and map -> odom = T_map_base @ inverse(T_odom_base)
    at each image stamp (REP 105)."""
    from geometry_msgs.msg import TransformStamped
    from nav_msgs.msg import Odometry
    from rclpy.qos import DurabilityPolicy as D

    # Only the image-stamped transforms (no periodic republication) to pair them with the images.
    env, transforms, tf2_msgs = _tf_env(live, tf_mode="map_to_odom", transform_publish_period_s=0.0)
    mount = TransformStamped()
    mount.header.frame_id, mount.child_frame_id = "base_link", "cam"
    mount.transform.translation.x, mount.transform.translation.z = 0.2, 0.5
    # The optical frame looking along the base's x axis, pitched down by 0.3 rad.
    optical = np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])
    pitch = np.array([[np.cos(0.3), 0, np.sin(0.3)], [0, 1, 0], [-np.sin(0.3), 0, np.cos(0.3)]])
    q = rotation_to_quaternion(pitch @ optical)
    (mount.transform.rotation.x, mount.transform.rotation.y, mount.transform.rotation.z,
     mount.transform.rotation.w) = q
    static = env.probe.create_publisher(tf2_msgs.TFMessage, "/tf_static", QoSProfile(
        depth=100, reliability=ReliabilityPolicy.RELIABLE, durability=D.TRANSIENT_LOCAL))
    static.publish(tf2_msgs.TFMessage(transforms=[mount]))
    odometry = env.probe.create_publisher(Odometry, "/map_node/odometry_in", 50)
    wait(odometry.get_subscription_count, "the node's odometry subscription")
    wait(lambda: env.node.robot.lookup.lookup("base_link", "cam") is not None, "the mount on /tf_static")
    expected_mount = np.eye(4)
    expected_mount[:3, :3], expected_mount[:3, 3] = pitch @ optical, [0.2, 0, 0.5]
    odom_base = {}
    for i in range(30):                                   # 50 Hz odometry over the 3 s of images
        stamp_s = 20 + 0.1 * i
        msg = Odometry()
        msg.header.stamp.sec, msg.header.stamp.nanosec = int(stamp_s), round(stamp_s % 1 * 1e9)
        msg.header.frame_id, msg.child_frame_id = "odom", "base_link"
        msg.pose.pose.position.x, msg.pose.pose.orientation.w = 0.05 * i, 1.0
        odometry.publish(msg)
        odom_base[stamp_ns(msg.header)] = _matrix(msg.pose.pose.position, msg.pose.pose.orientation)
    wait(lambda: len(env.node.mapper.robot.odometry) == 30, "the odometry buffered")
    images = [env.send(20 + 0.1 * i, shift_px=8 * i) for i in range(5)]
    wait(lambda: len(transforms) == 5 and len(env.received["pose"]) == 5, "5 transforms and 5 poses")
    assert env.node.mapper.snapshot.camera_mount == "TF base_link -> cam"
    for tf_msg, base, camera, image in zip(transforms, env.received["pose"], env.received["camera_pose"], images):
        (t,) = tf_msg.transforms
        assert (t.header.frame_id, t.child_frame_id) == ("map", "odom")
        stamp = stamp_ns(image.header)
        assert stamp_ns(t.header) == stamp_ns(base.header) == stamp
        map_base = _matrix(base.pose.position, base.pose.orientation)
        np.testing.assert_allclose(_matrix(camera.pose.position, camera.pose.orientation),
                                   map_base @ expected_mount, atol=1e-5)
        np.testing.assert_allclose(_matrix(t.transform.translation, t.transform.rotation),
                                   map_base @ np.linalg.inv(odom_base[stamp]), atol=1e-5)
    # The first camera is the model's origin: the base starts at the map's origin.
    np.testing.assert_allclose(env.node.mapper._stream.frames.conversion.base_pose(
        env.node.mapper._stream.placement.camera_pose(np.eye(4))), np.eye(4), atol=1e-9)


def test_timer_callbacks_during_cleanup_never_meet_a_destroyed_publisher(live):
    # Regression (Jazzy CI): the diagnostics timer published ~/status while cleanup destroyed
    # the publisher; rclpy raised InvalidHandle in the executor and the node process died.
    # The timer callbacks run here in threads of their own, as the executor's threads run them.
    env = live()
    node, errors, done = env.node, [], threading.Event()

    def publish_forever():
        while not done.is_set():
            try:
                node._on_diagnostics_timer()
                node._on_map_timer()
            except Exception as error:   # noqa: BLE001 - any failure is the defect
                errors.append(error)
                return

    publishers = [threading.Thread(target=publish_forever) for _ in range(2)]
    for thread in publishers:
        thread.start()
    assert node.trigger_deactivate() == TransitionCallbackReturn.SUCCESS
    assert node.trigger_cleanup() == TransitionCallbackReturn.SUCCESS
    done.set()
    for thread in publishers:
        thread.join(5)
    assert not errors, errors
    assert node.outputs is None


@pytest.mark.parametrize("strict_jpeg", [True, False])
def test_strict_jpeg_decides_whether_a_jpeg_libjpeg_warns_about_is_mapped(live, shared_dir, strict_jpeg):
    from sensor_msgs.msg import CompressedImage

    env = live(image_transport="compressed", strict_jpeg=strict_jpeg, num_scale_frames=1)
    jpeg = sorted((shared_dir / "data" / "courthouse_jpg").glob("*.jpg"))[0].read_bytes()
    msg = CompressedImage(format="jpeg", data=jpeg[:-2] + bytes(16) + b"\xff\xd9")   # bytes before EOI
    msg.header.stamp.sec, msg.header.frame_id = 10, "cam"
    subscription = env.node.inputs._subscriptions[0]
    assert subscription.topic_name == "/map_node/image/compressed"
    subscription.callback(msg)   # what the executor calls with the message
    counters = env.node.counters
    if strict_jpeg:
        wait(lambda: counters.values["rejected"] == 1, "the frame rejected")
        assert "strict_jpeg false" in counters.last_error
    else:
        wait(lambda: env.node.mapper.snapshot.processed == 1, "the frame processed")
        assert counters.values["rejected"] == 0
