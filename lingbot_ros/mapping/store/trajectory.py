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
