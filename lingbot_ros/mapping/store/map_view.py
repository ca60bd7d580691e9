"""What a live view draws of the map: an even sample of its points, the camera path, the newest camera.

A view is bounded whatever the map's size: at most ``point_budget`` points and ``pose_budget``
camera positions, each an even sample (every k-th voxel in key order, every k-th pose, the newest
kept), so that reading it costs the sample, not the map. Reading never changes the map (unlike
``Mapper.map_points``, which merges the held keyframe for good).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..placement.geometry import rigid_inverse
from ..database.readback import conversion as readback_conversion, setting as readback_setting
from .points import to_numpy


@dataclasses.dataclass(frozen=True)
class ViewCamera:
    """A camera to draw: T_map_camera (optical axes) and, where known, its field of view."""

    pose: np.ndarray                 # [4, 4]
    fov_y: float | None = None       # radians; None: intrinsics unknown (drawn as axes)
    aspect: float = 4.0 / 3.0        # width / height

    @staticmethod
    def of_output(output) -> "ViewCamera":
        """A MapperOutput's camera, its field of view from the model's intrinsics (at the model
        input size: the same angle as at the image's)."""
        k = to_numpy(output.result.intrinsic)
        height, width = output.result.depth.shape[-2:]
        return ViewCamera(output.camera_pose, 2.0 * math.atan2(height / 2.0, float(k[1, 1])), width / height)


@dataclasses.dataclass(frozen=True)
class MapView:
    xyz: np.ndarray                  # [n, 3] float32 in map, n <= point_budget
    rgb: np.ndarray                  # [n, 3] uint8
    map_points: int                  # points of the map the sample is drawn from
    camera_positions: np.ndarray     # [m, 3] float64 in map, oldest first, m <= pose_budget
    poses: int                       # poses of the trajectory the path is drawn from
    camera: ViewCamera | None = None   # the newest camera
    units: str = "model units"
    voxel_size: float = 0.05         # the map's voxel pitch in map units (the points' drawn size)


def stride(total: int, budget: int) -> int:
    """The k of 'every k-th' that leaves at most ``budget`` of ``total`` (at least 1)."""
    return max(1, -(-total // max(budget, 1)))


def sample_path(positions: np.ndarray, budget: int) -> np.ndarray:
    """At most ``budget`` of ``positions`` [m, 3], evenly, the newest always among them."""
    every = stride(len(positions), budget)
    if every == 1:
        return positions
    return positions[::-1][::every][::-1]   # counted back from the newest


def share(counts: list[int], budget: int) -> list[int]:
    """Split ``budget`` over parts of ``counts`` points in proportion to their sizes."""
    total = sum(counts)
    if total <= budget:
        return list(counts)
    return [count * budget // total for count in counts]


def stored_view(stored, point_budget: int, pose_budget: int) -> MapView:
    """A stored run's view (map_readback.StoredRun). The database keeps no intrinsics: the newest
    camera comes without a field of view."""
    every = stride(len(stored.xyz), point_budget)
    camera = None
    if len(stored.trajectory):
        camera_base = readback_conversion(stored.info).camera_base   # T_camera_base
        camera = ViewCamera(stored.trajectory[-1].pose @ rigid_inverse(camera_base))
    return MapView(stored.xyz[::every], stored.rgb[::every], len(stored.xyz),
                   sample_path(stored.camera_positions, pose_budget), len(stored.camera_positions), camera,
                   "m" if stored.info.scale_known else "model units", readback_setting(stored.info, "map_voxel_size_m"))
