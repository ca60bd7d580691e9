"""Trajectories (stamped rigid poses, by key) and rotation <-> quaternion conversion."""
from __future__ import annotations

import itertools
import operator
from collections import deque
from typing import Iterator, NamedTuple

import numpy as np


class StampedPose(NamedTuple):
    stamp_ns: int     # the image's stamp, integer nanoseconds (seconds only in files and texts)
    pose: np.ndarray  # [4, 4] float64 pose of a body in the trajectory's frame (MapStore: camera in I, base in map)
    key: int = -1     # the caller's id of the pose (the Mapper's frame index), for remove/replace


class Trajectory:
    """Stamped poses in arrival order.

    With ``max_length`` set, only the newest ``max_length`` poses are kept (oldest dropped first).
    ``remove`` and ``replace`` look a key up from the newest end: they serve the last few poses
    (a rolled-back frame, a windowed run's overlap), not random access.
    """

    def __init__(self, max_length: int | None = None):
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be >= 1 or None, got {max_length}")
        self.max_length = max_length
        self._poses: deque[StampedPose] = deque(maxlen=max_length)

    def append(self, stamp_ns: int, pose: np.ndarray, key: int = -1) -> None:
        """Add a pose: ``[3, 4]`` or ``[4, 4]`` ``[R | t]`` of the body in the trajectory's frame."""
        self._poses.append(StampedPose(operator.index(stamp_ns), _full(pose), key))

    def remove(self, key: int) -> bool:
        """Drop the pose with ``key``; False if it is not (or no longer) held."""
        at = self._find(key)
        if at is None:
            return False
        del self._poses[at]
        return True

    def replace(self, key: int, pose: np.ndarray) -> bool:
        """Give the pose with ``key`` a new value (same stamp); False if it is not held."""
        at = self._find(key)
        if at is None:
            return False
        old = self._poses[at]
        self._poses[at] = StampedPose(old.stamp_ns, _full(pose), key)
        return True

    def newest(self, count: int) -> list[StampedPose]:
        """The newest ``count`` poses, oldest first."""
        return list(itertools.islice(reversed(self._poses), count))[::-1]

    def _find(self, key: int) -> int | None:
        for offset, pose in enumerate(reversed(self._poses)):
            if pose.key == key:
                return len(self._poses) - 1 - offset
        return None

    def clear(self) -> None:
        self._poses.clear()

    def __len__(self) -> int:
        return len(self._poses)

    def __iter__(self) -> Iterator[StampedPose]:
        return iter(self._poses)

    def __reversed__(self) -> Iterator[StampedPose]:
        return reversed(self._poses)

    def __getitem__(self, index: int) -> StampedPose:
        return self._poses[index]

    def stamps_ns(self) -> np.ndarray:
        """``[N]`` int64 stamps in nanoseconds."""
        return np.array([p.stamp_ns for p in self._poses], dtype=np.int64)

    def poses(self) -> np.ndarray:
        """``[N, 4, 4]`` float64 poses."""
        return np.array([p.pose for p in self._poses], dtype=np.float64).reshape(-1, 4, 4)


def _full(pose) -> np.ndarray:
    pose = np.asarray(pose, dtype=np.float64)
    if pose.shape not in ((3, 4), (4, 4)):
        raise ValueError(f"a pose must be [3, 4] or [4, 4], got shape {pose.shape}")
    full = np.eye(4)
    full[:3, :] = pose[:3, :]
    return full


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
