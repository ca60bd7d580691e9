"""The rig's one map: every camera's map at the primary camera's scale, voxelised once; saved.

Every camera's ``map`` is the robot base at the start, so a camera's map points join the
primary's once scaled by its ``RigScale`` (about map's origin). A camera whose scale is not known
yet stays out. The union goes through one VoxelMap at ``map_voxel_size_m`` (the primary's map
units). Saved: map.ply, preview.png (the map and the primary's path), and per camera
``trajectory_<camera>.tum`` (and ``windows_<camera>.csv`` for a windowed run), all or none.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..files.export import ply_bytes, tum_bytes, windows_bytes
from ..files.preview import preview_png
from ..files.staged_files import StagedFiles, write_files
from ..store.trajectory import Trajectory
from ..store.voxel_map import VoxelMap
from .records import RigScale, SavedRigMap


def union(parts: dict[str, tuple[np.ndarray, np.ndarray]], scales: dict[str, RigScale], voxel_size_m: float,
          max_points: int) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """(xyz float32, rgb uint8) of the cameras' maps (``parts``, each in its own map units) at the
    primary's scale in one voxel map, and the cameras left out (scale unknown)."""
    voxels = VoxelMap(voxel_size_m, max_points)
    left_out = []
    for camera, (xyz, rgb) in parts.items():
        scale = scales[camera]
        if not scale.known:
            left_out.append(camera)
            continue
        if len(xyz):
            voxels.insert((xyz * np.float32(scale.value)).astype(np.float32), rgb)
    xyz, rgb = voxels.points()
    return xyz, rgb, tuple(left_out)


def scaled(trajectory: Trajectory, scale: RigScale) -> Trajectory:
    """T_map_base poses at the primary's scale (as they are where the scale is unknown)."""
    if not scale.known or scale.value == 1.0:
        return trajectory
    out = Trajectory(trajectory.max_length)
    for entry in trajectory:
        pose = entry.pose.copy()
        pose[:3, 3] *= scale.value
        out.append(entry.stamp_ns, pose, key=entry.key)
    return out


def save(directory: str | Path, xyz: np.ndarray, rgb: np.ndarray, trajectories: dict[str, Trajectory],
         primary: str, windows: dict[str, list | None], units: str, left_out: tuple[str, ...],
         staged: StagedFiles | None = None) -> SavedRigMap:
    """The rig's files in ``directory``, all or none (with ``staged``: added to it, for the caller
    to commit with its own files)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ply = directory / "map.ply"
    files = {ply: ply_bytes(xyz, rgb),
             directory / "preview.png": preview_png(xyz, trajectories[primary].poses()[:, :3, 3], units=units)}
    tums = {}
    for camera, trajectory in trajectories.items():
        tums[camera] = directory / f"trajectory_{camera}.tum"
        files[tums[camera]] = tum_bytes(trajectory)
        if windows.get(camera) is not None:
            files[directory / f"windows_{camera}.csv"] = windows_bytes(windows[camera])
    write_files(files, staged)
    return SavedRigMap(str(ply), {c: str(p) for c, p in tums.items()}, len(xyz),
                       {c: len(t) for c, t in trajectories.items()}, left_out)
