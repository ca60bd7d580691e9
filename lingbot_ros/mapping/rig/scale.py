"""Each camera's scale against the primary camera's, from their simultaneous base trajectories.

The cameras start together, so every camera's ``map`` is the robot base at the start, and at one
instant every camera puts the base at the same place up to its own scale. Where both maps are in
metres (a metric scale known for both) the ratio is 1. Otherwise it is estimated: each of the
camera's base positions is matched to the primary's at its stamp (interpolated between the
primary's two poses around it, at most MAX_INTERVAL_S apart), and the scale is the ratio of the
two paths' lengths over the matched poses (a ratio of lengths: a small disagreement of the two
maps' axes does not bias it). Until MIN_MATCHED poses are matched and both paths move, it is
unknown (None).
"""
from __future__ import annotations

import numpy as np

from ..store.trajectory import Trajectory
from .records import METRIC, TRAJECTORIES, UNKNOWN, RigScale

MIN_MATCHED = 5
MAX_INTERVAL_S = 1.0
# A path shorter than this (map units) is no motion.
_MIN_PATH = 1e-9


def matched_positions(primary: Trajectory, other: Trajectory, max_interval_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """(primary's base positions at ``other``'s stamps, ``other``'s positions there), [n, 3] each,
    for the stamps the primary's poses bracket (an equal stamp, or two around it close enough)."""
    stamps, times = primary.stamps_ns(), other.stamps_ns()
    if len(stamps) == 0 or len(times) == 0:
        return np.zeros((0, 3)), np.zeros((0, 3))
    order = np.argsort(stamps, kind="stable")
    stamps, positions = stamps[order], primary.poses()[order, :3, 3]
    after = np.searchsorted(stamps, times, side="left")             # first primary stamp >= t
    exact = (after < len(stamps)) & (stamps[np.minimum(after, len(stamps) - 1)] == times)
    inside = (after > 0) & (after < len(stamps))
    lo, hi = np.maximum(after - 1, 0), np.minimum(after, len(stamps) - 1)
    span = stamps[hi] - stamps[lo]
    inside &= span <= max_interval_ns
    keep = exact | inside
    lo, hi, span = lo[keep], hi[keep], span[keep]
    weight = np.where(exact[keep], 1.0, (times[keep] - stamps[lo]) / np.maximum(span, 1))[:, None]
    at = np.where(exact[keep][:, None], positions[hi], (1 - weight) * positions[lo] + weight * positions[hi])
    return at, other.poses()[keep, :3, 3]


def trajectory_scale(primary: Trajectory, other: Trajectory, max_interval_s: float = MAX_INTERVAL_S) -> RigScale:
    """The camera of ``other`` against the primary of ``primary`` (both T_map_base, oldest first)."""
    at_primary, at_other = matched_positions(primary, other, int(max_interval_s * 1e9))
    n = len(at_other)
    if n < MIN_MATCHED:
        return RigScale(None, UNKNOWN, f"not known yet: {n} of the {MIN_MATCHED} base poses it needs matched "
                                       "to the primary camera's by stamp", n)
    length_primary = float(np.linalg.norm(np.diff(at_primary, axis=0), axis=1).sum())
    length_other = float(np.linalg.norm(np.diff(at_other, axis=0), axis=1).sum())
    if not (length_primary > _MIN_PATH and length_other > _MIN_PATH):
        return RigScale(None, UNKNOWN, f"not known yet: no motion over the {n} matched base poses", n)
    value = length_primary / length_other
    return RigScale(value, TRAJECTORIES, f"{value:.4g} from {n} base poses matched by stamp (paths "
                                         f"{length_primary:.4g} and {length_other:.4g})", n)


def metric_scale() -> RigScale:
    return RigScale(1.0, METRIC, "1: both maps in metres")
