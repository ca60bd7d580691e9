"""The input boundary for stamps and transforms: images' stamps, odometry, /tf and /tf_static,
checked before anything uses them.

One rule per value, one place: a message another node sends is refused here (``Refused`` with
the reason) or turned into a clean T_parent_child [4, 4]. What is refused:
- a non-finite number anywhere in the pose;
- a quaternion that is not near unit length (zero, or off by more than QUATERNION_TOLERANCE:
  that is a bug in the sender, not rounding); a near-unit one is normalised;
- a translation beyond a bound (MAX_ODOMETRY_M for odometry and /tf; for a camera mount
  MAX_MOUNT_M, the camera_mount setting's bound in mapping/settings.py): what a float64 holds is
  not what a robot can be;
- a zero stamp, or one far ahead of the image clock (``ImageClock``): one sample stamped an hour
  ahead would make every later one look too old to the odometry buffer;
- frame ids other than the configured ones (another robot's odometry);
- a camera_info with a non-finite K, a focal length that is not positive or a zero size; for the
  size of its images (``camera_info_image_size``), also a region of interest outside the sensor or
  a binning larger than the size (what size is too large for an image: mapping/warmup_size.py);
- serialized bytes that are not a message of the topic's type (a truncated CDR payload), for the
  inputs read raw (``deserialized``);
- an image with a zero or negative stamp (``nonzero_stamp``; what an image stamp means beside
  that, the stamp rule, is mapping/stamps.py's, shared with the offline tool).
"""
from __future__ import annotations

import math
import threading
import time

import numpy as np
from rclpy.serialization import deserialize_message

from lingbot_ros.mapping.placement.geometry import quaternion_to_rotation
from lingbot_ros.ros import messages

QUATERNION_TOLERANCE = 0.01      # | |q| - 1 | up to this is normalised, beyond it refused
MAX_ODOMETRY_M = 1.0e6           # 1,000 km from the odometry origin


class Refused(ValueError):
    """An input value refused at the boundary; the text says why (for status and diagnostics)."""


def deserialized(data: bytes, msg_type, what: str):
    """Serialized bytes read raw -> the message. Raises Refused naming ``what`` for bytes that do
    not hold one (a truncated or garbled CDR payload from a faulty sender)."""
    try:
        return deserialize_message(data, msg_type)
    except Exception as error:   # rclpy's C deserialiser: RuntimeError, rclpy's own errors, ...
        raise Refused(f"{what}: {len(data)} bytes that do not deserialise as {msg_type.__name__} "
                      f"({type(error).__name__}: {str(error).strip() or 'cannot be deserialised'})") from None


def checked_transform(translation, rotation, what: str, max_translation_m: float = MAX_ODOMETRY_M) -> np.ndarray:
    """geometry_msgs translation/position (x, y, z) and quaternion (x, y, z, w) -> [4, 4] float64.
    Raises Refused naming ``what``."""
    t = (float(translation.x), float(translation.y), float(translation.z))
    q = (float(rotation.x), float(rotation.y), float(rotation.z), float(rotation.w))
    if not all(math.isfinite(v) for v in t + q):
        raise Refused(f"{what}: non-finite values (translation {t}, quaternion {q})")
    norm = math.sqrt(sum(v * v for v in q))
    if abs(norm - 1.0) > QUATERNION_TOLERANCE:
        raise Refused(f"{what}: quaternion {q} has norm {norm:.6g}, not a rotation (must be 1 within "
                      f"{QUATERNION_TOLERANCE})")
    distance = math.sqrt(sum(v * v for v in t))
    if distance > max_translation_m:
        raise Refused(f"{what}: translation {distance:.6g} m beyond the {max_translation_m:g} m bound")
    pose = np.eye(4)
    pose[:3, :3] = quaternion_to_rotation(np.array(q) / norm)
    pose[:3, 3] = t
    return pose


def checked_matrix(pose, what: str, max_translation_m: float) -> np.ndarray:
    """A [4, 4] from a lookup (tf2_ros): finite, a rotation, within the bound. Raises Refused."""
    pose = np.asarray(pose, dtype=np.float64)
    if pose.shape != (4, 4) or not np.isfinite(pose).all():
        raise Refused(f"{what}: non-finite values")
    rotation = pose[:3, :3]
    if not np.allclose(rotation @ rotation.T, np.eye(3), atol=2 * QUATERNION_TOLERANCE):
        raise Refused(f"{what}: not a rotation")
    if np.linalg.norm(pose[:3, 3]) > max_translation_m:
        raise Refused(f"{what}: translation beyond the {max_translation_m:g} m bound")
    return pose


class ImageClock:
    """The image stream's clock: the stamp of the newest image the Mapper took, advanced by the
    wall time since it was received (so that live odometry stays accepted while images pause).
    Only taken frames set it: an image refused, dropped as jitter or held past a stamp jump
    (mapping/stamps.py) would drag it anywhere. Before any image: ``fallback_ns()`` (the node's
    clock). Thread-safe: the worker sets it, side-input callbacks read it."""

    def __init__(self, fallback_ns):
        self._fallback_ns = fallback_ns
        self._lock = threading.Lock()
        self._image: tuple[int, int] | None = None   # (stamp_ns, monotonic_ns at receipt)

    @property
    def has_image(self) -> bool:
        with self._lock:
            return self._image is not None

    def image(self, stamp_ns: int, received_ns: int | None = None) -> None:
        """``received_ns``: time.monotonic_ns() when the image arrived (None: now)."""
        # The newest image wins even when its stamp went back (a looped bag): the clock follows.
        with self._lock:
            self._image = (stamp_ns, time.monotonic_ns() if received_ns is None else received_ns)

    def now_ns(self) -> int:
        with self._lock:
            image = self._image
        if image is None:
            return int(self._fallback_ns())
        return image[0] + (time.monotonic_ns() - image[1])


def nonzero_stamp(stamp, what: str) -> int:
    """builtin_interfaces/Time -> ns; Refused for a zero or negative stamp (an unset header)."""
    stamp_ns = messages.stamp_ns(stamp)
    if stamp_ns <= 0:
        raise Refused(f"{what}: zero stamp (an unset header)" if stamp_ns == 0 else
                      f"{what}: negative stamp ({stamp_ns / 1e9:.3f} s)")
    return stamp_ns


def check_stamp(stamp, clock: ImageClock, max_ahead_s: float, what: str, max_behind_s: float | None = None) -> int:
    """builtin_interfaces/Time -> ns; Refused for a zero stamp, one ``max_ahead_s`` ahead of the
    image clock, or (once an image came) one ``max_behind_s`` behind it: too old for any image
    still to come, and it would pass for a stream that went back."""
    stamp_ns = nonzero_stamp(stamp, what)
    ahead_s = (stamp_ns - clock.now_ns()) / 1e9
    if ahead_s > max_ahead_s:
        raise Refused(f"{what}: stamped {ahead_s:.3f} s ahead of the image clock (max_input_ahead_s="
                      f"{max_ahead_s:g})")
    if max_behind_s is not None and clock.has_image and -ahead_s > max_behind_s:
        raise Refused(f"{what}: stamped {-ahead_s:.3f} s behind the image clock (older than the "
                      f"{max_behind_s:g} s the odometry buffer keeps)")
    return stamp_ns


def check_odometry(msg, odom_frame: str, base_frame: str, clock: ImageClock, max_ahead_s: float,
                   max_behind_s: float | None = None) -> tuple[int, np.ndarray]:
    """nav_msgs/Odometry -> (stamp_ns, T_odom_base). Raises Refused."""
    frame, child = msg.header.frame_id.lstrip("/"), msg.child_frame_id.lstrip("/")
    if frame != odom_frame or child != base_frame:
        raise Refused(f"odometry: frames '{msg.header.frame_id}' -> '{msg.child_frame_id}', expected "
                      f"odom_frame '{odom_frame}' -> base_frame '{base_frame}' (another robot's odometry?)")
    stamp_ns = check_stamp(msg.header.stamp, clock, max_ahead_s, "odometry", max_behind_s)
    pose = checked_transform(msg.pose.pose.position, msg.pose.pose.orientation, "odometry")
    return stamp_ns, pose


def check_camera_info(msg) -> str:
    """sensor_msgs/CameraInfo -> its intrinsics as text (fx fy cx cy, size). Refused for a
    non-finite K, a focal length that is not positive, or a zero size."""
    k = [float(v) for v in msg.k]
    if len(k) != 9 or not all(math.isfinite(v) for v in k):
        raise Refused(f"camera_info: non-finite K {k}")
    if k[0] <= 0 or k[4] <= 0:
        raise Refused(f"camera_info: focal length fx={k[0]:g} fy={k[4]:g} not positive")
    if not msg.width or not msg.height:
        raise Refused(f"camera_info: size {msg.width}x{msg.height}")
    return f"fx={k[0]:.1f} fy={k[4]:.1f} cx={k[2]:.1f} cy={k[5]:.1f} ({msg.width}x{msg.height})"


def camera_info_image_size(msg) -> tuple[int, int]:
    """(width, height) of the images a sensor_msgs/CameraInfo describes (REP 104: its region of
    interest where set, divided by its binning; 0 or 1 = none). Refused as ``check_camera_info``
    refuses, and for a region outside the sensor or a binning larger than the size."""
    check_camera_info(msg)
    width, height = int(msg.width), int(msg.height)
    roi = msg.roi
    if roi.width or roi.height:
        if not (roi.width and roi.height) or roi.x_offset + roi.width > width or roi.y_offset + roi.height > height:
            raise Refused(f"camera_info: region of interest {roi.width}x{roi.height} at ({roi.x_offset}, "
                          f"{roi.y_offset}) is not inside the {width}x{height} sensor")
        width, height = int(roi.width), int(roi.height)
    binning_x, binning_y = max(1, int(msg.binning_x)), max(1, int(msg.binning_y))
    if binning_x > width or binning_y > height:
        raise Refused(f"camera_info: binning {binning_x}x{binning_y} is larger than the {width}x{height} size")
    return width // binning_x, height // binning_y
