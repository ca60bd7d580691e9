"""Resume: the map database's last run as the state a new Mapper continues (``resume`` setting).

After a clean end the run holds its continuation (the window number, the next frame index, the
stream's placement) and its window's last ``ov`` frames (the decoded images as received and the
window's results for them): the new Mapper's first frame starts the next window, which runs those
frames again and is aligned to their stored results, exactly as a live switch (``new_window``)
aligns two windows. A run without a continuation (it crashed, or was not windowed) continues from
its last pose with a new stream, as a restart that keeps the map does; so does a run with
``scale_source odometry`` (each stream keeps its own scale: the stored live stream joins the
finished part, converted once with its stored conversion).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .frames import Placement
from .live_windows import WindowRecord
from .map_database import (CRASHED, RUNNING, MapDatabaseError, WriterLock, blob_array, blob_arrays, connect,
                           resolve_path, runs)
from .frames import MapConversion
from .map_readback import conversion, load_finished, load_run, replay_voxel_map
from .trajectory import Trajectory
from .voxel_map import VoxelMap

# Settings that shape the stored map and its windows: a run continues only under the same values.
MAP_SHAPING = ("checkpoint", "model_config", "image_width", "num_scale_frames", "scale_frames", "sliding_window",
               "keyframe_policy", "keyframe_interval", "long_run_policy", "window_size", "overlap_size",
               "overlap_keyframes", "window_alignment", "map_voxel_size_m", "max_map_points",
               "max_trajectory_poses", "scale_source", "scale", "camera_mount")


@dataclasses.dataclass(frozen=True)
class StoredResult:
    """What the next window's alignment reads of a stored frame's result (similarity.PairedFrame)."""

    pose_enc: torch.Tensor
    depth: torch.Tensor
    is_keyframe: bool


@dataclasses.dataclass
class Resumed:
    run: int
    ending: str
    trajectory: Trajectory          # the live stream's camera poses in I, as MapStore holds them
    voxel_map: VoxelMap             # its voxels in I
    finished: tuple[VoxelMap, Trajectory] | None   # earlier streams in map (scale_source odometry)
    conversion: MapConversion       # the live stream's stored conversion into map
    records: list[WindowRecord]
    mount: np.ndarray | None
    next_index: int
    window: int | None              # the stored window's number; None without a continuation
    placement: Placement | None
    overlap: list[tuple]            # (index, stamp_ns, rgb, StoredResult), oldest first
    provisional: dict               # the window's provisional frames: index -> (stamp_ns, points or None)


def load_resumed(settings, device: str) -> tuple[Resumed | None, str]:
    """The last run to continue, or None and why not (a new map starts)."""
    path = resolve_path(settings.map_database)
    if not settings.map_database or not path.is_file():
        return None, f"resume: no map database at {path}; a new map starts"
    try:
        conn = connect(path, readonly=True)
    except MapDatabaseError as error:
        return None, f"resume: {error}; a new map starts"
    try:
        stored = runs(conn)
        if not stored:
            return None, f"resume: {path} holds no run; a new map starts"
        info = stored[-1]
        ending = info.ending
        if ending == RUNNING:
            if WriterLock.held(path):
                return None, f"resume: run {info.id} is being written by another process; a new map starts"
            ending = CRASHED   # its writer is gone; the new run's writer marks it so in the file
        differ = [name for name in MAP_SHAPING if info.settings.get(name) != getattr(settings, name)]
        if differ:
            return None, f"resume: run {info.id} was made with other {', '.join(differ)}; a new map starts"
        trajectory = Trajectory(settings.max_trajectory_poses)
        for index, stamp_ns, pose in conn.execute("SELECT idx, stamp_ns, pose FROM frames WHERE run = ? ORDER BY idx",
                                                  (info.id,)):
            trajectory.append(stamp_ns, np.frombuffer(pose, np.float64).reshape(4, 4), key=index)
        voxel_map, provisional_points = replay_voxel_map(conn, info.id, settings.map_voxel_size_m,
                                                         settings.max_map_points)
        records = load_run(conn, info).windows or []
        row = conn.execute("SELECT window, next_index, stream FROM continuations WHERE run = ?",
                           (info.id,)).fetchone()
        last = trajectory[-1].key if len(trajectory) else -1
        window, placement, overlap, next_index, provisional = None, None, [], last + 1, {}
        if row is not None:
            window, next_index = row[0], row[1]
            arrays = blob_arrays(row[2])
            placement = Placement(rotation=arrays["rotation"], translation=arrays["translation"])
            stamps = dict(conn.execute("SELECT idx, stamp_ns FROM frames WHERE run = ? AND final = 0", (info.id,)))
            points = iter(provisional_points)   # the provisional inserts, one per provisional keyframe, in order
            for index, keyframe in arrays["provisional"].tolist():
                value = next(points) if keyframe else None
                if index in stamps:   # a pose the trajectory's bound dropped has nothing to finalise
                    provisional[index] = (stamps[index], value)
            for index, stamp_ns, rgb, pose_enc, depth, keyframe in conn.execute(
                    "SELECT idx, stamp_ns, rgb, pose_enc, depth, keyframe FROM overlap_frames WHERE run = ? "
                    "ORDER BY seq", (info.id,)):
                result = StoredResult(torch.from_numpy(blob_array(pose_enc)).to(device),
                                      torch.from_numpy(blob_array(depth)).to(device), bool(keyframe))
                overlap.append((index, stamp_ns, blob_array(rgb), result))
        finished = load_finished(conn, info.id, settings.max_map_points, settings.max_trajectory_poses)
        return Resumed(info.id, ending, trajectory, voxel_map, finished, conversion(info), records, info.mount,
                       next_index, window,
                       placement, overlap, provisional), ""
    finally:
        conn.close()
