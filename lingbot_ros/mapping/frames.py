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
long-run policy) has its own model world. ``Placement`` is the pose of that world in the
Mapper's internal frame, ``p = R @ p_world + t`` (aligned windows are warped into window 0's
world first; the metric scale and the camera mount come after, in robot.py).
"""
from __future__ import annotations

import dataclasses

import numpy as np

R_MAP_FROM_OPTICAL = np.array([[0.0, 0.0, 1.0],
                               [-1.0, 0.0, 0.0],
                               [0.0, -1.0, 0.0]])


@dataclasses.dataclass(frozen=True)
class Placement:
    """Pose of a stream's model world: p = rotation @ p_world + translation."""

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

    def continuing_from(self, camera_pose_map: np.ndarray) -> "Placement":
        """Placement of a new stream whose first camera is ``camera_pose_map`` (T_map_camera):
        a restart that continues the map from the last pose (rotation and translation only; the
        new stream's scale is its own)."""
        return Placement(rotation=camera_pose_map[:3, :3].copy(), translation=camera_pose_map[:3, 3].copy())


def rigid_inverse(pose: np.ndarray) -> np.ndarray:
    """Inverse of a rigid [4, 4] transform: rotation R^T, translation -R^T t."""
    rotation_t = pose[:3, :3].T
    result = np.eye(4)
    result[:3, :3] = rotation_t
    result[:3, 3] = -rotation_t @ pose[:3, 3]
    return result
