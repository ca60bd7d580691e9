"""Pose math in numpy, for every frame conversion: rigid inverses, the camera mount's
'x y z roll pitch yaw', rotation <-> quaternion (scalar-last, as ROS messages and TUM files hold it).
"""
from __future__ import annotations

import math

import numpy as np

def rigid_inverse(pose: np.ndarray) -> np.ndarray:
    """Inverse of a rigid [4, 4] transform: rotation R^T, translation -R^T t."""
    rotation_t = pose[:3, :3].T
    result = np.eye(4)
    result[:3, :3] = rotation_t
    result[:3, 3] = -rotation_t @ pose[:3, 3]
    return result


def pose_from_xyz_rpy(x, y, z, roll, pitch, yaw) -> np.ndarray:
    """4x4 from a translation and roll-pitch-yaw (fixed axes x, y, z: R = Rz(yaw) Ry(pitch) Rx(roll))."""
    cr, sr, cp, sp, cy, sy = (math.cos(roll), math.sin(roll), math.cos(pitch), math.sin(pitch),
                              math.cos(yaw), math.sin(yaw))
    pose = np.eye(4)
    pose[:3, :3] = [[cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
                    [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
                    [-sp, cp * sr, cp * cr]]
    pose[:3, 3] = (x, y, z)
    return pose


def parse_mount(text: str) -> np.ndarray:
    """'x y z roll pitch yaw' (metres, radians) -> T_base_camera."""
    return pose_from_xyz_rpy(*(float(v) for v in text.split()))


def rotation_to_quaternion(rotation: np.ndarray) -> np.ndarray:
    """Rotation matrix ``[3, 3]`` -> unit quaternion ``[4]`` scalar-last ``(x, y, z, w)``, w >= 0.

    Shepperd's method: the square root is taken of the largest of ``w, x, y, z`` (squared, up to
    a factor), so no division by a value near zero happens, including rotations by about 180
    degrees where ``trace`` is near -1.
    """
    m = np.asarray(rotation, dtype=np.float64)
    if m.shape != (3, 3):
        raise ValueError(f"rotation must be [3, 3], got shape {m.shape}")
    trace = m[0, 0] + m[1, 1] + m[2, 2]
    candidates = (trace, m[0, 0], m[1, 1], m[2, 2])  # 4w^2-1, 4x^2-1, ... up to the same offset
    largest = int(np.argmax(candidates))
    if largest == 0:
        w = 0.5 * np.sqrt(max(1.0 + trace, 0.0))
        s = 0.25 / w
        q = ((m[2, 1] - m[1, 2]) * s, (m[0, 2] - m[2, 0]) * s, (m[1, 0] - m[0, 1]) * s, w)
    elif largest == 1:
        x = 0.5 * np.sqrt(max(1.0 + m[0, 0] - m[1, 1] - m[2, 2], 0.0))
        s = 0.25 / x
        q = (x, (m[0, 1] + m[1, 0]) * s, (m[0, 2] + m[2, 0]) * s, (m[2, 1] - m[1, 2]) * s)
    elif largest == 2:
        y = 0.5 * np.sqrt(max(1.0 - m[0, 0] + m[1, 1] - m[2, 2], 0.0))
        s = 0.25 / y
        q = ((m[0, 1] + m[1, 0]) * s, y, (m[1, 2] + m[2, 1]) * s, (m[0, 2] - m[2, 0]) * s)
    else:
        z = 0.5 * np.sqrt(max(1.0 - m[0, 0] - m[1, 1] + m[2, 2], 0.0))
        s = 0.25 / z
        q = ((m[0, 2] + m[2, 0]) * s, (m[1, 2] + m[2, 1]) * s, z, (m[1, 0] - m[0, 1]) * s)
    quat = np.array(q, dtype=np.float64)
    quat /= np.linalg.norm(quat)  # absorbs small non-orthogonality of the input
    return -quat if quat[3] < 0 else quat


def quaternion_to_rotation(quat_xyzw: np.ndarray) -> np.ndarray:
    """Quaternion ``[4]`` scalar-last ``(x, y, z, w)``, any non-zero norm -> rotation ``[3, 3]``.

    The formula of spec section 12 with ``s = 2 / |q|^2``, so the result is a proper rotation
    even for a non-normalised quaternion.
    """
    x, y, z, w = np.asarray(quat_xyzw, dtype=np.float64)
    norm_sq = x * x + y * y + z * z + w * w
    if norm_sq == 0:
        raise ValueError("quaternion has zero norm")
    s = 2.0 / norm_sq
    return np.array([
        [1 - s * (y * y + z * z), s * (x * y - z * w), s * (x * z + y * w)],
        [s * (x * y + z * w), 1 - s * (x * x + z * z), s * (y * z - x * w)],
        [s * (x * z - y * w), s * (y * z + x * w), 1 - s * (x * x + y * y)],
    ])
