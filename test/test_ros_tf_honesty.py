"""map -> odom and what /diagnostics says about it, over DDS against the node as a subprocess
(helpers.Ros), as Nav2 and an operator see them (issue 18 item 9).

One node per odometry source: from ~/odometry_in, with the metric scale estimated from it (map ->
odom held back, and said so, while the scale is unknown; published once it is known; no odometry
at all is a WARN naming the topic), and from TF through the real tf2_ros (odometry_source tf:
map -> odom composes with the robot's odom -> base_link to the node's pose at each image stamp).
"""
import math

import numpy as np
import pytest
from nav_msgs.msg import Odometry
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage

from helpers import BAG_TOPIC, interrupt_and_check_exit, need_module, stamp_ns, synthetic_jpeg, transform_matrix
from lingbot_ros.ros.input_checks import checked_transform
from lingbot_ros.ros.messages import stamp_msg, transform_stamped

tf2_msgs = need_module("tf2_msgs.msg", module_level=True)

pytestmark = [pytest.mark.ros, pytest.mark.slow]
RELIABLE = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE)
ODOMETRY_TOPIC = "/map_node/odometry_in"
# Every frame a keyframe whose odometry moved 0.1 m closes a scale pair; two pairs make it known
# (the tiny random model's motion is no real scale: any spread is accepted here).
SCALE = ("scale_source:=odometry", "scale_min_pairs:=2", "scale_min_motion_m:=0.05", "scale_max_spread:=1000.0")
COMMON = ("tf_mode:=map_to_odom", "process_all_frames:=true", "image_qos:=reliable", "diagnostics_window_s:=120.0",
          "transform_publish_period_s:=0.0")   # only the transforms at image stamps: each one is a frame's


def _odometry(stamp_s: float) -> Odometry:
    """odom -> base_link, driving along x at 1 m/s from x = 0 at t = 100 s."""
    msg = Odometry()
    msg.header.stamp.sec, msg.header.stamp.nanosec = int(stamp_s), round(stamp_s % 1 * 1e9)
    msg.header.frame_id, msg.child_frame_id = "odom", "base_link"
    msg.pose.pose.position.x = stamp_s - 100.0
    msg.pose.pose.orientation.w = 1.0
    return msg


def _warnings(ros) -> str:
    """The node's status message in the newest /diagnostics when it is WARN or worse, else ''."""
    if not ros.diagnostics:
        return ""
    status = ros.diagnostics[-1].status[0]
    return status.message if status.level[0] >= 1 else ""


def _map_odom(messages) -> dict:
    """map -> odom transforms by stamp (ns), each finite."""
    found = {}
    for message in messages:
        for t in message.transforms:
            if t.child_frame_id != "odom":
                continue
            assert t.header.frame_id == "map"
            values = [t.transform.translation.x, t.transform.translation.y, t.transform.translation.z,
                      t.transform.rotation.x, t.transform.rotation.y, t.transform.rotation.z, t.transform.rotation.w]
            assert all(math.isfinite(v) for v in values), t
            found[stamp_ns(t.header)] = t.transform
    return found


def _settled(ros, accounted: int):
    """The newest status once ``accounted`` frames are processed or buffered for phase 1."""
    status = ros.settled()
    return status if status and status.frames_processed + status.init_frames == accounted else None


def _frames(ros, node, images, stamps, first_index: int, accounted: int):
    for i, stamp_s in enumerate(stamps):
        images.publish(synthetic_jpeg(first_index + i, stamp_s))
    status = ros.wait(lambda: _settled(ros, accounted), f"{accounted} frames accounted for")
    assert node.poll() is None and status.frames_failed == 0, ros.output(node)[-3000:]
    return status


def test_map_to_odom_is_held_and_said_so_until_the_scale_is_known_and_no_odometry_is_a_warn(ros, tiny):
    fixture, _ = tiny
    node = ros.start_node(fixture, *COMMON, *SCALE)
    ros.wait(lambda: ros.statuses, "the node's first status")
    transforms: list = []
    ros.node.create_subscription(tf2_msgs.TFMessage, "/tf", transforms.append, 100)
    images = ros.node.create_publisher(CompressedImage, BAG_TOPIC, RELIABLE)
    odometry = ros.node.create_publisher(Odometry, ODOMETRY_TOPIC, RELIABLE)
    ros.wait(lambda: images.get_subscription_count() and odometry.get_subscription_count(), "the node's subscriptions")

    # Frames without any odometry: nothing goes out, and /diagnostics says why, naming the topic.
    status = _frames(ros, node, images, [100.0 + 0.1 * i for i in range(5)], 0, 5)
    assert status.frames_processed and not status.scale_known and status.odometry_received == 0
    ros.wait(lambda: f"{ODOMETRY_TOPIC}: no odometry received" in _warnings(ros) and
             "map -> odom (map_to_odom) NOT published: waiting for the metric scale" in _warnings(ros),
             "the WARNs: no odometry on the topic, map -> odom not published")
    assert not _map_odom(transforms)

    # Odometry for the next frames: the first ones have it while the scale is still unknown, and
    # map -> odom stays held for them; once two pairs made the scale known it goes out.
    odometry_stamps = [100.45 + 0.05 * i for i in range(40)]   # 100.45 .. 102.4
    for stamp_s in odometry_stamps:
        odometry.publish(_odometry(stamp_s))
    ros.wait(lambda: ros.statuses[-1].odometry_received == len(odometry_stamps) or None, "the odometry")
    stamps = [100.5 + 0.1 * i for i in range(15)]
    status = _frames(ros, node, images, stamps, 5, 20)
    assert status.scale_known and status.odometry_rejected == 0, status.scale_text
    published = ros.wait(lambda: _map_odom(transforms) or None, "map -> odom once the scale is known")
    frame_stamps = [round(s * 1e9) for s in stamps]
    assert set(published) <= set(frame_stamps), sorted(published)
    # The first frames with odometry had no known scale yet: held, not published.
    assert frame_stamps[0] not in published and frame_stamps[1] not in published, sorted(published)
    assert frame_stamps[-1] in ros.wait(lambda: _map_odom(transforms) if frame_stamps[-1] in _map_odom(transforms)
                                        else None, "map -> odom of the newest frame")
    # Diagnostics follow: the held-back and no-odometry WARNs are gone, the TF entry says it publishes.
    ros.wait(lambda: ros.diagnostic("tf") == "publishing map -> odom (map_to_odom)" and
             "NOT published" not in _warnings(ros) and "no odometry received" not in _warnings(ros),
             "/diagnostics: publishing map -> odom")
    interrupt_and_check_exit(ros, node)


def test_odometry_from_tf_through_tf2_ros_gives_map_to_odom_at_each_image_stamp(ros, tiny):
    need_module("tf2_ros", "scripts/install_tf2.sh builds it from ../shared/vendor/geometry2; scripts/setup.sh runs it")
    fixture, _ = tiny
    node = ros.start_node(fixture, *COMMON, "odometry_source:=tf")
    ros.wait(lambda: ros.statuses, "the node's first status")
    transforms: list = []
    ros.node.create_subscription(tf2_msgs.TFMessage, "/tf", transforms.append, 100)
    images = ros.node.create_publisher(CompressedImage, BAG_TOPIC, RELIABLE)
    robot_tf = ros.node.create_publisher(tf2_msgs.TFMessage, "/tf", RELIABLE)

    def tf2_listening() -> bool:
        """The node's tf2 listener (reliable, as tf2_ros subscribes) is on /tf, and matched: the
        robot's transforms are not lost to discovery."""
        subscriptions = ros.node.get_subscriptions_info_by_topic("/tf")
        return (any(i.node_name == "map_node" and i.qos_profile.reliability == ReliabilityPolicy.RELIABLE
                    for i in subscriptions) and robot_tf.get_subscription_count() >= len(subscriptions))

    ros.wait(lambda: images.get_subscription_count() and tf2_listening(), "the node's image and tf2 /tf subscriptions")

    # The robot's odometry on /tf, as a driver publishes it: odom -> base_link, x = t - 100 s and
    # a yaw of 0.1 rad/s, before and after every image stamp (tf2 interpolates, never extrapolates).
    def odom_base(stamp_s: float) -> np.ndarray:
        yaw = 0.1 * (stamp_s - 100.0)
        pose = np.eye(4)
        pose[:2, :2] = [[math.cos(yaw), -math.sin(yaw)], [math.sin(yaw), math.cos(yaw)]]
        pose[0, 3] = stamp_s - 100.0
        return pose

    for i in range(30):
        stamp_s = 99.9 + 0.05 * i
        robot_tf.publish(tf2_msgs.TFMessage(transforms=[
            transform_stamped(odom_base(stamp_s), stamp_msg(round(stamp_s * 1e9)), "odom", "base_link")]))
    stamps = [100.0 + 0.1 * i for i in range(8)]
    status = _frames(ros, node, images, stamps, 0, 8)
    assert status.tf_rejected == 0 and status.frames_processed >= 5
    frame_stamps = [round(s * 1e9) for s in stamps]
    ros.wait(lambda: len(ros.poses) >= status.frames_processed, "the poses")
    ros.wait(lambda: {stamp_ns(p.header) for p in ros.poses} <= set(_map_odom(transforms)) or None,
             "map -> odom at every pose's stamp")
    published = _map_odom(transforms)
    assert set(published) <= set(frame_stamps)
    # map -> odom composed with the robot's odom -> base_link at that stamp is the node's pose.
    for pose in ros.poses:
        at = stamp_ns(pose.header)
        map_base = checked_transform(pose.pose.position, pose.pose.orientation, "the node's pose")
        map_odom = transform_matrix(published[at])
        np.testing.assert_allclose(map_odom @ odom_base(at * 1e-9), map_base, atol=1e-6)
    ros.wait(lambda: ros.diagnostic("tf") == "publishing map -> odom (map_to_odom)", "/diagnostics: publishing "
             "map -> odom")
    assert "no odometry received" not in _warnings(ros) and "NOT published" not in _warnings(ros)
    interrupt_and_check_exit(ros, node)
