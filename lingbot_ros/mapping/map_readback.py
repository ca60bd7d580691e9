"""A stored run back as what ``Mapper.save`` writes: the map in ``map``, the base trajectory, the windows.

The stored map is replayed from its checkpoint and inserts into a VoxelMap of the run's voxel
size and bound, and the conversion into ``map`` is the run's last (its metric scale and camera
mount) through RobotFrames, the one conversion the Mapper uses; so a run that ended cleanly
exports byte for byte what a save at its end wrote.
"""
from __future__ import annotations

import dataclasses
import sqlite3

import numpy as np
import torch

from .live_windows import WindowRecord
from .map_database import RunInfo, blob_array, blob_arrays
from .robot import RobotFrames, parse_mount
from .settings import MapperSettings
from .similarity import Similarity
from .trajectory import Trajectory
from .voxel_map import VoxelMap, VoxelRangeError


@dataclasses.dataclass
class StoredRun:
    info: RunInfo
    xyz: np.ndarray                 # [N, 3] float32 in map
    rgb: np.ndarray                 # [N, 3] uint8
    trajectory: Trajectory          # T_map_base per frame, in order
    windows: list[WindowRecord] | None   # None: not a windowed run (no windows.csv)
    camera_positions: np.ndarray    # [F, 3] camera centres in map (for the preview)


def conversion(info: RunInfo) -> RobotFrames:
    """The run's last conversion into map: a RobotFrames with its scale fixed and its mount."""
    frames = RobotFrames(MapperSettings(scale_source="fixed", scale=float(info.scale)))
    mount = info.mount if info.mount is not None else parse_mount(info.settings["camera_mount"])
    frames.set_mount(mount, "the map database")
    return frames


def replay_voxel_map(conn: sqlite3.Connection, run: int, voxel_size: float, max_points: int,
                     provisional_as_final: bool = False) -> tuple[VoxelMap, list]:
    """The run's voxel map from its checkpoint and later inserts, and its provisional points
    (``provisional_as_final``: merged like the others, as a resumed run takes them)."""
    voxel_map = VoxelMap(voxel_size, max_points)
    row = conn.execute("SELECT upto_seq, state FROM map_checkpoints WHERE run = ?", (run,)).fetchone()
    upto = 0
    if row is not None:
        upto = row[0]
        voxel_map.restore(blob_arrays(row[1]))
    provisional = []
    for xyz, rgb, is_provisional in conn.execute(
            "SELECT xyz, rgb, provisional FROM map_inserts WHERE run = ? AND seq > ? ORDER BY seq", (run, upto)):
        if is_provisional and not provisional_as_final:
            provisional.append((blob_array(xyz), blob_array(rgb)))
            continue
        try:
            voxel_map.insert(blob_array(xyz), blob_array(rgb))
        except VoxelRangeError:
            pass   # the live map raised on this insert and went on the same way
    return voxel_map, provisional


def replay_map(conn: sqlite3.Connection, info: RunInfo) -> tuple[np.ndarray, np.ndarray]:
    """The run's map (internal frame), provisional points included as ``Mapper.map_points`` does."""
    voxel_map, provisional = replay_voxel_map(conn, info.id, info.settings["map_voxel_size_m"],
                                              info.settings["max_map_points"])
    if provisional:
        voxel_map = voxel_map.copy()
        for points in provisional:
            voxel_map.insert(*points)
    return voxel_map.points()


def load_run(conn: sqlite3.Connection, info: RunInfo) -> StoredRun:
    frames = conversion(info)
    xyz, rgb = replay_map(conn, info)
    trajectory = Trajectory()
    positions = []
    for index, stamp_ns, pose in conn.execute("SELECT idx, stamp_ns, pose FROM frames WHERE run = ? ORDER BY idx",
                                              (info.id,)):
        internal = np.frombuffer(pose, np.float64).reshape(4, 4)
        trajectory.append(stamp_ns / 1e9, frames.base_pose(internal), key=index)
        positions.append(frames.camera_pose(internal)[:3, 3])
    windows = None
    if info.settings["long_run_policy"] == "windowed":
        windows = []
        for window, first, scale, rotation, translation, error in conn.execute(
                "SELECT window, first_index, scale, rotation, translation, overlap_error FROM windows "
                "WHERE run = ? ORDER BY seq", (info.id,)):
            similarity = Similarity(torch.tensor(scale, dtype=torch.float64),
                                    torch.from_numpy(np.frombuffer(rotation, np.float64).reshape(3, 3).copy()),
                                    torch.from_numpy(np.frombuffer(translation, np.float64).copy()))
            windows.append(WindowRecord(window, first, similarity, float("nan") if error is None else error))
    return StoredRun(info, frames.points(xyz), rgb, trajectory, windows,
                     np.array(positions, np.float64).reshape(-1, 3))
