"""The node's boundary pieces without DDS: transform and odometry checks, the image clock, the
safety net, save paths, safe file writes, the worker's bound and a service's cancelled request."""
import threading
import types

import numpy as np
import pytest

from helpers import need_module, wait_until

need_module("rclpy", module_level=True)
pytestmark = pytest.mark.ros   # needs rclpy: runs on Jazzy too (.ci/run runs only `ros` there)
from geometry_msgs.msg import Quaternion, Vector3  # noqa: E402
from nav_msgs.msg import Odometry  # noqa: E402

from lingbot_ros.mapping.files.export import read_ply, write_files, write_ply  # noqa: E402
from lingbot_ros.ros import services  # noqa: E402
from lingbot_ros.ros.messages import header_stamp_ns  # noqa: E402
from lingbot_ros.ros.input_checks import (ImageClock, Refused, check_camera_info, check_odometry,  # noqa: E402
                                          check_stamp, checked_matrix, checked_transform, nonzero_stamp)
from lingbot_ros.ros.safety import SafetyNet  # noqa: E402
from lingbot_ros.ros.save_paths import SavePathError, save_root, save_target  # noqa: E402
from lingbot_ros.ros.worker import MAX_COMMANDS, FrameInbox, Worker  # noqa: E402

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("translation, quaternion, why", [
    ((0.0, 0.0, 0.0), (NAN, 0.0, 0.0, 1.0), "non-finite"),
    ((INF, 0.0, 0.0), (0.0, 0.0, 0.0, 1.0), "non-finite"),
    ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 0.0), "norm 0"),
    ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 2.0), "norm 2"),
    ((1e200, 0.0, 0.0), (0.0, 0.0, 0.0, 1.0), "bound"),
])
def test_a_bad_transform_is_refused_with_the_reason(translation, quaternion, why):
    with pytest.raises(Refused, match=why):
        checked_transform(Vector3(x=translation[0], y=translation[1], z=translation[2]),
                          Quaternion(x=quaternion[0], y=quaternion[1], z=quaternion[2], w=quaternion[3]), "odometry")


def test_a_near_unit_quaternion_is_normalised_and_a_far_mount_refused():
    pose = checked_transform(Vector3(x=1.0, y=2.0, z=3.0), Quaternion(x=0.0, y=0.0, z=0.0, w=1.005), "odometry")
    np.testing.assert_allclose(pose[:3, :3] @ pose[:3, :3].T, np.eye(3), atol=1e-12)
    np.testing.assert_allclose(pose[:3, 3], [1.0, 2.0, 3.0])
    far = np.eye(4)
    far[0, 3] = 1000.0
    with pytest.raises(Refused, match="100 m bound"):
        checked_matrix(far, "camera mount", 100.0)
    with pytest.raises(Refused, match="non-finite"):
        checked_matrix(np.full((4, 4), NAN), "camera mount", 100.0)


def _odometry(sec: int, frame="odom", child="base_link") -> Odometry:
    msg = Odometry()
    msg.header.stamp.sec, msg.header.frame_id, msg.child_frame_id = sec, frame, child
    msg.pose.pose.orientation.w = 1.0
    return msg


def test_odometry_stamps_are_checked_against_the_image_clock():
    clock = ImageClock(lambda: 50 * 10**9)   # before any image: the node's clock
    assert check_odometry(_odometry(50), "odom", "base_link", clock, 5.0)[0] == 50 * 10**9
    with pytest.raises(Refused, match="ahead of the image clock"):
        check_odometry(_odometry(60), "odom", "base_link", clock, 5.0)
    clock.image(1000 * 10**9)   # an image: its stamp is the clock now (plus the time since)
    assert check_odometry(_odometry(1003), "odom", "base_link", clock, 5.0)[0] == 1003 * 10**9
    with pytest.raises(Refused, match="ahead of the image clock"):
        check_odometry(_odometry(1000 + 3600), "odom", "base_link", clock, 5.0)
    with pytest.raises(Refused, match="zero stamp"):
        check_stamp(_odometry(0).header.stamp, clock, 5.0, "odometry")
    # An image's stamp: zero and negative refused; the clock runs from the frame's receipt time.
    with pytest.raises(Refused, match="image: zero stamp"):
        nonzero_stamp(_odometry(0).header.stamp, "image")
    with pytest.raises(Refused, match="image: negative stamp"):
        nonzero_stamp(_odometry(-5).header.stamp, "image")
    import time
    received = time.monotonic_ns() - 2 * 10**9   # taken by the Mapper 2 s after it arrived
    clock.image(2000 * 10**9, received)
    assert clock.now_ns() >= 2002 * 10**9
    with pytest.raises(Refused, match="another robot"):
        check_odometry(_odometry(1000, frame="robot2/odom"), "odom", "base_link", clock, 5.0)
    with pytest.raises(Refused, match="expected odom_frame 'odom' -> base_frame 'base_link'"):
        check_odometry(_odometry(1000, child="robot2/base_link"), "odom", "base_link", clock, 5.0)


@pytest.mark.parametrize("k, size, why", [
    ([float("nan"), 0, 64, 0, 100, 48, 0, 0, 1], (128, 96), "non-finite K"),
    ([100, 0, float("inf"), 0, 100, 48, 0, 0, 1], (128, 96), "non-finite K"),
    ([0, 0, 64, 0, 100, 48, 0, 0, 1], (128, 96), "fx=0 fy=100 not positive"),
    ([100, 0, 64, 0, -100, 48, 0, 0, 1], (128, 96), "fx=100 fy=-100 not positive"),
    ([100, 0, 64, 0, 100, 48, 0, 0, 1], (0, 96), "size 0x96"),
    ([100, 0, 64, 0, 100, 48, 0, 0, 1], (128, 0), "size 128x0"),
])
def test_a_bad_camera_info_is_refused_with_the_value_named(k, size, why):
    from sensor_msgs.msg import CameraInfo
    with pytest.raises(Refused, match=why):
        check_camera_info(CameraInfo(width=size[0], height=size[1], k=[float(v) for v in k]))
    good = CameraInfo(width=128, height=96, k=[100.0, 0.0, 64.0, 0.0, 101.0, 48.0, 0.0, 0.0, 1.0])
    assert check_camera_info(good) == "fx=100.0 fy=101.0 cx=64.0 cy=48.0 (128x96)"


class _Logger:
    def __init__(self):
        self.errors = []

    def error(self, text, **kwargs):
        self.errors.append((text, kwargs))


@pytest.mark.parametrize("sec, nanosec", [(0, 0), (100, 50_000_000), (2**31 - 1, 999_999_999), (-5, 7)])
def test_an_odometry_stamp_is_read_from_its_serialized_bytes(sec, nanosec):
    # What the 1 kHz odometry thinning reads before it deserialises anything.
    from rclpy.serialization import serialize_message
    msg = Odometry()
    msg.header.stamp.sec, msg.header.stamp.nanosec = sec, nanosec
    msg.header.frame_id, msg.child_frame_id = "odom", "base_link"
    assert header_stamp_ns(serialize_message(msg)) == sec * 10**9 + nanosec
    assert header_stamp_ns(b"\x00\x01\x00\x00") is None


def test_the_safety_net_catches_counts_and_logs_the_traceback_once():
    logger, counted = _Logger(), []
    net = SafetyNet(logger, counted.append)

    def callback(msg, info):   # two arguments: rclpy reads the signature through the wrapper
        raise KeyError(msg)

    guarded = net.guard("odometry callback", callback)
    import inspect
    assert list(inspect.signature(guarded).parameters) == ["msg", "info"]
    assert guarded("a", None) is None and guarded("b", None) is None
    assert len(counted) == 2 and "odometry callback raised KeyError" in counted[-1]
    assert "Traceback" in logger.errors[0][0] and "Traceback" not in logger.errors[1][0]
    assert logger.errors[1][1] == {"throttle_duration_sec": 10.0}
    response = net.guard_service("~/reset", lambda request, response: 1 / 0)(None, types.SimpleNamespace(
        success=True, message=""))
    assert response.success is False and "ZeroDivisionError" in response.message


def test_save_paths_stay_inside_save_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("ROS_HOME", str(tmp_path / "ros_home"))
    assert save_root("lingbot_maps") == tmp_path / "ros_home" / "lingbot_maps"
    root = tmp_path / "maps"
    assert save_target(str(root), "") == root
    assert save_target(str(root), "a/b") == root / "a" / "b"
    assert save_target(str(root), str(tmp_path / "elsewhere")) == tmp_path / "elsewhere"
    for escape in ("..", "../maps2", "a/../../x"):
        with pytest.raises(SavePathError, match="leaves save_directory"):
            save_target(str(root), escape)
    root.mkdir()
    (root / "out").symlink_to(tmp_path)
    with pytest.raises(SavePathError):   # a symlink leading out is an escape too
        save_target(str(root), "out/x")


def test_a_failed_save_keeps_the_previous_files_and_a_symlink_is_not_followed(tmp_path):
    xyz, rgb = np.zeros((2, 3), np.float32), np.zeros((2, 3), np.uint8)
    write_ply(tmp_path / "map.ply", xyz, rgb)
    before = (tmp_path / "map.ply").read_bytes()
    (tmp_path / "trajectory.tum").mkdir()
    with pytest.raises(IsADirectoryError):
        write_files({tmp_path / "map.ply": b"new", tmp_path / "trajectory.tum": b"new"})
    assert (tmp_path / "map.ply").read_bytes() == before
    with pytest.raises(ValueError, match="non-finite"):
        write_ply(tmp_path / "map.ply", np.full((2, 3), NAN, np.float32), rgb)
    assert (tmp_path / "map.ply").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map.ply", "trajectory.tum"]   # no temporary left
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / "linked.ply").symlink_to(victim)
    write_ply(tmp_path / "linked.ply", xyz, rgb)
    assert victim.read_bytes() == b"keep" and not (tmp_path / "linked.ply").is_symlink()
    assert len(read_ply(tmp_path / "linked.ply")[0]) == 2


def test_the_worker_queue_is_bounded_and_a_request_not_started_in_time_is_cancelled():
    release = threading.Event()
    worker = Worker(FrameInbox(False, 1), lambda frame: None, lambda error: None)
    worker.start()
    try:
        blocker = worker.submit(release.wait, 30)
        wait_until(blocker.running, "the worker on the blocking request", 30)
        ran = []
        node = types.SimpleNamespace(worker=worker, cfg=types.SimpleNamespace(service_timeout_s=0.05))
        ok, why = services.run_on_worker(node, lambda: ran.append(1))
        assert not ok and "cancelled, nothing done" in why
        # The cancelled request keeps its place in the queue until the worker passes it.
        waiting = [worker.submit(ran.append, i) for i in range(MAX_COMMANDS - 1)]
        refused = worker.submit(ran.append, "one too many")
        with pytest.raises(RuntimeError, match="busy"):
            refused.result(timeout=1)
        release.set()
        blocker.result(timeout=10)
        for future in waiting:
            future.result(timeout=10)
        assert ran == list(range(MAX_COMMANDS - 1))   # the cancelled request never ran
    finally:
        release.set()
        worker.stop()


def test_a_handler_that_raises_in_a_tap_batch_loses_its_message_only():
    """Tap.drain hands a batch to its handler under the safety net, one message at a time: the
    message that raised is counted, the rest of the batch is still handled."""
    import random

    import rclpy
    from rclpy.context import Context
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from std_msgs.msg import String

    from lingbot_ros.ros.tap import Tap

    context = Context()
    rclpy.init(context=context, domain_id=random.SystemRandom().randint(101, 200))
    node = rclpy.create_node("tap_owner", context=context)
    try:
        logger, counted, handled = _Logger(), [], []
        node.safety = SafetyNet(logger, counted.append)

        def handler(msg, info):
            if msg.data == "bad":
                raise ValueError("a bug in the handler")
            handled.append(msg.data)

        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        tap = Tap(node, String, "/tap_test", qos, handler, period_s=3600.0, group=None, name="test tap")
        publisher = node.create_publisher(String, "/tap_test", qos)
        wait_until(publisher.get_subscription_count, "the tap's subscription", 30.0)
        for data in ("a", "b", "bad", "c", "d"):
            publisher.publish(String(data=data))

        def drained():
            tap.drain()
            return handled if len(handled) == 4 else None

        assert wait_until(drained, "the batch handled", 30.0) == ["a", "b", "c", "d"]
        assert len(counted) == 1 and "test tap raised ValueError: a bug in the handler" in counted[0]
        tap.destroy()
    finally:
        node.destroy_node()
        rclpy.shutdown(context=context)
