"""Hostile input against the real node over DDS (helpers.Ros): one node process per input class,
many bad values each. Every case asserts that the process lives, the image counters balance
(received = processed + dropped + rejected + failed), nothing non-finite is published or saved,
the reason is visible in ~/status or /diagnostics, and good input afterwards is processed.

Classes: odometry (~/odometry_in), image stamps, camera_info, dynamic /tf (a flood of another
robot's frames, NaN values, a conflicting publisher of our child frame), the camera mount on
/tf_static, live parameters (with the QoS of a best-effort camera and the periodic map), services
and save paths, start-up parameters; truncated CDR on ~/odometry_in and /tf, SIGINT during the
start-up imports; the map database at its edges (a symlink at its lock and at its -wal, a second
writer through a symlink, duplicate stamps, damaged runs at resume, SIGKILL right after a resumed
start).
"""
import math
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from nav_msgs.msg import Odometry
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rcl_interfaces.msg import ParameterType
from rcl_interfaces.srv import GetParameters, SetParameters
from sensor_msgs.msg import CameraInfo, CompressedImage, PointCloud2
from std_srvs.srv import Trigger

from helpers import (BAG_TOPIC, MapStatus, SaveMap, double_parameter, integer_parameter, interrupt_and_check_exit,
                     string_parameter, synthetic_jpeg)
from lingbot_ros.mapping.files.export import read_ply, read_tum
from lingbot_ros.ros.status import frames_accounted

from helpers import need_module, need_path
tf2_msgs = need_module("tf2_msgs.msg", module_level=True)
from geometry_msgs.msg import TransformStamped  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]
RELIABLE = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE)
STATIC = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)


def _set(ros, parameter):
    result = ros.call(SetParameters, "/map_node/set_parameters", SetParameters.Request(parameters=[parameter]))
    return result.results[0].successful, result.results[0].reason


def _balanced(status) -> bool:
    return status.frames_received == frames_accounted(status)


def _diagnostics_text(ros) -> str:
    """Every message and value of the node's newest /diagnostics array, as one text."""
    if not ros.diagnostics:
        return ""
    return " ".join(f"{s.message} {' '.join(kv.value for kv in s.values)}" for s in ros.diagnostics[-1].status)


def _warned(ros, text: str) -> bool:
    """The newest /diagnostics has the node's status at WARN or worse, with ``text`` in its message."""
    if not ros.diagnostics:
        return False
    status = ros.diagnostics[-1].status[0]
    return status.level[0] >= 1 and text in status.message


def _alive_and_balanced(ros, node, accounted: int):
    """The node lives and ``accounted`` frames are processed or buffered for phase 1."""
    assert node.poll() is None, ros.output(node)[-3000:]

    def settled():
        status = ros.settled()
        return status if status and status.frames_processed + status.init_frames == accounted else None

    status = ros.wait(settled, f"{accounted} frames processed or buffered and accounted for")
    assert _balanced(status) and status.frames_failed == 0
    assert "Traceback" not in ros.output(node)
    return status


def _finite_transforms(messages, child: str) -> list:
    found = [t for m in messages for t in m.transforms if t.child_frame_id == child]
    for t in found:
        values = [t.transform.translation.x, t.transform.translation.y, t.transform.translation.z,
                  t.transform.rotation.x, t.transform.rotation.y, t.transform.rotation.z, t.transform.rotation.w]
        assert all(math.isfinite(v) for v in values), t
    return found


def _odometry(stamp_s: float, x: float = 0.0, frame="odom", child="base_link", q=(0.0, 0.0, 0.0, 1.0)) -> Odometry:
    msg = Odometry()
    msg.header.stamp.sec, msg.header.stamp.nanosec = int(stamp_s), round(stamp_s % 1 * 1e9)
    msg.header.frame_id, msg.child_frame_id = frame, child
    msg.pose.pose.position.x = x
    o = msg.pose.pose.orientation
    o.x, o.y, o.z, o.w = q
    return msg


def _bad_odometry(stamp_s: float) -> dict:
    nan, inf = float("nan"), float("inf")
    zero_stamp = _odometry(stamp_s)
    zero_stamp.header.stamp.sec = zero_stamp.header.stamp.nanosec = 0
    nan_y = _odometry(stamp_s)
    nan_y.pose.pose.position.y = nan
    return {
        "NaN quaternion": _odometry(stamp_s, q=(nan, 0.0, 0.0, 1.0)),
        "zero quaternion": _odometry(stamp_s, q=(0.0, 0.0, 0.0, 0.0)),
        "quaternion of norm 2": _odometry(stamp_s, q=(0.0, 0.0, 0.0, 2.0)),
        "NaN position": nan_y,
        "inf position": _odometry(stamp_s, x=inf),
        "1e200 m": _odometry(stamp_s, x=1e200),
        "zero stamp": zero_stamp,
        "an hour ahead": _odometry(stamp_s + 3600.0),
        "another robot's frame_id": _odometry(stamp_s, frame="robot2/odom"),
        "another robot's child_frame_id": _odometry(stamp_s, child="robot2/base_link"),
        "empty frame ids": _odometry(stamp_s, frame="", child=""),
    }


def test_hostile_odometry_is_refused_and_good_odometry_afterwards_is_used(ros, tiny):
    fixture, _ = tiny
    # A long diagnostics window: the refusals stay in it however slow the machine is.
    node = ros.start_node(fixture, "tf_mode:=map_to_odom", "process_all_frames:=true", "image_qos:=reliable",
                          "diagnostics_window_s:=120.0")
    ros.wait(lambda: ros.statuses, "the node's first status")
    transforms: list = []
    ros.node.create_subscription(tf2_msgs.TFMessage, "/tf", transforms.append, 100)
    images = ros.node.create_publisher(CompressedImage, BAG_TOPIC, RELIABLE)
    odometry = ros.node.create_publisher(Odometry, "/map_node/odometry_in", RELIABLE)
    ros.wait(lambda: images.get_subscription_count() and odometry.get_subscription_count(), "the node's subscriptions")
    images.publish(synthetic_jpeg(0, 100.0))   # the image clock starts here
    _alive_and_balanced(ros, node, 1)
    # A diagnostics tick of the active node first: its window counts from its first tick.
    ros.wait(lambda: ros.diagnostic("frames_received") == "1", "a /diagnostics array after the first image")

    bad = _bad_odometry(100.05)
    for msg in bad.values():
        odometry.publish(msg)
    status = ros.wait(lambda: ros.statuses[-1] if ros.statuses[-1].odometry_rejected == len(bad) else None,
                      f"{len(bad)} odometry messages refused")
    assert status.odometry_received == len(bad) and node.poll() is None
    ros.wait(lambda: _warned(ros, f"{len(bad)} odometry message(s) refused") and _warned(ros, "expected odom_frame"),
             "the refusals and the newest one's reason in /diagnostics (WARN)")
    # The newest refusal's reason (empty frame ids) names the topic and the expected frames.
    last_error = ros.statuses[-1].last_error
    assert "/map_node/odometry_in" in last_error and "expected odom_frame 'odom'" in last_error, last_error

    # Good odometry afterwards: every sample taken (the hour-ahead one poisoned nothing), and
    # map -> odom goes out for the frames that have it, finite.
    good = [_odometry(100.0 + 0.05 * i, x=0.01 * i) for i in range(20)]
    for msg in good:
        odometry.publish(msg)
    ros.wait(lambda: ros.statuses[-1].odometry_received == len(bad) + len(good) or None, "the good odometry")
    for i in range(1, 8):
        images.publish(synthetic_jpeg(i, 100.0 + 0.1 * i))
    status = _alive_and_balanced(ros, node, 8)
    assert status.odometry_rejected == len(bad)
    published = ros.wait(lambda: len(_finite_transforms(transforms, "odom")) >= 7 and transforms,
                         "map -> odom for the frames with odometry")
    assert {t.header.frame_id for m in published for t in m.transforms if t.child_frame_id == "odom"} == {"map"}
    # Republished at a fixed rate and post-dated (transform_publish_period_s, transform_timeout_s):
    # a lookup at "now" finds the newest map -> odom between frames, as Nav2 asks for it.
    tf2_ros = need_module("tf2_ros", "scripts/install_tf2.sh builds it from ../shared/vendor/geometry2; scripts/setup.sh runs it")
    buffer = tf2_ros.Buffer()
    listener = tf2_ros.TransformListener(buffer, ros.node)
    def at_now():
        now = ros.node.get_clock().now()
        return buffer.can_transform("map", "odom", now) and buffer.lookup_transform("map", "odom", now)

    found = ros.wait(at_now, "map -> odom at now")
    newest = [t for m in transforms for t in m.transforms if t.child_frame_id == "odom"][-1]
    assert found.transform.translation.x == pytest.approx(newest.transform.translation.x, abs=1e-9)
    assert _finite_transforms(transforms, "odom")
    listener.unregister()

    # A reset keeps the odometry buffered for the frames still to come: the new stream's frames
    # get map -> odom at their stamps (the buffer was cleared at every restart).
    reset = ros.call(Trigger, "/map_node/reset", Trigger.Request())
    assert reset.success, reset.message
    after = [100.8, 100.85, 100.9]
    for i, stamp_s in enumerate(after):
        images.publish(synthetic_jpeg(10 + i, stamp_s))
    _alive_and_balanced(ros, node, 11)
    stamps = ros.wait(lambda: {round(t.header.stamp.sec + t.header.stamp.nanosec * 1e-9, 3)
                               for t in _finite_transforms(transforms, "odom")} >= set(after) or None,
                      "map -> odom for the frames after the reset")
    assert stamps
    interrupt_and_check_exit(ros, node)


def _status_where(ros, what: str, condition):
    """The newest ~/status once ``condition(status)`` holds."""
    return ros.wait(lambda: ros.statuses[-1] if ros.statuses and condition(ros.statuses[-1]) else None, what)


def _finite_poses(ros) -> None:
    for pose in ros.poses:
        p, q = pose.pose.position, pose.pose.orientation
        assert all(math.isfinite(v) for v in (p.x, p.y, p.z, q.x, q.y, q.z, q.w)), pose


def _mapping_four_frames(ros, fixture, start_s: float, side_type, side_topic: str, *params):
    """A node taking every frame (reliable images), a publisher of ``side_type`` on ``side_topic``
    matched, four good frames from ``start_s`` processed and a /diagnostics tick seen after them
    (its window counts from the active node's first tick). Returns (node, images, side)."""
    node = ros.start_node(fixture, "process_all_frames:=true", "image_qos:=reliable", "diagnostics_window_s:=120.0",
                          *params)
    ros.wait(lambda: ros.statuses, "the node's first status")
    images = ros.node.create_publisher(CompressedImage, BAG_TOPIC, RELIABLE)
    side = ros.node.create_publisher(side_type, side_topic, RELIABLE)
    ros.wait(lambda: images.get_subscription_count() and side.get_subscription_count(), "the node's subscriptions")
    for i in range(4):
        images.publish(synthetic_jpeg(i, start_s + 0.1 * i))
    _alive_and_balanced(ros, node, 4)
    ros.wait(lambda: ros.diagnostic("frames_received") == "4", "a /diagnostics array after the first images")
    return node, images, side


def test_hostile_image_stamps_are_refused_or_held_and_the_stream_goes_on(ros, tiny):
    node, images, odometry = _mapping_four_frames(ros, tiny[0], 400.0, Odometry, "/map_node/odometry_in",
                                                  "tf_mode:=map_to_odom")

    # An unset header: refused where the image enters, never reaching the Mapper.
    images.publish(synthetic_jpeg(4, 0.0))
    status = _status_where(ros, "the zero stamp refused", lambda s: s.frames_rejected == 1)
    assert "zero stamp" in status.last_error and _balanced(status) and status.restarts == 0
    ros.wait(lambda: _warned(ros, "image skipped: image: zero stamp"), "the zero stamp's reason in /diagnostics (WARN)")

    # One frame an hour ahead: held (the next frame decides), not taken.
    images.publish(synthetic_jpeg(5, 4000.4))
    status = _status_where(ros, "the hour-ahead frame held", lambda s: s.frames_held == 1)
    assert _balanced(status) and status.restarts == 0 and status.frames_processed + status.init_frames == 4
    # Meanwhile the image clock stays with the frames taken: odometry at the images' time is used
    # (set from every message, the clock was an hour ahead and refused it as an hour behind).
    odometry.publish(_odometry(400.35))
    status = _status_where(ros, "the odometry", lambda s: s.odometry_received == 1)
    assert status.odometry_rejected == 0, status.last_error
    # The next frame does not follow it: the held one is refused as an outlier, no restart.
    images.publish(synthetic_jpeg(6, 400.4))
    status = _alive_and_balanced(ros, node, 5)
    assert (status.frames_rejected, status.frames_held, status.restarts) == (2, 0, 0)
    assert "jumped 3600.100 s ahead" in status.last_error and "did not follow" in status.last_error
    ros.wait(lambda: _warned(ros, "did not follow"), "the outlier's reason in /diagnostics (WARN)")

    # Slightly back: jitter, dropped.
    images.publish(synthetic_jpeg(7, 400.35))
    status = _status_where(ros, "the jitter dropped", lambda s: s.frames_rejected == 3)
    assert "max_stamp_jitter_s" in status.last_error and _balanced(status) and status.restarts == 0

    # A real jump: held, then confirmed by the next frame: one restart, both processed.
    images.publish(synthetic_jpeg(8, 5000.0))
    _status_where(ros, "the jump held", lambda s: s.frames_held == 1)
    for i in range(9, 13):
        images.publish(synthetic_jpeg(i, 5000.0 + 0.1 * (i - 8)))
    status = _alive_and_balanced(ros, node, 10)
    assert (status.frames_rejected, status.frames_held, status.restarts) == (3, 0, 1)
    assert status.state == MapStatus.STATE_TRACKING and status.callback_errors == 0
    assert "stream restarted (map cleared): gap of 4599.600 s between image stamps" in ros.output(node)
    _finite_poses(ros)
    interrupt_and_check_exit(ros, node)


def _camera_info(fx=100.0, fy=100.0, cx=64.0, cy=48.0, width=128, height=96) -> CameraInfo:
    return CameraInfo(width=width, height=height, k=[fx, 0.0, cx, 0.0, fy, cy, 0.0, 0.0, 1.0])


def test_hostile_camera_info_is_refused_and_a_good_one_afterwards_is_used(ros, tiny):
    nan, inf = float("nan"), float("inf")
    node, images, info = _mapping_four_frames(ros, tiny[0], 500.0, CameraInfo, "/map_node/camera_info",
                                              "use_camera_info:=true", "camera_info_qos:=reliable",
                                              "camera_info_qos_depth:=50")
    bad = {"NaN focal": _camera_info(fx=nan), "zero focal": _camera_info(fy=0.0),
           "negative focal": _camera_info(fx=-100.0), "zero width": _camera_info(width=0),
           "zero height": _camera_info(height=0), "inf principal point": _camera_info(cx=inf)}
    for msg in bad.values():
        info.publish(msg)
    status = _status_where(ros, f"{len(bad)} camera_info refused", lambda s: s.camera_info_rejected == len(bad))
    assert "/map_node/camera_info: camera_info: non-finite K" in status.last_error   # the newest: inf cx
    ros.wait(lambda: _warned(ros, f"0 image(s) and {len(bad)} camera_info rejected (newest: "
                                  "/map_node/camera_info: camera_info: non-finite K"),
             "the refusals and the newest one's reason in /diagnostics (WARN)")
    assert ros.diagnostic("camera_info") == ""   # none taken
    info.publish(_camera_info(fx=120.0, fy=121.0))
    ros.wait(lambda: ros.diagnostic("camera_info") == "fx=120.0 fy=121.0 cx=64.0 cy=48.0 (128x96)",
             "the good camera_info used")
    for i in range(4, 6):
        images.publish(synthetic_jpeg(i, 500.0 + 0.1 * i))
    status = _alive_and_balanced(ros, node, 6)
    assert status.camera_info_rejected == len(bad) and status.frames_rejected == 0 and status.callback_errors == 0
    _finite_poses(ros)
    interrupt_and_check_exit(ros, node)


def _tf(parent: str, child: str, stamp_s: float, x: float = 0.0, q=(0.0, 0.0, 0.0, 1.0)) -> TransformStamped:
    t = _mount((x, 0.0, 0.0), q, parent, child)
    t.header.stamp.sec, t.header.stamp.nanosec = int(stamp_s), round(stamp_s % 1 * 1e9)
    return t



def _node_with_side_inputs(ros, fixture, first_odometry_stamp: float):
    """A node in map_to_odom mode with every frame processed, and reliable publishers of images,
    odometry and /tf that it has matched. The node reads odometry best effort: its reader matches
    the publisher some time after the publisher matched it, and a sample sent before is lost, so
    one sample stamped ``first_odometry_stamp`` goes out until it counts."""
    node = ros.start_node(fixture, "tf_mode:=map_to_odom", "process_all_frames:=true", "image_qos:=reliable",
                          "diagnostics_window_s:=120.0")
    ros.wait(lambda: ros.statuses, "the node's first status")
    images = ros.node.create_publisher(CompressedImage, BAG_TOPIC, RELIABLE)
    odometry = ros.node.create_publisher(Odometry, "/map_node/odometry_in", RELIABLE)
    tf = ros.node.create_publisher(tf2_msgs.TFMessage, "/tf", RELIABLE)
    ros.wait(lambda: images.get_subscription_count() and odometry.get_subscription_count()
             and tf.get_subscription_count(), "the node's subscriptions")
    ros.wait(lambda: odometry.publish(_odometry(first_odometry_stamp)) or ros.statuses[-1].odometry_received or None,
             "the node's odometry reader matched")
    return node, images, odometry, tf

def test_hostile_dynamic_tf_leaves_the_node_running_and_a_conflict_is_reported(ros, tiny):
    fixture, _ = tiny
    nan = float("nan")
    transforms: list = []
    ros.node.create_subscription(tf2_msgs.TFMessage, "/tf", transforms.append, 100)
    node, images, odometry, tf = _node_with_side_inputs(ros, fixture, 599.0)
    before = ros.statuses[-1].odometry_received
    for i in range(20):
        odometry.publish(_odometry(600.0 + 0.05 * i, x=0.01 * i))
    ros.wait(lambda: ros.statuses[-1].odometry_received >= before + 20 or None, "the odometry")
    for i in range(4):
        images.publish(synthetic_jpeg(i, 600.0 + 0.1 * i))
    _alive_and_balanced(ros, node, 4)
    ros.wait(lambda: [t for t in _finite_transforms(transforms, "odom") if t.header.frame_id == "map"],
             "the node's map -> odom")

    # Another robot's tree at a high rate, and our robot's odom -> base_link with NaN values
    # (not a frame the node publishes): neither is a conflict, the image path goes on.
    for i in range(1000):
        tf.publish(tf2_msgs.TFMessage(transforms=[_tf("robot2/map", "robot2/odom", 600.0 + 0.001 * i, x=0.1),
                                                  _tf("robot2/odom", "robot2/base_link", 600.0 + 0.001 * i)]))
    tf.publish(tf2_msgs.TFMessage(transforms=[_tf("odom", "base_link", 600.3, x=nan, q=(nan, 0.0, 0.0, 1.0))]))
    for i in range(4, 7):
        images.publish(synthetic_jpeg(i, 600.0 + 0.1 * i))
    status = _alive_and_balanced(ros, node, 7)
    assert status.callback_errors == 0 and status.tf_rejected == 0
    assert "already has parent" not in _diagnostics_text(ros)

    # Our child frame from another publisher, NaN at that: the conflict watch stops the TF output
    # and says so (ERROR naming the frame and the other parent); the node lives and maps on.
    tf.publish(tf2_msgs.TFMessage(transforms=[_tf("map", "odom", 1.0, x=nan)]))
    ros.wait(lambda: ros.diagnostics and ros.diagnostics[-1].status[0].level[0] == 2
             and "frame 'odom' already has parent 'map' on /tf" in ros.diagnostics[-1].status[0].message,
             "the conflict in /diagnostics (ERROR)")
    for i in range(7, 10):
        images.publish(synthetic_jpeg(i, 600.0 + 0.1 * i))
    status = _alive_and_balanced(ros, node, 10)
    assert status.callback_errors == 0
    # Nothing non-finite from the node (the probe's own NaN transform, stamped 1 s, aside).
    ours = [t for m in transforms for t in m.transforms if t.header.stamp.sec != 1 and t.header.frame_id == "map"]
    assert _finite_transforms([tf2_msgs.TFMessage(transforms=ours)], "odom")
    _finite_poses(ros)
    interrupt_and_check_exit(ros, node)


def _mount(translation, quaternion, parent="base_link", child="cam") -> TransformStamped:
    t = TransformStamped()
    t.header.stamp.sec = 1
    t.header.frame_id, t.child_frame_id = parent, child
    # floats: an int in a float64 field is serialised as garbage by the generated C conversion
    t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = map(float, translation)
    r = t.transform.rotation
    r.x, r.y, r.z, r.w = map(float, quaternion)
    return t


def test_a_hostile_camera_mount_on_tf_static_is_refused_and_the_map_stays_finite(ros, tiny, tmp_path):
    fixture, _ = tiny
    nan, inf = float("nan"), float("inf")
    node = ros.start_node(fixture, "process_all_frames:=true", "image_qos:=reliable", "diagnostics_window_s:=120.0")
    ros.wait(lambda: ros.statuses, "the node's first status")
    static = ros.node.create_publisher(tf2_msgs.TFMessage, "/tf_static", STATIC)
    # Each a separate message (the newest of a child wins); the last, a kilometre-long mount, is
    # the one a tf2 buffer keeps (tf2 itself drops non-finite ones): refused at the lookup.
    for transform in (_mount((0, 0, 0), (nan, 0, 0, 1)), _mount((inf, 0, 0), (0, 0, 0, 1)),
                      _mount((0, 0, 0), (0, 0, 0, 0)), _mount((0, 0, nan), (0, 0, 0, 1)),
                      _mount((1000.0, 0, 0), (0, 0, 0, 1))):
        static.publish(tf2_msgs.TFMessage(transforms=[transform]))
    ros.wait(static.get_subscription_count, "the node's /tf_static subscription")
    from rclpy.duration import Duration
    assert static.wait_for_all_acked(Duration(seconds=30))
    images = ros.node.create_publisher(CompressedImage, BAG_TOPIC, RELIABLE)
    ros.wait(images.get_subscription_count, "the node's image subscription")
    for i in range(6):
        images.publish(synthetic_jpeg(i, 200.0 + 0.1 * i))
    _alive_and_balanced(ros, node, 6)
    status = ros.wait(lambda: ros.statuses[-1] if ros.statuses[-1].tf_rejected >= 1 else None, "a refused mount")
    # Refused at the lookup (tf2 keeps the newest of a child, whichever its listener's threads
    # stored last) or by the mount's bound.
    assert "base_link -> cam" in status.last_error or "/tf_static" in status.last_error, status.last_error
    ros.wait(lambda: ros.diagnostic("camera_mount") == "the camera_mount setting", "the mount from the parameter")
    ros.wait(lambda: _warned(ros, "camera mount base_link -> cam on TF was refused"), "the refusal in /diagnostics (WARN)")
    saved = ros.call(SaveMap, "/map_node/save_map", SaveMap.Request(directory=str(tmp_path / "saved")))
    assert saved.success, saved.message
    xyz, _ = read_ply(saved.ply_path)
    assert len(xyz) and np.isfinite(xyz).all()
    poses = [pose for _, pose, _ in read_tum(saved.tum_path)]
    assert len(poses) == 6 and np.isfinite(np.array(poses)).all()
    interrupt_and_check_exit(ros, node)


def test_hostile_live_parameters_services_and_save_paths(ros, tiny, tmp_path):
    fixture, _ = tiny
    root = tmp_path / "maps"
    node = ros.start_node(fixture, "process_all_frames:=true", "image_qos:=reliable", f"save_directory:={root}")
    ros.wait(lambda: ros.statuses, "the node's first status")

    # Values a range accepted although the code could not apply them, and wrong types: refused
    # with the reason, the process alive.
    refused = {
        "map_publish_period_s": (double_parameter("map_publish_period_s", 1e12), "out of range"),
        "diagnostics_period_s": (double_parameter("diagnostics_period_s", 1e9), "out of range"),
        "service_timeout_s": (double_parameter("service_timeout_s", 1e308), "out of range"),
        "max_stamp_gap_s": (double_parameter("max_stamp_gap_s", 1e308), "out of range"),
        "stale_after_s (NaN)": (double_parameter("stale_after_s", float("nan")), "stale_after_s"),
        "save_directory (empty)": (string_parameter("save_directory", ""), "must name a directory"),
        "scale (read-only)": (double_parameter("scale", 1e39), "read-only"),
        # Inside the descriptor's range, below what a timer can do: refused by the rule.
        "map_publish_period_s (1e-12)": (double_parameter("map_publish_period_s", 1e-12),
                                         "'map_publish_period_s' must be 0 (off) or at least 0.001 s"),
        "diagnostics_period_s (1e-12)": (double_parameter("diagnostics_period_s", 1e-12), "out of range"),
        "max_input_ahead_s (beyond the odometry buffer)": (double_parameter("max_input_ahead_s", 60.0),
                                                           "out of range"),
        "camera_mount (read-only)": (string_parameter("camera_mount", "1e300 0 0 0 0 0"), "read-only"),
    }
    for case, (parameter, why) in refused.items():
        successful, reason = _set(ros, parameter)
        assert not successful and why in reason, (case, reason)
        assert node.poll() is None, case

    # An integer for a float parameter is taken as that float: the parameter keeps its type.
    assert _set(ros, integer_parameter("min_confidence", 2)) == (True, "")
    value = ros.call(GetParameters, "/map_node/get_parameters", GetParameters.Request(names=["min_confidence"]))
    assert (value.values[0].type, value.values[0].double_value) == (ParameterType.PARAMETER_DOUBLE, 2.0)

    # A best-effort camera against process_all_frames: its mismatch is a WARN naming the topic.
    best_effort = ros.node.create_publisher(CompressedImage, BAG_TOPIC, QoSProfile(
        depth=5, reliability=ReliabilityPolicy.BEST_EFFORT))
    ros.wait(lambda: _warned(ros, BAG_TOPIC) and "incompatible" in ros.diagnostics[-1].status[0].message,
             "the QoS mismatch in /diagnostics")
    ros.node.destroy_publisher(best_effort)

    # A tiny map period with a subscriber: publications coalesce, services still answer.
    maps: list = []
    ros.node.create_subscription(PointCloud2, "/map_node/map", maps.append, QoSProfile(
        depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL))
    assert _set(ros, double_parameter("map_publish_period_s", 0.001)) == (True, "")
    images = ros.node.create_publisher(CompressedImage, BAG_TOPIC, RELIABLE)
    ros.wait(images.get_subscription_count, "the node's image subscription")
    for i in range(5):
        images.publish(synthetic_jpeg(i, 300.0 + 0.1 * i))
    _alive_and_balanced(ros, node, 5)
    ros.wait(lambda: maps, "a map")
    flushed = ros.call(Trigger, "/map_node/flush_deferred_evictions", Trigger.Request())
    assert flushed.success, flushed.message
    for msg in maps[-3:]:
        assert msg.is_dense and msg.width > 0

    # Save paths: an escape is refused and nothing is written; answers are absolute.
    escape = ros.call(SaveMap, "/map_node/save_map", SaveMap.Request(directory="../../escape"))
    assert not escape.success and "leaves save_directory" in escape.message
    assert not (tmp_path / "escape").exists() and not (tmp_path.parent / "escape").exists()
    inside = ros.call(SaveMap, "/map_node/save_map", SaveMap.Request(directory="run1"))
    assert inside.success and inside.ply_path == str(root / "run1" / "map.ply")
    default = ros.call(SaveMap, "/map_node/save_map", SaveMap.Request(directory=""))
    assert default.success and default.tum_path == str(root / "trajectory.tum")
    # A symlink at the target is replaced, its target untouched.
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (root / "linked").mkdir()
    (root / "linked" / "map.ply").symlink_to(victim)
    linked = ros.call(SaveMap, "/map_node/save_map", SaveMap.Request(directory="linked"))
    assert linked.success and victim.read_text() == "keep me"
    assert not (root / "linked" / "map.ply").is_symlink()
    # A save that cannot complete (trajectory.tum is a directory) keeps the previous files.
    (root / "broken").mkdir()
    (root / "broken" / "map.ply").write_bytes(b"previous map")
    (root / "broken" / "trajectory.tum").mkdir()
    broken = ros.call(SaveMap, "/map_node/save_map", SaveMap.Request(directory="broken"))
    assert not broken.success and "not a regular file" in broken.message
    assert (root / "broken" / "map.ply").read_bytes() == b"previous map"
    assert sorted(p.name for p in (root / "broken").iterdir()) == ["map.ply", "trajectory.tum"]

    # Good input after all of it: processed, balanced.
    for i in range(5, 8):
        images.publish(synthetic_jpeg(i, 300.0 + 0.1 * i))
    status = _alive_and_balanced(ros, node, 8)
    assert status.callback_errors == 0
    interrupt_and_check_exit(ros, node)


def test_hostile_start_up_parameters_fail_configure_naming_each(ros, tiny):
    fixture, _ = tiny
    node = ros.start_node(fixture, "scale_source:=fixed", "scale:=1e39", "odom_frame:=base_link",
                          "save_directory:=' '", "map_publish_period_s:=1e12", "service_timeout_s:=1e308",
                          "diagnostics_period_s:=1e300", "camera_mount:='1e300 0 0 0 0 0'",
                          "map_voxel_size_m:=1e-300", "transform_publish_period_s:=1e-12", "camera_num_iterations:=1000000000000",
                          "max_input_ahead_s:=60.0", "tf_camera_frame:=map", "camera_frame:=map")
    assert node.wait(120) == 1
    out = ros.output(node)
    assert "Traceback" not in out and "see above" not in out
    for name in ("'scale'", "'odom_frame' must differ from 'base_frame'", "'save_directory'",
                 "'map_publish_period_s'", "'service_timeout_s'", "'diagnostics_period_s'",
                 "'camera_mount' must have a translation of at most 100 m", "'map_voxel_size_m' must be >= 0.001",
                 "'transform_publish_period_s' must be 0 (off) or at least 0.001 s",
                 "'camera_num_iterations' must be <= 64", "'max_input_ahead_s' must be <= 10",
                 "'tf_camera_frame' must differ from 'map_frame'", "'camera_frame' ('map') must not be map_frame"):
        assert name in out, (name, out[-3000:])


def test_the_tools_end_on_sigterm_and_sigint_with_exit_0_in_every_phase(ros, shared_dir):
    bag = need_path(shared_dir / "data" / "courthouse_bag")
    received: list = []
    ros.node.create_subscription(CompressedImage, "/hostile_camera/compressed", received.append, 10)
    for signum in (signal.SIGTERM, signal.SIGINT):
        camera = ros.start("camera", ["-m", "lingbot_ros.tools.camera", "--source", "synthetic:64x48",
                                      "--rate", "20", "--topic", "/hostile_camera", "--compressed", "--reliable"])
        ros.wait(lambda: received, "the camera's images")
        received.clear()
        camera.send_signal(signum)
        assert camera.wait(20) == 0 and "Traceback" not in ros.output(camera)
        # Waiting for a node that never comes (no map_node here), then the signal.
        player = ros.start("replay", ["-m", "lingbot_ros.tools.replay", str(bag), "--wait-for-node", "/map_node",
                                      "--node-timeout", "600", "--wait-for-subscribers", "0"])
        ros.wait(lambda: "lingbot_replay" in ros.node.get_node_names(), "the player's node")
        player.send_signal(signum)
        assert player.wait(20) == 0, ros.output(player)[-2000:]
        assert "Traceback" not in ros.output(player)


# -- the map database at its edges (issue 28) ---------------------------------------------------

DATABASE_SETTINGS = ("process_all_frames:=true", "image_qos:=reliable", "diagnostics_window_s:=120.0",
                     "long_run_policy:=windowed", "window_size:=6", "overlap_size:=2", "stale_after_s:=0.0")


def _database_node(ros, fixture, database, *params):
    """A node writing ``database`` (windowed), with a fresh view of its status, and the probe's
    image publisher once the node's subscription matched it."""
    ros.statuses.clear()
    ros.diagnostics.clear()
    node = ros.start_node(fixture, *DATABASE_SETTINGS, f"map_database:={database}", *params)
    ros.wait(lambda: ros.statuses, "the node's first status")
    images = ros.node.create_publisher(CompressedImage, BAG_TOPIC, RELIABLE)
    ros.wait(images.get_subscription_count, "the node's image subscription")
    return node, images


def _map_frames(ros, node, images, count: int, start_s: float) -> None:
    for i in range(count):
        images.publish(synthetic_jpeg(i, start_s + 0.1 * i))
    _alive_and_balanced(ros, node, count)


def _rows(database, sql: str) -> list:
    import sqlite3

    conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_hostile_database_paths_never_overwrite_a_users_file(ros, tiny, tmp_path):
    """A symlink at <database>-writer.lock and at <database>-wal, a second writer through a symlink
    to the database, frames stamped t, t, t + 1 ns: no file of the user's changes, the second
    writer is kept out with its reason, the first's live run stays its own, and no stamp is stored
    twice."""
    fixture, _ = tiny
    victim = tmp_path / "victim.yaml"
    victim.write_text("keep: me\n")
    trapped = tmp_path / "trapped" / "map.db"
    trapped.parent.mkdir()
    Path(f"{trapped}-writer.lock").symlink_to(victim)
    node, images = _database_node(ros, fixture, trapped)
    status = _status_where(ros, "the lock refused", lambda s: "is a symlink, not followed" in s.state_text)
    ros.wait(lambda: _warned(ros, "is a symlink, not followed"), "the refusal in /diagnostics (WARN)")
    _map_frames(ros, node, images, 4, 800.0)   # mapping goes on in memory
    interrupt_and_check_exit(ros, node)
    assert victim.read_text() == "keep: me\n" and Path(f"{trapped}-writer.lock").is_symlink()
    assert "Traceback" not in ros.output(node) and status.callback_errors == 0

    # A symlink at the database's -wal: SQLite would write its journal into the linked file.
    journaled = tmp_path / "journaled" / "map.db"
    journaled.parent.mkdir()
    Path(f"{journaled}-wal").symlink_to(victim)
    node, images = _database_node(ros, fixture, journaled)
    _status_where(ros, "the -wal refused", lambda s: "map.db-wal is a symlink, not followed" in s.state_text)
    ros.wait(lambda: _warned(ros, "map.db-wal is a symlink, not followed"), "the -wal's refusal in /diagnostics")
    _map_frames(ros, node, images, 4, 850.0)
    interrupt_and_check_exit(ros, node)
    assert victim.read_text() == "keep: me\n" and Path(f"{journaled}-wal").is_symlink()
    assert "Traceback" not in ros.output(node)

    # Two writers, one through a symlink: the second is kept out, the first's run is its own.
    database = tmp_path / "maps" / "map.db"
    database.parent.mkdir()
    link = tmp_path / "link.db"
    link.symlink_to(database)
    node, images = _database_node(ros, fixture, database)
    ros.wait(lambda: database.exists() and _rows(database, "SELECT id, ending FROM runs") == [(1, "running")],
             "run 1 being written")
    # Three frames stamped t, t, t + 1 ns, then more: the duplicate is dropped where it enters.
    first = synthetic_jpeg(0, 900.0)
    duplicate = synthetic_jpeg(1, 900.0)
    after = synthetic_jpeg(2, 900.0)
    after.header.stamp.nanosec += 1
    for msg in (first, duplicate, after):
        images.publish(msg)
    # Balanced too: the status that counts the duplicate can come before the third frame is done.
    status = _status_where(ros, "the duplicate dropped and every frame accounted for",
                           lambda s: s.frames_rejected == 1 and s.frames_received == 3 and _balanced(s))
    assert "a duplicate" in status.last_error and status.restarts == 0
    for i in range(3, 6):
        images.publish(synthetic_jpeg(i, 900.0 + 0.1 * i))
    _alive_and_balanced(ros, node, 5)
    # The offline tool as the second writer, on the same file through the link.
    second = ros.start("offline", ["-m", "lingbot_ros.tools.offline", "--input", "synthetic:128x96",
                                   "--output", str(tmp_path / "offline"), "--max-frames", "4",
                                   "--checkpoint", str(fixture / "ckpt.pt"), "--model-config",
                                   str(fixture / "config.json"), "--device", "cpu", "--image-width", "112",
                                   "--num-scale-frames", "3", "--sliding-window", "4", "--no-warmup",
                                   "--map-database", str(link)])
    assert second.wait(300) == 0, ros.output(second)[-3000:]
    assert "is being written by another process" in ros.output(second), ros.output(second)[-3000:]
    info = subprocess.run([sys.executable, "-m", "lingbot_ros.tools.map_db", "info", str(link)],
                          capture_output=True, text=True, timeout=120)
    assert "run 1: running;" in info.stdout and "1 run(s)" in info.stdout, info.stdout   # live, not crashed
    interrupt_and_check_exit(ros, node)
    assert _rows(database, "SELECT id, ending FROM runs") == [(1, "clean")]
    stamps = [row[0] for row in _rows(database, "SELECT stamp_ns FROM frames ORDER BY idx")]
    assert len(stamps) == 5 and len(set(stamps)) == 5 and stamps[:2] == [900 * 10**9, 900 * 10**9 + 1]
    assert _rows(database, "PRAGMA integrity_check") == [("ok",)]


NAN_POSE = np.full(16, np.nan).tobytes()


def _npy(array) -> bytes:
    from lingbot_ros.mapping.database.blobs import array_blob
    return array_blob(np.asarray(array))


# A damaged stored run at resume: (SQL, parameters, what status names).
RESUME_DAMAGES = {
    "settings a JSON list": ("UPDATE runs SET settings = '[1, 2]'", (), "run 1: settings: JSON list, not an object"),
    "NaN pose": ("UPDATE frames SET pose = ? WHERE idx = 2", (NAN_POSE,), "run 1: frame 2: pose holds non-finite"),
    "NaN camera mount": ("UPDATE runs SET mount = ?", (_npy(np.full((4, 4), np.nan)),),
                         "run 1: mount: mount holds non-finite values"),
    "continuation image of another size": ("UPDATE overlap_frames SET rgb = ? WHERE seq = 1",
                                           (_npy(np.zeros((20, 30, 3), np.uint8)),),
                                           "run 1: continuation frame 1: image 30x20"),
    # SQLite keeps any value in any column: a stamp or a window number of another type.
    "a stamp stored as text": ("UPDATE frames SET stamp_ns = 'abc' WHERE idx = 3", (),
                               "run 1: frame 3: stamp 'abc' is not an integer"),
    "a continuation's window as text": ("UPDATE continuations SET window = 'w'", (),
                                        "run 1: continuation: window 'w' is not an integer"),
}


def test_a_damaged_run_is_refused_at_resume_and_the_node_maps_on_in_a_new_run(ros, tiny, tmp_path):
    import shutil
    import sqlite3

    fixture, _ = tiny
    stored = tmp_path / "stored.db"
    node, images = _database_node(ros, fixture, stored)
    _map_frames(ros, node, images, 8, 1000.0)
    interrupt_and_check_exit(ros, node)
    for case, (sql, parameters, why) in RESUME_DAMAGES.items():
        database = tmp_path / f"{case.replace(' ', '_')}.db"
        shutil.copy(stored, database)
        conn = sqlite3.connect(database)
        conn.execute(sql, parameters)
        conn.commit()
        conn.close()
        damaged_run = _rows(database, "SELECT * FROM runs WHERE id = 1")
        node, images = _database_node(ros, fixture, database, "resume:=true")
        status = _status_where(ros, f"{case}: the run refused", lambda s: "cannot be read" in s.state_text)
        assert why in status.state_text and "a new map starts" in status.state_text, (case, status.state_text)
        ros.wait(lambda: "cannot be read" in _diagnostics_text(ros), f"{case}: the reason in /diagnostics")
        ros.poses.clear()
        _map_frames(ros, node, images, 4, 2000.0)   # a new run, mapped and stored
        _finite_poses(ros)
        assert len(ros.poses) >= 4 and ros.statuses[-1].callback_errors == 0
        interrupt_and_check_exit(ros, node)
        assert "Traceback" not in ros.output(node), case
        assert _rows(database, "SELECT * FROM runs WHERE id = 1") == damaged_run, case   # left as it was
        assert _rows(database, "SELECT id, ending FROM runs") == [(1, "clean"), (2, "clean")], case
        assert _rows(database, "SELECT COUNT(*) FROM frames WHERE run = 2") == [(4,)], case


def test_sigkill_right_after_a_resumed_start_keeps_the_continuation_and_the_file_grows_with_the_map(ros, tiny,
                                                                                                   tmp_path):
    import signal as signals

    fixture, _ = tiny
    database = tmp_path / "map.db"
    node, images = _database_node(ros, fixture, database)
    _map_frames(ros, node, images, 8, 3000.0)
    interrupt_and_check_exit(ros, node)
    for cycle in range(3):   # killed as soon as the resumed run is in the file
        node, _ = _database_node(ros, fixture, database, "resume:=true")
        _status_where(ros, f"cycle {cycle}: resumed", lambda s: "aligns to its stored frames" in s.state_text)
        ros.wait(lambda: _rows(database, "SELECT ending FROM runs") == [("running",)],
                 f"cycle {cycle}: the resumed run in the file")   # committed with the take-over
        node.send_signal(signals.SIGKILL)
        node.wait()
        assert _rows(database, "SELECT COUNT(*) FROM runs") == [(1,)]   # taken over, not copied
        assert _rows(database, "SELECT COUNT(*) FROM frames") == [(8,)]
        assert _rows(database, "SELECT COUNT(*) FROM overlap_frames") == [(2,)], "the continuation was lost"
    node, images = _database_node(ros, fixture, database, "resume:=true")
    status = _status_where(ros, "resumed after the kills", lambda s: "aligns to its stored frames" in s.state_text)
    assert "(crashed) at frame 8: window" in status.state_text, status.state_text
    for i in range(4):
        images.publish(synthetic_jpeg(10 + i, 3000.8 + 0.1 * i))
    _alive_and_balanced(ros, node, 4)
    interrupt_and_check_exit(ros, node)
    assert _rows(database, "SELECT COUNT(*) FROM runs") == [(1,)] and _rows(database, "PRAGMA integrity_check") == [
        ("ok",)]
    assert _rows(database, "SELECT COUNT(*) FROM frames") == [(12,)]


def test_truncated_odometry_and_tf_payloads_are_refused_and_counted(ros, tiny):
    from rclpy.serialization import serialize_message

    fixture, _ = tiny
    node, images, odometry, tf = _node_with_side_inputs(ros, fixture, 1099.0)
    images.publish(synthetic_jpeg(0, 1100.0))
    _alive_and_balanced(ros, node, 1)
    before = ros.statuses[-1]
    whole = serialize_message(_odometry(1100.05, x=0.1))
    cut = [whole[:len(whole) // 2], whole[:13], whole[:-9]]
    for data in cut:
        odometry.publish(data)
    # Our child frame ('odom') is named, so the conflict watch reads it: cut in its numbers.
    transforms = serialize_message(tf2_msgs.TFMessage(transforms=[_tf("map", "odom", 1100.05)]))
    for data in (transforms[:-20], transforms[:-44]):
        tf.publish(data)
    status = _status_where(ros, "the truncated messages refused", lambda s: (
        s.odometry_rejected - before.odometry_rejected == len(cut) and s.tf_rejected - before.tf_rejected == 2))
    assert status.callback_errors == 0 and node.poll() is None
    assert "do not deserialise as" in status.last_error, status.last_error
    ros.wait(lambda: _warned(ros, "refused"), "the refusals in /diagnostics (WARN)")
    assert "bug:" not in _diagnostics_text(ros)
    for i in range(1, 5):
        images.publish(synthetic_jpeg(i, 1100.0 + 0.1 * i))
    status = _alive_and_balanced(ros, node, 5)
    assert status.callback_errors == 0 and "bug:" not in ros.output(node)
    interrupt_and_check_exit(ros, node)


@pytest.mark.parametrize("delay_s", [0.3, 1.0, 2.0])
def test_sigint_during_the_start_up_imports_is_a_clean_stop(ros, tiny, delay_s):
    import time

    node = ros.start_node(tiny[0])
    time.sleep(delay_s)
    node.send_signal(signal.SIGINT)
    assert node.wait(60) == 0, ros.output(node)[-3000:]
    out = ros.output(node)
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
