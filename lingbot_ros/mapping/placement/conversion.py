"""The one conversion from the model's world to the published ``map`` frame, in two frozen steps.

The model gives camera-to-world poses in OpenCV optical axes (x right, y down, z forward), the
first camera of its stream at the world origin, in model units. ``map`` (REP 105) is the robot
base at the start of the map: x forward, y left, z up, in metres once the metric scale is known.

1. ``Placement``: a stream's model world -> the Mapper's internal frame I (rotation and
   translation only): ``p_I = R @ p_world + t``. For the first stream R is the camera mount's
   rotation (so I has the base's axes) and t is 0; a stream that continues the map starts where
   the previous one ended (``continuing_from``). Aligned windows are warped into window 0's
   world before this step.
2. ``MapConversion``: I -> ``map`` for one stream with the metric scale ``s`` it had then:
   ``p_M = s * (p_I - origin_internal) + origin_map``, ``T_M_base = T_M_camera @ T_camera_base``.
   The first stream's origin_internal is 0 and origin_map the mount's translation; a continuing
   stream's origins are both the camera position it started from, so it is scaled about that.

Every output (poses, points, depth) carries the MapConversion it was made with; a new one is made
whenever the scale estimate or the mount changes, never changed in place.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .metric_scale import MetricScale

R_MAP_FROM_OPTICAL = np.array([[0.0, 0.0, 1.0],
                               [-1.0, 0.0, 0.0],
                               [0.0, -1.0, 0.0]])


@dataclasses.dataclass(frozen=True)
class Placement:
    """Pose of a stream's model world in I: p = rotation @ p_world + translation."""

    rotation: np.ndarray = dataclasses.field(default_factory=lambda: R_MAP_FROM_OPTICAL.copy())
    translation: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(3))

    def camera_pose(self, extrinsic_c2w) -> np.ndarray:
        """Model camera-to-world ``[3, 4]`` / ``[4, 4]`` -> ``[4, 4]`` pose of the optical camera frame."""
        extrinsic = np.asarray(extrinsic_c2w, dtype=np.float64)
        if extrinsic.shape not in ((3, 4), (4, 4)):
            raise ValueError(f"extrinsic must be [3, 4] or [4, 4], got {extrinsic.shape}")
        pose = np.eye(4)
        pose[:3, :3] = self.rotation @ extrinsic[:3, :3]
        pose[:3, 3] = self.rotation @ extrinsic[:3, 3] + self.translation
        return pose

    def points(self, points_world: np.ndarray) -> np.ndarray:
        """``[N, 3]`` model-world points -> the same points in this frame (float32)."""
        points = np.asarray(points_world, dtype=np.float64)
        return (points @ self.rotation.T + self.translation).astype(np.float32)

    @staticmethod
    def continuing_from(camera_pose: np.ndarray) -> "Placement":
        """Placement of a new stream whose first camera is ``camera_pose`` (rotation and
        translation only; the new stream's scale is its own)."""
        return Placement(rotation=camera_pose[:3, :3].copy(), translation=camera_pose[:3, 3].copy())


@dataclasses.dataclass(frozen=True, eq=False)
class MapConversion:
    """I -> ``map`` for one stream at one scale estimate (immutable: compared by identity)."""

    metric: MetricScale
    camera_base: np.ndarray                 # T_camera_base, the inverse of the mount
    origin_internal: np.ndarray             # [3]
    origin_map: np.ndarray                  # [3]
    estimated: bool = False                 # the scale is estimated (scale_source odometry), not given

    @property
    def metric_pending(self) -> bool:
        """A metric scale was asked for and is not known yet: until it is, what this conversion
        gives is in model units (not to be fused, no map -> odom)."""
        return self.estimated and not self.metric.known

    @property
    def scale(self) -> float:
        return self.metric.scale

    @property
    def is_identity(self) -> bool:
        """Positions in I are positions in map (no rounding through the origins then)."""
        return self.scale == 1.0 and np.array_equal(self.origin_internal, self.origin_map)

    def camera_pose(self, internal_pose: np.ndarray) -> np.ndarray:
        """T_I_camera -> T_M_camera."""
        pose = np.array(internal_pose, dtype=np.float64)
        if not self.is_identity:
            pose[:3, 3] = self.scale * (pose[:3, 3] - self.origin_internal) + self.origin_map
        return pose

    def base_pose(self, internal_pose: np.ndarray) -> np.ndarray:
        """T_I_camera -> T_M_base."""
        return self.camera_pose(internal_pose) @ self.camera_base

    def points(self, xyz_internal: np.ndarray) -> np.ndarray:
        """``[N, 3]`` points in I -> in ``map`` (float32)."""
        if self.is_identity:
            return np.asarray(xyz_internal, np.float32).copy()
        xyz = np.asarray(xyz_internal, np.float64)
        return (self.scale * (xyz - self.origin_internal) + self.origin_map).astype(np.float32)

    def with_metric(self, metric: MetricScale) -> "MapConversion":
        return dataclasses.replace(self, metric=metric)
