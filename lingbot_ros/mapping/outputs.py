"""A session result placed: the frame's pose in the internal frame and in ``map``, checked.

Whatever the cause, a pose or depth that is not finite (or would not stay so as the float32 the
outputs are published in) is a counted failure: never published, placed or saved.
"""
from __future__ import annotations

import math

import numpy as np

from .records import MapperOutput
from .windows.live import Pending

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _finite_float32(value: float) -> bool:
    """``value`` is finite and stays so as the float32 the outputs are published in."""
    return math.isfinite(value) and abs(value) <= _FLOAT32_MAX


def output_of(stream, pending: Pending, result, is_keyframe: bool, trusted: bool, final: bool) -> MapperOutput:
    """``result`` of ``pending`` in ``stream`` (a StreamState) as a MapperOutput; FloatingPointError
    where a value is not finite."""
    extrinsic, extremes = result.host_extrinsic()   # one copy: the pose and the outputs' checks
    internal = stream.placement.camera_pose(extrinsic)
    conversion = stream.frames.conversion
    camera_pose, base_pose = conversion.camera_pose(internal), conversion.base_pose(internal)
    if not (np.isfinite(camera_pose).all() and np.isfinite(base_pose).all()):
        raise FloatingPointError(f"non-finite pose for frame {pending.index}")
    intrinsic, depth, points = (float(v) for v in extremes)
    # Depth and points are published in map units (float32): scaled, they must stay finite too.
    if not (math.isfinite(intrinsic) and _finite_float32(depth * conversion.scale)
            and _finite_float32(points * conversion.scale)):
        raise FloatingPointError(f"non-finite depth, intrinsics or points for frame {pending.index} (largest "
                                 f"|value|: intrinsic {intrinsic:g}, depth {depth:g}, points {points:g}, "
                                 f"at scale {conversion.scale:g})")
    return MapperOutput(frame=pending.frame, index=pending.index, camera_pose=camera_pose,
                        base_pose=base_pose, internal_pose=internal, trusted=trusted,
                        is_keyframe=is_keyframe, provisional=not final, placement=stream.placement,
                        result=result, conversion=conversion)
