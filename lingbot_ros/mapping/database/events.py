"""The map database writer's events and what each does to one run's records (on the writer thread).

The frame loop puts events (tuples, the first item names them) into the writer's queue
(writer.py); the writer thread hands each to the RunRecords of its run, which changes the tables
inside the writer's open transaction. A RunRecords also holds what of the stored run the next
events need: the trajectory's keys (its bound, ``max_trajectory_poses``) and a replica of the
voxel map, whose state is the map checkpoint.
"""
from __future__ import annotations

import collections
import functools
import sqlite3
import time

import numpy as np

from ..files.colmap import KeyframeImage
from ..store.voxel_map import VoxelMap, VoxelRangeError
from .blobs import array_blob, poses_blob, voxel_map_blob
from .continuation import write_continuation
from .readback import replay_voxel_map
from .schema import CLEAN

# A map checkpoint is written once the inserts since the last one are CHECKPOINT_RATIO times as
# large as the checkpoint (and at least MIN_CHECKPOINT_BYTES): the checkpoints add 1 / RATIO to
# the bytes written (5.7 -> 8.6 MB/s at 30 Hz, released size, every frame a keyframe) and the
# stored map stays within about RATIO + 2 times its in-memory state (the old checkpoint's pages
# are free until reused).
MIN_CHECKPOINT_BYTES = 8 * 2**20
CHECKPOINT_RATIO = 2

# Events (tuples; the first item names them).
FRAME, IMAGE, REMOVED, CLEARED, POINTS, PITCH, FINISHED, WINDOWS, CONVERSION, CONTINUATION, END, COMMIT = (
    "frame", "image", "removed", "cleared", "points", "pitch", "finished", "windows", "conversion", "continuation",
    "end", "commit")
RIG_SCALES = "rig_scales"   # (RIG_SCALES, {camera: RigScale}): each camera's scale against the primary


class RunRecords:
    """One run's records on the writer thread (a rig's writer holds one per camera)."""

    def __init__(self, max_poses: int, voxel_size: float, max_points: int):
        self.indices: collections.deque = collections.deque(maxlen=max_poses)   # the trajectory's keys
        self.voxel_size = voxel_size    # map_voxel_size_m: the pitch of a new map
        self.replica = VoxelMap(voxel_size, max_points)   # the map as the inserts made it (the checkpoints')
        self.id: int | None = None
        self.seq = 0                    # the newest map insert's seq
        self.since_checkpoint = 0       # insert bytes since the last checkpoint
        self.last_index = -1

    def taken_over(self, conn: sqlite3.Connection) -> None:
        """What the next events need of the records this run took over (a resumed run's)."""
        run = self.id
        self.indices.extend(row[0] for row in conn.execute("SELECT idx FROM frames WHERE run = ? ORDER BY idx",
                                                           (run,)))
        self.last_index = self.indices[-1] if self.indices else -1
        self.replica = replay_voxel_map(conn, run, self.replica.voxel_size_m, self.replica.max_points)[0]
        self.seq = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM map_inserts WHERE run = ?", (run,)).fetchone()[0]

    def apply(self, conn: sqlite3.Connection, event: tuple) -> None:
        """One event's change to this run's records (RIG_SCALES is the writer's: it spans the runs)."""
        kind, run = event[0], self.id
        if kind == FRAME:
            _, index, stamp_ns, pose, keyframe, window, final = event
            if not self.indices or index > self.indices[-1]:
                if len(self.indices) == self.indices.maxlen:   # the trajectory drops its oldest too
                    conn.execute("DELETE FROM frames WHERE run = ? AND idx = ?", (run, self.indices[0]))
                    # And every older image (an ended stream's too: the combined trajectory is bounded).
                    conn.execute("DELETE FROM keyframe_images WHERE run = ? AND idx <= ?", (run, self.indices[0]))
                self.indices.append(index)
            elif not _holds(self.indices, index):
                return   # a pose the trajectory no longer holds (beyond its bound) is not stored either
            conn.execute("INSERT OR REPLACE INTO frames VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (run, index, stamp_ns, np.asarray(pose, np.float64).tobytes(), int(keyframe), window,
                          int(final)))
            self.last_index = max(self.last_index, index)
        elif kind == IMAGE:   # a final keyframe's image, after its FRAME: encoded here, off the frame loop
            _, index, rgb, intrinsic, image_size = event
            if _holds(self.indices, index):
                stored = KeyframeImage.of(rgb, intrinsic, image_size)
                conn.execute("INSERT OR REPLACE INTO keyframe_images VALUES (?, ?, ?, ?, ?, ?)",
                             (run, index, stored.width, stored.height, stored.intrinsic.tobytes(), stored.jpeg))
        elif kind == REMOVED:
            if _holds(self.indices, event[1]):
                self.indices.remove(event[1])
            for table in ("frames", "keyframe_images"):
                conn.execute(f"DELETE FROM {table} WHERE run = ? AND idx = ?", (run, event[1]))
        elif kind == CLEARED:
            self.indices.clear()
            self.replica = VoxelMap(self.voxel_size, self.replica.max_points)
            self.since_checkpoint = 0
            for table in ("frames", "map_inserts", "map_checkpoints", "finished_streams", "keyframe_images"):
                conn.execute(f"DELETE FROM {table} WHERE run = ?", (run,))
        elif kind == FINISHED:   # the live stream went into the finished part: a new live one starts
            _, finished_map, finished_poses, released = event
            try:   # the Mapper's own objects: read here, and released before anything else
                blobs = (voxel_map_blob(finished_map), poses_blob(finished_poses))
            finally:
                released.set()
            conn.execute("INSERT OR REPLACE INTO finished_streams VALUES (?, ?, ?)", (run, *blobs))
            for table in ("frames", "map_inserts", "map_checkpoints"):
                conn.execute(f"DELETE FROM {table} WHERE run = ?", (run,))
            self.indices.clear()
            self.replica = VoxelMap(self.voxel_size, self.replica.max_points)
            self.since_checkpoint = 0
        elif kind == POINTS:
            _, xyz, rgb = event
            xyz_blob, rgb_blob = array_blob(xyz), array_blob(rgb)
            seq = self.insert_points(conn, xyz_blob, rgb_blob, provisional=False)
            try:
                self.replica.insert(xyz, rgb)
            except VoxelRangeError:
                pass   # the Mapper's map raised and went on the same way
            self.since_checkpoint += len(xyz_blob) + len(rgb_blob)
            if self.since_checkpoint >= max(MIN_CHECKPOINT_BYTES, CHECKPOINT_RATIO * self.replica.nbytes()):
                self._checkpoint(conn, seq)
        elif kind == PITCH:   # the map resampled at its new pitch, as MapStore.set_pitch does
            self.replica = self.replica.resampled(event[1])
            self._checkpoint(conn, self.seq)   # replay starts from this pitch
        elif kind == WINDOWS:
            conn.execute("DELETE FROM windows WHERE run = ?", (run,))
            for seq, record in enumerate(event[1]):
                sim = record.similarity
                conn.execute("INSERT INTO windows VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (
                    run, seq, record.window, record.first_index, float(sim.scale),
                    sim.rotation.detach().cpu().double().numpy().tobytes(),
                    sim.translation.detach().cpu().double().numpy().tobytes(), float(record.overlap_error)))
        elif kind == CONVERSION:
            _, scale, known, mount, origins = event
            conn.execute("UPDATE runs SET scale = ?, scale_known = ?, mount = ?, origins = ? WHERE id = ?",
                         (float(scale), int(known), array_blob(np.asarray(mount, np.float64)),
                          array_blob(np.asarray(origins, np.float64)), run))
        elif kind == CONTINUATION:   # replaces the last one whole (None: the stream it was of ended)
            write_continuation(conn, run, event[1], event[2], functools.partial(self.insert_points, conn))
        elif kind == END:
            conn.execute("UPDATE runs SET ending = ?, ended_ns = ? WHERE id = ?", (CLEAN, time.time_ns(), run))

    def insert_points(self, conn: sqlite3.Connection, xyz_blob: bytes, rgb_blob: bytes, provisional: bool) -> int:
        self.seq += 1
        conn.execute("INSERT INTO map_inserts VALUES (?, ?, ?, ?, ?)", (self.id, self.seq, xyz_blob, rgb_blob,
                                                                        int(provisional)))
        return self.seq

    def _checkpoint(self, conn: sqlite3.Connection, seq: int) -> None:
        conn.execute("INSERT OR REPLACE INTO map_checkpoints VALUES (?, ?, ?)", (self.id, seq,
                                                                                voxel_map_blob(self.replica)))
        # The provisional points stay: the continuation they belong to replaces them.
        conn.execute("DELETE FROM map_inserts WHERE run = ? AND seq <= ? AND provisional = 0", (self.id, seq))
        self.since_checkpoint = 0


def payload_bytes(event: tuple) -> int:
    """The array bytes an event carries to the disk (the backlog bound counts them)."""
    if event[0] == POINTS:
        return event[1].nbytes + event[2].nbytes
    if event[0] == IMAGE:
        return event[2].nbytes
    if event[0] == CONTINUATION and event[1] is not None:
        return sum(xyz.nbytes + rgb.nbytes for xyz, rgb in event[2]) + event[1].nbytes
    return 0


def _holds(indices: collections.deque, index: int) -> bool:
    """Whether ``index`` is held, searched from the newest end (replace and remove serve the last few)."""
    for held in reversed(indices):
        if held == index:
            return True
        if held < index:
            return False
    return False
