"""A stored run back as what ``Mapper.save`` writes: the map in ``map``, the base trajectory, the windows.

The stored map is replayed from its checkpoint and inserts into a VoxelMap of the run's voxel
pitch and bound, and the conversion into ``map`` is the run's last (its metric scale, camera mount
and origins) as a frames.MapConversion, the one conversion the Mapper uses; so a run that ended
cleanly exports byte for byte what a save at its end wrote.

A run stored by an older version may lack a setting added since (``camera_mount``, say): the
setting's default stands in (``setting``) and ``defaulted`` names those, for the tools to say so.
"""
from __future__ import annotations

import dataclasses
import sqlite3

import numpy as np
import torch

from .colmap import KeyframeImage
from .live_windows import WindowRecord
from .map_database import MapDatabaseError, RunInfo, blob_array, blob_arrays
from .frames import MapConversion, rigid_inverse
from .metric_scale import MetricScale
from .robot import parse_mount
from .settings import MapperSettings
from .similarity import Similarity
from .trajectory import Trajectory
from .voxel_map import VoxelMap, VoxelRangeError


# The stored settings read back here, each with the default a run that lacks it is read with.
_READ = ("camera_mount", "map_voxel_size_m", "max_map_points", "max_trajectory_poses", "long_run_policy")
_DEFAULTS = {field.name: field.default for field in dataclasses.fields(MapperSettings) if field.name in _READ}


def setting(info: RunInfo, name: str):
    """A stored setting of the run, or its default where the run did not store it."""
    return info.settings.get(name, _DEFAULTS[name])


def defaulted(info: RunInfo) -> list[str]:
    """The settings read back that the run did not store (their defaults are used)."""
    return [name for name in _READ if name not in info.settings]


@dataclasses.dataclass
class StoredRun:
    info: RunInfo
    xyz: np.ndarray                 # [N, 3] float32 in map
    rgb: np.ndarray                 # [N, 3] uint8
    trajectory: Trajectory          # T_map_base per frame, in order
    windows: list[WindowRecord] | None   # None: not a windowed run (no windows.csv)
    camera_positions: np.ndarray    # [F, 3] camera centres in map (for the preview)


def conversion(info: RunInfo) -> MapConversion:
    """The run's last conversion into map."""
    mount = info.mount if info.mount is not None else parse_mount(setting(info, "camera_mount"))
    origins = info.origins if info.origins is not None else np.zeros(6)
    metric = MetricScale(info.scale_known, float(info.scale), 0.0, 0, "")
    return MapConversion(metric, rigid_inverse(mount), origins[:3].copy(), origins[3:].copy())


def replay_voxel_map(conn: sqlite3.Connection, run: int, voxel_size: float, max_points: int,
                     provisional_as_final: bool = False) -> tuple[VoxelMap, list]:
    """The run's voxel map from its checkpoint and later inserts, and its provisional points
    (``provisional_as_final``: merged like the others, as a resumed run takes them)."""
    voxel_map = VoxelMap(voxel_size, max_points)
    row = conn.execute("SELECT upto_seq, state FROM map_checkpoints WHERE run = ?", (run,)).fetchone()
    upto = 0
    if row is not None:
        upto, state = row[0], blob_arrays(row[1])
        if "voxel_size_m" in state:   # the pitch the map had then (metres once the scale was known)
            voxel_map = VoxelMap(float(state["voxel_size_m"]), max_points)
        voxel_map.restore(state)
    provisional = []
    for xyz, rgb, is_provisional in conn.execute(
            "SELECT xyz, rgb, provisional FROM map_inserts WHERE run = ? AND (seq > ? OR provisional = 1) "
            "ORDER BY seq", (run, upto)):
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
    voxel_map, provisional = replay_voxel_map(conn, info.id, setting(info, "map_voxel_size_m"),
                                              setting(info, "max_map_points"))
    if provisional:
        voxel_map = voxel_map.copy()
        for points in provisional:
            voxel_map.insert(*points)
    return voxel_map.points()


def load_finished(conn: sqlite3.Connection, run: int, max_points: int, max_poses: int) \
        -> tuple[VoxelMap, Trajectory] | None:
    """The run's finished part (scale_source odometry: streams ended by a restart that kept the
    map), in map, as MapStore holds it; None if it has none."""
    row = conn.execute("SELECT map_state, poses FROM finished_streams WHERE run = ?", (run,)).fetchone()
    if row is None:
        return None
    state, poses = blob_arrays(row[0]), blob_arrays(row[1])
    voxel_map = VoxelMap(float(state["voxel_size_m"]), max_points)
    voxel_map.restore(state)
    trajectory = Trajectory(max_poses)
    for key, stamp_ns, pose in zip(poses["keys"].tolist(), poses["stamps_ns"].tolist(), poses["poses"]):
        trajectory.append(stamp_ns, pose, key=key)
    return voxel_map, trajectory


def load_run(conn: sqlite3.Connection, info: RunInfo) -> StoredRun:
    frames = conversion(info)
    xyz, rgb = replay_map(conn, info)
    xyz = frames.points(xyz)
    max_poses = setting(info, "max_trajectory_poses")
    finished = load_finished(conn, info.id, setting(info, "max_map_points"), max_poses)
    entries, positions = [], []
    if finished is not None and len(finished[0]):   # as MapStore.points and .trajectory combine the two parts
        combined = finished[0].copy()
        combined.insert(xyz, rgb)
        xyz, rgb = combined.points()
        mount = rigid_inverse(frames.camera_base)
        for entry in finished[1]:
            entries.append(entry)
            positions.append((entry.pose @ mount)[:3, 3])
    for index, stamp_ns, pose in conn.execute("SELECT idx, stamp_ns, pose FROM frames WHERE run = ? ORDER BY idx",
                                              (info.id,)):
        internal = np.frombuffer(pose, np.float64).reshape(4, 4)
        entries.append((stamp_ns, frames.base_pose(internal), index))
        positions.append(frames.camera_pose(internal)[:3, 3])
    trajectory = Trajectory(max_poses)
    for stamp_ns, pose, key in entries[-max_poses:]:
        trajectory.append(stamp_ns, pose, key=key)
    positions = positions[-max_poses:]
    windows = None
    if setting(info, "long_run_policy") == "windowed":
        windows = []
        for window, first, scale, rotation, translation, error in conn.execute(
                "SELECT window, first_index, scale, rotation, translation, overlap_error FROM windows "
                "WHERE run = ? ORDER BY seq", (info.id,)):
            similarity = Similarity(torch.tensor(scale, dtype=torch.float64),
                                    torch.from_numpy(np.frombuffer(rotation, np.float64).reshape(3, 3).copy()),
                                    torch.from_numpy(np.frombuffer(translation, np.float64).copy()))
            windows.append(WindowRecord(window, first, similarity, float("nan") if error is None else error))
    return StoredRun(info, xyz, rgb, trajectory, windows,
                     np.array(positions, np.float64).reshape(-1, 3))


def load_keyframe_images(conn: sqlite3.Connection, run: int) -> dict[int, KeyframeImage]:
    """The run's stored keyframe images by frame index (none in a file of schema 1, which
    predates them)."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'keyframe_images'").fetchone() is None:
        return {}
    images = {}
    for index, width, height, intrinsic, jpeg in conn.execute(
            "SELECT idx, width, height, intrinsic, jpeg FROM keyframe_images WHERE run = ? ORDER BY idx", (run,)):
        k = np.frombuffer(intrinsic, np.float64)
        if k.size != 9:
            raise MapDatabaseError(f"run {run}: the stored intrinsics of frame {index} are damaged ({k.size} values)")
        images[index] = KeyframeImage(bytes(jpeg), int(width), int(height), k.reshape(3, 3).copy())
    return images
