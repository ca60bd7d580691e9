"""The one conversion from the model's optical world to the published ``map`` frame.

The model gives camera-to-world poses in OpenCV optical axes (x right, y down, z forward), with
the first camera of its stream as the world origin. ROS (REP 103) wants body-style axes: x
forward, y left, z up. The ``map`` frame is the first camera's optical frame rotated into REP 103
axes, so "forward" at the start is +x and "up" is +z:

    map_x = optical_z,   map_y = -optical_x,   map_z = -optical_y     (R_MAP_FROM_OPTICAL)

The published camera pose is that of the camera's *optical* frame (the image's frame_id, by the
usual ``*_optical_frame`` convention) expressed in ``map``. At the start of the first stream it
is therefore not the identity but R_MAP_FROM_OPTICAL itself (the optical axes seen from map).

A stream that is not the first (a restart that continues the map, a window of the windowed
long-run policy) has its own model world. ``Placement`` is the map pose of that world: a
similarity ``p_map = scale * R @ p_world + t`` (scale 1 except for aligned windows). Every pose
and point leaves the mapping layer through ``Placement.camera_pose`` / ``Placement.points``.
"""
from __future__ import annotations

import dataclasses

import numpy as np

R_MAP_FROM_OPTICAL = np.array([[0.0, 0.0, 1.0],
                               [-1.0, 0.0, 0.0],
                               [0.0, -1.0, 0.0]])


@dataclasses.dataclass(frozen=True)
class Placement:
    """Map pose of a stream's model world: p_map = scale * rotation @ p_world + translation."""

    rotation: np.ndarray = dataclasses.field(default_factory=lambda: R_MAP_FROM_OPTICAL.copy())
    translation: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(3))
    scale: float = 1.0

    def matrix(self) -> np.ndarray:
        """``[4, 4]`` ``[scale * R, t; 0 0 0 1]``."""
        m = np.eye(4)
        m[:3, :3] = self.scale * self.rotation
        m[:3, 3] = self.translation
        return m

    def camera_pose(self, extrinsic_c2w) -> np.ndarray:
        """Model camera-to-world ``[3, 4]`` / ``[4, 4]`` -> ``[4, 4]`` T_map_camera (optical camera
        frame; a rigid transform: the scale moves the centre, not the axes)."""
        extrinsic = np.asarray(extrinsic_c2w, dtype=np.float64)
        if extrinsic.shape not in ((3, 4), (4, 4)):
            raise ValueError(f"extrinsic must be [3, 4] or [4, 4], got {extrinsic.shape}")
        pose = np.eye(4)
        pose[:3, :3] = self.rotation @ extrinsic[:3, :3]
        pose[:3, 3] = self.scale * self.rotation @ extrinsic[:3, 3] + self.translation
        return pose

    def points(self, points_world: np.ndarray) -> np.ndarray:
        """``[N, 3]`` model-world points -> the same points in ``map`` (float32)."""
        points = np.asarray(points_world, dtype=np.float64)
        return (points @ (self.scale * self.rotation).T + self.translation).astype(np.float32)

    def continuing_from(self, camera_pose_map: np.ndarray) -> "Placement":
        """Placement of a new stream whose first camera is ``camera_pose_map`` (T_map_camera):
        a restart that continues the map from the last pose (rotation and translation only; the
        new stream's scale is its own)."""
        return Placement(rotation=camera_pose_map[:3, :3].copy(), translation=camera_pose_map[:3, 3].copy())
