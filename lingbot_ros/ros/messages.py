"""Message conversions: the node's output messages (each built with its input image's stamp), TF's
transforms and the TFMessage type, stamps.

Transforms are 4x4 float64 matrices named ``T_parent_child`` in prose: the pose of ``child`` in
``parent``, which maps points from ``child`` coordinates into ``parent`` coordinates (what a
TransformStamped with header.frame_id = parent, child_frame_id = child carries, and what tf2's
``lookup_transform(target_frame=parent, source_frame=child)`` returns).
"""
from __future__ import annotations

import struct

import numpy as np
from builtin_interfaces.msg import Time
from geometry_msgs.msg import Pose, PoseStamped, TransformStamped
from nav_msgs.msg import Odometry
from sensor_msgs.msg import CameraInfo, PointCloud2, PointField
from std_msgs.msg import Header

from lingbot_ros.mapping.placement.geometry import rotation_to_quaternion

TF_TOPIC = "/tf"
TF_STATIC_TOPIC = "/tf_static"

# Odometry covariance convention (diagonal of pose.covariance, row-major 6x6: x y z rx ry rz).
# The model reports no calibrated uncertainty, so the value only tells consumers how far to trust
# a pose: tracking = the `odom_variance` parameter; the first poses of a stream (the scale-frame
# batch, and the first pose after a restart) = UNTRUSTED_VARIANCE, i.e. "do not fuse".
UNTRUSTED_VARIANCE = 1.0e6
# Velocity is not estimated. nav_msgs has no "unknown" flag (sensor_msgs' covariance[0] = -1 is for
# Imu/NavSatFix; robot_localization reads an Odometry covariance as variances), so the zero twist
# carries UNTRUSTED_VARIANCE on its diagonal: a filter configured to fuse it gives it no weight.

# PointCloud2 layout: x, y, z float32 and rgb packed as 0x00RRGGBB in a float32 field (RViz's
# convention), 16 bytes per point.
POINT_DTYPE = np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("rgb", "<u4")])
POINT_FIELDS = [PointField(name=name, offset=4 * i, datatype=PointField.FLOAT32, count=1)
                for i, name in enumerate(("x", "y", "z", "rgb"))]


def make_header(stamp, frame_id: str) -> Header:
    return Header(stamp=stamp, frame_id=frame_id)


def stamp_ns(stamp) -> int:
    """builtin_interfaces/Time -> integer nanoseconds: the one conversion of a ROS stamp on its way
    into the ROS-free layers, which hold stamps as integer nanoseconds only."""
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def stamp_msg(stamp_ns: int) -> Time:
    """Integer nanoseconds -> builtin_interfaces/Time, exactly (an output carries its image's stamp)."""
    sec, nanosec = divmod(stamp_ns, 1_000_000_000)
    return Time(sec=sec, nanosec=nanosec)


def pose_from_matrix(pose_4x4: np.ndarray) -> Pose:
    msg = Pose()
    msg.position.x, msg.position.y, msg.position.z = (float(v) for v in pose_4x4[:3, 3])
    (msg.orientation.x, msg.orientation.y, msg.orientation.z,
     msg.orientation.w) = (float(v) for v in rotation_to_quaternion(pose_4x4[:3, :3]))
    return msg


def pose_stamped(pose_4x4: np.ndarray, stamp, frame_id: str) -> PoseStamped:
    return PoseStamped(header=make_header(stamp, frame_id), pose=pose_from_matrix(pose_4x4))


def odometry(pose_4x4: np.ndarray, stamp, frame_id: str, child_frame_id: str,
             variance: float) -> Odometry:
    msg = Odometry(header=make_header(stamp, frame_id), child_frame_id=child_frame_id)
    msg.pose.pose = pose_from_matrix(pose_4x4)
    covariance = np.zeros(36)
    covariance[::7] = variance
    msg.pose.covariance = covariance.tolist()
    twist_covariance = np.zeros(36)
    twist_covariance[::7] = UNTRUSTED_VARIANCE
    msg.twist.covariance = twist_covariance.tolist()
    return msg


def pack_points(points_xyz: np.ndarray, colors_rgb: np.ndarray) -> np.ndarray:
    """``[N, 3]`` float points and ``[N, 3]`` uint8 RGB -> structured ``[N]`` POINT_DTYPE array."""
    if points_xyz.shape != colors_rgb.shape or points_xyz.ndim != 2 or points_xyz.shape[1] != 3:
        raise ValueError(f"points {points_xyz.shape} and colors {colors_rgb.shape} must both be [N, 3]")
    packed = np.empty(points_xyz.shape[0], POINT_DTYPE)
    packed["x"], packed["y"], packed["z"] = points_xyz[:, 0], points_xyz[:, 1], points_xyz[:, 2]
    rgb = colors_rgb.astype(np.uint32)
    packed["rgb"] = (rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2]
    return packed


def point_cloud(points_xyz: np.ndarray, colors_rgb: np.ndarray, stamp, frame_id: str) -> PointCloud2:
    """Unordered coloured cloud (height 1). Data goes in as bytes (ndarray assignment is slow)."""
    packed = pack_points(points_xyz, colors_rgb)
    return PointCloud2(header=make_header(stamp, frame_id), height=1, width=int(packed.size),
                       fields=POINT_FIELDS, is_bigendian=False, point_step=POINT_DTYPE.itemsize,
                       row_step=POINT_DTYPE.itemsize * int(packed.size), data=packed.tobytes(),
                       is_dense=True)


def camera_info(intrinsic_3x3: np.ndarray, width: int, height: int, stamp, frame_id: str) -> CameraInfo:
    """Pinhole CameraInfo without distortion (the model's intrinsics at its output resolution)."""
    k = np.asarray(intrinsic_3x3, dtype=np.float64)
    msg = CameraInfo(header=make_header(stamp, frame_id), width=int(width), height=int(height),
                     distortion_model="plumb_bob")
    msg.d = [0.0] * 5
    msg.k = k.reshape(-1).tolist()
    msg.r = np.eye(3).reshape(-1).tolist()
    projection = np.zeros((3, 4))
    projection[:, :3] = k
    msg.p = projection.reshape(-1).tolist()
    return msg


def header_stamp_ns(serialized: bytes) -> int | None:
    """The header stamp of a serialized message that starts with a std_msgs/Header (CDR: a 4-byte
    encapsulation whose second byte is 1 for little endian, then stamp.sec int32, stamp.nanosec
    uint32), read without deserialising it; None when the bytes are too short to hold one."""
    if len(serialized) < 12:
        return None
    sec, nanosec = struct.unpack_from("<iI" if serialized[1] == 1 else ">iI", serialized, 4)
    return sec * 1_000_000_000 + nanosec


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
