"""TF plumbing shared by the TF modules: the TFMessage type, tf2's QoS, 4x4 <-> TransformStamped.

Transforms are 4x4 float64 matrices named ``T_parent_child`` in prose: the pose of ``child`` in
``parent``, which maps points from ``child`` coordinates into ``parent`` coordinates (what a
TransformStamped with header.frame_id = parent, child_frame_id = child carries, and what tf2's
``lookup_transform(target_frame=parent, source_frame=child)`` returns).
"""
from __future__ import annotations

import numpy as np

from geometry_msgs.msg import TransformStamped
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from lingbot_ros.mapping import quaternion_to_rotation, rotation_to_quaternion

TF_TOPIC = "/tf"
TF_STATIC_TOPIC = "/tf_static"
# tf2's own QoS: /tf as its TransformBroadcaster publishes it; /tf_static as its listener reads it,
# which matches the (latched) static broadcasters, so a robot's URDF frames published before the
# node started still arrive.
TF_QOS = QoSProfile(reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE,
                    history=HistoryPolicy.KEEP_LAST, depth=100)
TF_STATIC_QOS = QoSProfile(reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                           history=HistoryPolicy.KEEP_LAST, depth=100)


class TfUnavailable(RuntimeError):
    """TF cannot work in this install (tf2_msgs, or tf2_ros where it is required, is missing)."""


def tf_message_type():
    """tf2_msgs/msg/TFMessage; raises TfUnavailable saying how to get it."""
    try:
        from tf2_msgs.msg import TFMessage
    except ImportError as error:
        raise TfUnavailable(
            "tf2_msgs is not importable (it is not on PyPI): source a ROS distro, or run "
            "scripts/setup.sh, which generates it into the venv (scripts/build_interfaces.sh)") from error
    return TFMessage


def transform_stamped(pose: np.ndarray, stamp, parent: str, child: str) -> TransformStamped:
    """``pose`` = T_parent_child [4, 4] -> a TransformStamped parent -> child at ``stamp``."""
    msg = TransformStamped()
    msg.header.stamp, msg.header.frame_id, msg.child_frame_id = stamp, parent, child
    translation, rotation = msg.transform.translation, msg.transform.rotation
    translation.x, translation.y, translation.z = (float(v) for v in pose[:3, 3])
    rotation.x, rotation.y, rotation.z, rotation.w = (float(v) for v in rotation_to_quaternion(pose[:3, :3]))
    return msg


def transform_matrix(transform) -> np.ndarray:
    """geometry_msgs/Transform -> [4, 4] float64 (the rotation re-normalised by the conversion)."""
    t, q = transform.translation, transform.rotation
    pose = np.eye(4)
    pose[:3, :3] = quaternion_to_rotation(np.array([q.x, q.y, q.z, q.w]))
    pose[:3, 3] = [t.x, t.y, t.z]
    return pose
