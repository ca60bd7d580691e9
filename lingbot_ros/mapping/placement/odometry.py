"""The robot's own odometry (stamped ``T_odom_base`` poses), looked up at image stamps.

Samples come from a ROS callback thread (nav_msgs/Odometry or TF ``odom -> base``, converted by
the caller) while the mapping worker reads them, so every method holds the buffer's one lock.
Between two samples a pose is interpolated: translation linearly, rotation by slerp.

    samples:     s0 ---- s1 ---- s2 ---- s3             (sorted by stamp)
    at(stamp):  |<-tol->|                      |<-tol->|
                 held     interpolated between   held     (None further out, or across a gap)
"""
from __future__ import annotations

import bisect
import threading

import numpy as np

from ..stamps import ns_from_seconds
from .geometry import quaternion_to_rotation, rotation_to_quaternion

# Quaternions closer than this (cosine of half the angle between them) are blended linearly:
# slerp divides by sin(angle), which vanishes there, and the two differ by at most 1e-6 rad.
_SLERP_LINEAR_DOT = 0.9995
# How far behind the newest sample the buffer keeps samples (the default ``max_age_s``).
MAX_AGE_S = 10.0


class OdometryBuffer:
    """Stamped robot poses ``T_odom_base`` ([4, 4] float64), kept sorted by stamp.

    ``max_age_s``: samples older than the newest by more than this are dropped, and a new sample
    that old is ignored. Look-ups come at image stamps, behind the newest odometry by the worker's
    backlog (inference, a queue with ``process_all_frames``): 10 s leaves room for that.
    ``max_samples``: the count bound (12,000: odometry at 1 kHz over the 10 s, with room).
    ``max_extrapolation_s``: ``at`` holds the nearest sample for a stamp up to this far from it
    where it cannot interpolate (before the first, after the newest, or inside a gap): the image
    and odometry stamps of one instant differ by a few milliseconds of driver latency.
    ``max_gap_s``: ``at`` does not interpolate between samples further apart than this (an
    odometry dropout: a straight line across it would invent the motion).
    A stream that goes back (a looped bag, a clock jump back) is told by ``add(...,
    went_back_ok=True)``; without it older stamps are ignored.
    """

    def __init__(self, max_age_s: float = MAX_AGE_S, max_samples: int = 12_000,
                 max_extrapolation_s: float = 0.05, max_gap_s: float = 0.5):
        for name, value in (("max_age_s", max_age_s), ("max_gap_s", max_gap_s)):
            if not (np.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value}")
        if not (np.isfinite(max_extrapolation_s) and max_extrapolation_s >= 0):
            raise ValueError(f"max_extrapolation_s must be finite and >= 0, got {max_extrapolation_s}")
        if max_samples < 2:
            raise ValueError(f"max_samples must be >= 2 (interpolation needs two), got {max_samples}")
        self.max_samples = int(max_samples)
        self.max_age_s = float(max_age_s)
        self._max_age_ns = ns_from_seconds(max_age_s)
        self._max_extrapolation_ns = ns_from_seconds(max_extrapolation_s)
        self._max_gap_ns = ns_from_seconds(max_gap_s)
        self._lock = threading.Lock()
        self._stamps: list[int] = []          # sorted, unique
        self._poses: list[np.ndarray] = []    # [4, 4] each, never mutated once stored

    def add(self, stamp_ns: int, pose: np.ndarray, went_back_ok: bool = False) -> bool:
        """Store ``pose`` (``T_odom_base`` [4, 4]) at ``stamp_ns``; False when it is ignored (a
        stamp already held, or one older than the newest by more than ``max_age_s``). With
        ``went_back_ok`` (the caller checked the stamp against the image clock) such an old one
        means the stream went back: the samples held go and it is stored."""
        stamp_ns = int(stamp_ns)
        pose = _checked_pose(pose)
        with self._lock:
            if self._stamps and stamp_ns < self._stamps[-1] - self._max_age_ns:
                if not went_back_ok:
                    return False
                self._stamps.clear()
                self._poses.clear()
            at = bisect.bisect_left(self._stamps, stamp_ns)
            if at < len(self._stamps) and self._stamps[at] == stamp_ns:
                return False
            self._stamps.insert(at, stamp_ns)
            self._poses.insert(at, pose)
            cut = max(bisect.bisect_left(self._stamps, self._stamps[-1] - self._max_age_ns),
                      len(self._stamps) - self.max_samples)
            if cut > 0:
                del self._stamps[:cut], self._poses[:cut]
            return True

    def at(self, stamp_ns: int) -> np.ndarray | None:
        """``T_odom_base`` [4, 4] at ``stamp_ns`` (a new array), or None where it is not known."""
        stamp_ns = int(stamp_ns)
        with self._lock:
            count = len(self._stamps)
            after = bisect.bisect_left(self._stamps, stamp_ns)
            if after < count and self._stamps[after] == stamp_ns:
                return self._poses[after].copy()
            neighbours = [(self._stamps[i], self._poses[i]) for i in (after - 1, after) if 0 <= i < count]
        if len(neighbours) == 2 and neighbours[1][0] - neighbours[0][0] <= self._max_gap_ns:
            (stamp0, pose0), (stamp1, pose1) = neighbours
            return interpolate_pose(pose0, pose1, (stamp_ns - stamp0) / (stamp1 - stamp0))
        for stamp, pose in sorted(neighbours, key=lambda n: abs(n[0] - stamp_ns)):
            if abs(stamp - stamp_ns) <= self._max_extrapolation_ns:
                return pose.copy()
        return None

    def samples_since(self, stamp_ns: int) -> tuple[np.ndarray, np.ndarray]:
        """The samples a look-up at ``stamp_ns`` or later may read (one gap's worth before it):
        stamps int64 [N] and poses float64 [N, 4, 4] (a resumed run's buffer starts with them)."""
        with self._lock:
            first = bisect.bisect_left(self._stamps, stamp_ns - self._max_gap_ns)
            stamps, poses = self._stamps[first:], self._poses[first:]
        return np.array(stamps, np.int64), np.array(poses, np.float64).reshape(-1, 4, 4)

    def __len__(self) -> int:
        with self._lock:
            return len(self._stamps)


def interpolate_pose(pose0: np.ndarray, pose1: np.ndarray, fraction: float) -> np.ndarray:
    """The pose ``fraction`` of the way from ``pose0`` to ``pose1`` ([4, 4] each, fraction in
    [0, 1]): translation linear, rotation along the shorter great arc (slerp)."""
    q0 = rotation_to_quaternion(pose0[:3, :3])
    q1 = rotation_to_quaternion(pose1[:3, :3])
    dot = float(q0 @ q1)
    if dot < 0:   # q and -q are one rotation: take the one on q0's side, the shorter way round
        q1, dot = -q1, -dot
    if dot > _SLERP_LINEAR_DOT:
        quat = q0 + fraction * (q1 - q0)
    else:
        angle = np.arccos(dot)
        quat = (np.sin((1 - fraction) * angle) * q0 + np.sin(fraction * angle) * q1) / np.sin(angle)
    out = np.eye(4)
    out[:3, :3] = quaternion_to_rotation(quat)
    out[:3, 3] = (1 - fraction) * pose0[:3, 3] + fraction * pose1[:3, 3]
    return out


def _checked_pose(pose) -> np.ndarray:
    pose = np.array(pose, dtype=np.float64)   # a copy: the caller may reuse its array
    if pose.shape != (4, 4):
        raise ValueError(f"odometry pose must be [4, 4] T_odom_base, got shape {pose.shape}")
    if not np.isfinite(pose).all():
        raise ValueError("odometry pose has non-finite values; drop the sample before add()")
    return pose
