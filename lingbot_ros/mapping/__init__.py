"""Depth -> points, voxel map, trajectory, PLY / TUM export. Pure numpy/torch, no ROS."""
from .export import PlyFormatError, read_ply, read_tum, write_ply, write_tum
from .points import depth_to_points, image_to_rgb_uint8, select_points, to_numpy
from .trajectory import StampedPose, Trajectory, quaternion_to_rotation, rotation_to_quaternion
from .voxel_map import VoxelMap, VoxelRangeError

__all__ = [
    "PlyFormatError", "read_ply", "read_tum", "write_ply", "write_tum",
    "depth_to_points", "image_to_rgb_uint8", "select_points", "to_numpy",
    "StampedPose", "Trajectory", "quaternion_to_rotation", "rotation_to_quaternion",
    "VoxelMap", "VoxelRangeError",
]
