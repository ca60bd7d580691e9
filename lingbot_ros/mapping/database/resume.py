"""Resume: the map database's last run as the state a new Mapper continues (``resume`` setting).

A windowed run stores its continuation (the window number, the next frame index, the stream's
placement, its provisional frames) and its window's newest ``ov`` frames (the decoded images as
received and the window's results for them) at a clean end and, while mapping, at most every
``map_database_continuation_s``; a new stream drops it. The new Mapper's first frame starts the
next window, which runs those frames again and is aligned to their stored results, exactly as a
live switch (``new_window``) aligns two windows. After a clean end that is the stored run going
on exactly; after a crash the continuation may be older than the last frames stored: the frames
after it keep their stored poses (a provisional one's points are lost) and the new window aligns
to the continuation's frames all the same. With ``scale_source odometry`` the
continuation carries the stream's scale state and the odometry its frames read
(StreamFrames.stored), so the stored stream goes on at its scale. A run without a usable
continuation (not windowed, crashed before the first one, or a frame of it rolled back)
continues from its last pose with a new stream, as a restart that keeps the map does (with
``scale_source odometry`` the stored live stream then joins the finished part, converted once
with its stored conversion, and the new one has a scale of its own).
"""
from __future__ import annotations

import dataclasses
import sqlite3

import numpy as np
import torch

from ..placement.conversion import Placement
from ..windows.live import WindowRecord
from .run_info import runs
from .schema import CRASHED, RUNNING, connect, resolve_path
from .writer_lock import WriterLock
from .blobs import MAX_MAGNITUDE, MapDatabaseError
from .blobs import blob_array, blob_arrays, checked_array, integer
from ..placement.conversion import MapConversion
from .continuation import ResumedFrame
from .readback import read_record, conversion, load_finished, replay_voxel_map, stored_poses, stored_windows
from ..store.trajectory import Trajectory
from ..store.voxel_map import VoxelMap

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
    overlap: list[ResumedFrame]     # the stored window's last frames, oldest first
    provisional: dict               # the window's provisional frames: index -> (stamp_ns, points or None)
    carried: dict                   # the stream's scale state and odometry (StreamFrames.stored)
    stale: str = ""                 # why the stored continuation cannot be used ('' if it can or there is none)


def load_resumed(settings, device: str, preprocessor=None) -> tuple[Resumed | None, str]:
    """The last run to continue, or None and why not (a new map starts). A damaged run (a record
    that cannot be read, non-finite values, stored images of another size than their results) is
    not continued: every record is checked here, so that nothing of it reaches the Mapper.
    ``preprocessor``: the model input's size for the stored images is checked against it."""
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
        refused = list(info.damaged + info.unreadable)
        if not refused:
            differ = [name for name in MAP_SHAPING if info.settings.get(name) != getattr(settings, name)]
            if differ:
                return None, f"resume: run {info.id} was made with other {', '.join(differ)}; a new map starts"
        trajectory = Trajectory(settings.max_trajectory_poses)
        for index, stamp_ns, pose in stored_poses(conn, info.id, refused):
            trajectory.append(stamp_ns, pose, key=index)
        voxel_map, provisional_points = replay_voxel_map(conn, info.id, settings.map_voxel_size_m,
                                                         settings.max_map_points, refused=refused)
        records = stored_windows(conn, info.id, refused) if settings.long_run_policy == "windowed" else []
        row = conn.execute("SELECT window, next_index, stream FROM continuations WHERE run = ?",
                           (info.id,)).fetchone()
        last = trajectory[-1].key if len(trajectory) else -1
        window, placement, overlap, next_index, provisional, carried = None, None, [], last + 1, {}, {}
        stale = "" if row is None else _stale(conn, info.id)
        if row is not None and not stale:
            # After a crash the continuation may be older than the last frames and windows stored:
            # the new window aligns to its frames all the same (their results are in the stream's
            # frame) and takes the next number and index after everything stored.
            continued = read_record(refused, f"run {info.id}: continuation", lambda: _continuation(*row))
            if continued is not None:
                stored_window, stored_next, arrays = continued
                window = max([stored_window] + [record.window for record in records])
                next_index = max(stored_next, last + 1)
                placement = Placement(rotation=arrays["rotation"], translation=arrays["translation"])
                carried = {name: value for name, value in arrays.items()
                           if name not in ("rotation", "translation", "provisional")}
                stamps = dict(conn.execute("SELECT idx, stamp_ns FROM frames WHERE run = ? AND final = 0",
                                           (info.id,)))
                points = iter(provisional_points)   # the provisional inserts, one per provisional keyframe, in order
                for index, keyframe in arrays["provisional"].tolist():
                    value = next(points, None) if keyframe else None
                    if index in stamps:   # a pose the trajectory's bound dropped has nothing to finalise
                        provisional[index] = (stamps[index], value)
            size = None   # (image, model input) of the first stored frame: every other one the same
            for seq, index, stamp_ns, rgb, pose_enc, depth, keyframe in conn.execute(
                    "SELECT seq, idx, stamp_ns, rgb, pose_enc, depth, keyframe FROM overlap_frames WHERE run = ? "
                    "ORDER BY seq", (info.id,)):
                frame = read_record(refused, f"run {info.id}: continuation frame {seq}", lambda: (
                    integer(index, "index"), integer(stamp_ns, "stamp"),
                    *_overlap_frame(rgb, pose_enc, depth, preprocessor, size)))
                if frame is not None:
                    size = size or (frame[2].shape, tuple(frame[4].shape))
                    result = StoredResult(torch.from_numpy(frame[3]).to(device), torch.from_numpy(frame[4]).to(device),
                                          bool(keyframe))
                    overlap.append(ResumedFrame(frame[0], frame[1], frame[2], result))
        finished = load_finished(conn, info.id, settings.max_map_points, settings.max_trajectory_poses, refused)
        if refused:
            more = f"; and {len(refused) - 3} more" if len(refused) > 3 else ""
            return None, (f"resume: run {info.id} in {path} cannot be read, damaged records ({'; '.join(refused[:3])}"
                          f"{more}); a new map starts")
        return Resumed(info.id, ending, trajectory, voxel_map, finished, conversion(info), records, info.mount,
                       next_index, window, placement, overlap, provisional, carried, stale), ""
    # A damaged record the checks above did not name: never raised into the Mapper.
    except (MapDatabaseError, sqlite3.Error, KeyError, ValueError, TypeError, IndexError) as error:
        return None, f"resume: the last run in {path} cannot be read ({error}); a new map starts"
    finally:
        conn.close()


def _continuation(window, next_index, blob: bytes) -> tuple[int, int, dict]:
    """The stored continuation's window number, next frame index and arrays, checked."""
    integer(window, "window"), integer(next_index, "next index")
    arrays = blob_arrays(blob)
    checked_array(arrays["rotation"], (3, 3), "placement rotation", MAX_MAGNITUDE)
    checked_array(arrays["translation"], (3,), "placement translation", MAX_MAGNITUDE)
    if arrays["provisional"].ndim != 2 or arrays["provisional"].shape[1:] != (2,) \
            or not np.issubdtype(arrays["provisional"].dtype, np.integer):
        raise ValueError(f"provisional frames of shape {arrays['provisional'].shape}, not [N, 2] integers")
    for name, value in arrays.items():   # the scale state and odometry it carries
        if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
            raise ValueError(f"{name} holds non-finite values")
    return window, next_index, arrays


def _overlap_frame(rgb_blob, pose_enc_blob, depth_blob, preprocessor, size) -> tuple:
    """A stored overlap frame (rgb, pose encoding, depth), checked: an HxWx3 uint8 image, finite
    results, and its size that of the first stored frame and of its result (the model input the
    current preprocessor makes of it)."""
    rgb, pose_enc, depth = blob_array(rgb_blob), blob_array(pose_enc_blob), blob_array(depth_blob)
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"image of shape {rgb.shape} and type {rgb.dtype}, not HxWx3 uint8")
    checked_array(pose_enc, (-1,) * pose_enc.ndim, "pose encoding")
    checked_array(depth, (-1,) * depth.ndim, "depth")
    if size is not None and (rgb.shape, tuple(depth.shape)) != size:
        raise ValueError(f"image {rgb.shape[1]}x{rgb.shape[0]} (depth {tuple(depth.shape)}) in a continuation of "
                         f"{size[0][1]}x{size[0][0]} images (depth {size[1]})")
    if preprocessor is not None:
        plan = preprocessor.plan(rgb.shape[1], rgb.shape[0])
        if tuple(depth.shape[-2:]) != (plan.height, plan.width):
            raise ValueError(f"depth {tuple(depth.shape)} for an image of {rgb.shape[1]}x{rgb.shape[0]}, whose model "
                             f"input is {plan.width}x{plan.height}")
    return rgb, pose_enc, depth


def _stale(conn, run: int) -> str:
    """Why the stored continuation does not fit the stored frames ('' if it does): a frame it
    aligns to was rolled back after it was stored (a crash before the next one)."""
    missing = conn.execute("SELECT COUNT(*) FROM overlap_frames o WHERE o.run = ? AND NOT EXISTS "
                           "(SELECT 1 FROM frames f WHERE f.run = o.run AND f.idx = o.idx)", (run,)).fetchone()[0]
    return f"{missing} of the frames its continuation aligns to were rolled back" if missing else ""
