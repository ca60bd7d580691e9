"""The one conversion from the model's optical axes to ROS axes.

The model gives camera-to-world poses in OpenCV optical axes (x right, y down, z forward), with
the first camera of the stream as the world origin. ROS (REP 103) wants a body-style frame:
x forward, y left, z up. The published ``map`` frame is the first camera's optical frame rotated
into REP 103 axes, so the start pose is the identity and "forward" is +x:

    map_x = optical_z,   map_y = -optical_x,   map_z = -optical_y

The published pose is that of the camera's *optical* frame (the frame_id of the image, by the
usual ``*_optical_frame`` convention), expressed in ``map``:

    T_map_camera = R_MAP_FROM_OPTICAL (as 4x4) @ T_world_camera

Points in model world coordinates map the same way: ``p_map = R_MAP_FROM_OPTICAL @ p_world``.
"""
from __future__ import annotations

import numpy as np

R_MAP_FROM_OPTICAL = np.array([[0.0, 0.0, 1.0],
                               [-1.0, 0.0, 0.0],
                               [0.0, -1.0, 0.0]])


def optical_pose_to_map(extrinsic_c2w) -> np.ndarray:
    """Model camera-to-world ``[3, 4]`` or ``[4, 4]`` (optical world) -> ``[4, 4]`` T_map_camera."""
    extrinsic = np.asarray(extrinsic_c2w, dtype=np.float64)
    if extrinsic.shape not in ((3, 4), (4, 4)):
        raise ValueError(f"extrinsic must be [3, 4] or [4, 4], got {extrinsic.shape}")
    pose = np.eye(4)
    pose[:3, :3] = R_MAP_FROM_OPTICAL @ extrinsic[:3, :3]
    pose[:3, 3] = R_MAP_FROM_OPTICAL @ extrinsic[:3, 3]
    return pose


def optical_points_to_map(points_world: np.ndarray) -> np.ndarray:
    """``[..., 3]`` points in the model's (optical) world -> the same points in ``map``."""
    points = np.asarray(points_world)
    # p_map = R p  <=>  for row vectors p_map^T = p^T R^T; a column permutation with signs.
    return np.stack([points[..., 2], -points[..., 0], -points[..., 1]], axis=-1)

