"""The map database's writer thread: every SQLite call of a run, off the frame loop.

The frame loop only ``put``s events (a tuple each: a queue append, microseconds); this thread
opens the file (lock, checks, crash marking, retention), applies the events in order inside one
transaction and commits it at least every ``commit_s`` (WAL journal, synchronous FULL), so a
SIGKILL loses at most the last ``commit_s`` of the run and never what was committed.

Any failure (held by another process, read-only, corrupt, disk full, an I/O error) is caught
here: the open transaction is rolled back (what was committed stays intact), ``failure`` says
why, and later events are dropped. The Mapper maps on in memory; nothing is raised into it.
If the disk falls behind by more than ``MAX_BACKLOG_BYTES`` of points, the run stops being
stored (a growing queue would take the robot's memory instead).

A camera rig (mapping/rig/) has ONE writer for all its cameras: one run per camera (``cameras``;
each camera's recorder puts its events with its ``slot``), one connection, one lock and one
transaction, so the cameras never wait on each other's locks and a crash leaves every camera's
run at the same commit. The rig's row and each run's camera and scale are in ``rigs`` and
``rig_cameras`` (schema.py).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import queue
import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..files.colmap import KeyframeImage
from .schema import CLEAN, RUN_TABLES, RUNNING, WriterLock, apply_retention, connect, describe_error, mark_crashed
from .blobs import MapDatabaseError, array_blob, poses_blob, voxel_map_blob
from .continuation import write_continuation
from .readback import replay_voxel_map
from ..store.voxel_map import VoxelMap, VoxelRangeError

MAX_BACKLOG_BYTES = 256 * 2**20
POLL_S = 0.02   # how often the thread looks for new events
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


@dataclasses.dataclass
class _Run:
    """One run's state on the writer thread (a rig's writer holds one per camera)."""

    indices: collections.deque      # the trajectory's keys
    replica: VoxelMap               # the voxel map as the inserts made it (the checkpoints' state)
    id: int | None = None
    seq: int = 0                    # the newest map insert's seq
    since_checkpoint: int = 0       # insert bytes since the last checkpoint
    last_index: int = -1


class MapWriter:
    def __init__(self, path: Path, settings: dict, model: str, commit_s: float, max_runs: int, max_mb: float,
                 max_poses: int, voxel_size: float, max_points: int,
                 on_commit: Callable[[int, int], None] | None = None, resume_from: int | None = None,
                 cameras: Sequence[str] = (), primary: str = ""):
        """``cameras`` (a rig's, ``primary`` among them): one run per camera, slot i for cameras[i]."""
        self.path = Path(path)
        self.cameras, self.primary = tuple(cameras), primary
        self.rig: int | None = None
        self._run_row = (json.dumps(settings, sort_keys=True), model)
        self.commit_s = commit_s
        self._retention = (max_runs, max_mb)
        self._voxel_size = voxel_size   # map_voxel_size_m: the pitch of a new map
        self._runs = [_Run(collections.deque(maxlen=max_poses), VoxelMap(voxel_size, max_points))
                      for _ in range(max(1, len(self.cameras)))]
        self._open_slots = set(range(len(self._runs)))   # the runs not ended yet (close)
        self._resume_from = resume_from
        self._on_commit = on_commit
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._queued_bytes = 0       # written by the producer only
        self._done_bytes = 0         # written by this thread only
        self.failure = ""
        self.text = f"opening {self.path}"
        self.commits = 0
        # The newest commits' durations (ms, writer thread), for the benchmark of the disk's cost.
        self.commit_ms: collections.deque[float] = collections.deque(maxlen=4096)
        self.crashed_runs: list[int] = []
        self._conn: sqlite3.Connection | None = None
        self._lock: WriterLock | None = None
        self._thread = threading.Thread(target=self._main, name="lingbot_map_writer", daemon=True)
        self._thread.start()

    @property
    def run(self) -> int | None:
        """The (first) run's id, once opened."""
        return self._runs[0].id

    @property
    def runs(self) -> list[int | None]:
        """Every run's id (one per camera of a rig), once opened."""
        return [r.id for r in self._runs]

    # -- producer side (the frame loop) ---------------------------------------------------------

    def put(self, event: tuple, slot: int = 0) -> None:
        """An event of run ``slot`` (a rig's camera)."""
        if self.failure:
            return
        nbytes = _payload_bytes(event)
        if nbytes:
            self._queued_bytes += nbytes
            if self._queued_bytes - self._done_bytes > MAX_BACKLOG_BYTES:
                self._fail(f"the disk fell behind by more than {MAX_BACKLOG_BYTES >> 20} MiB of points; "
                           "the rest of this run is not stored")
                return
        self._queue.put((slot, event))

    def commit(self, timeout: float = 60.0) -> bool:
        """Commit everything put so far now; True once done (False: failed or timed out)."""
        if not self._thread.is_alive():
            return False
        done = threading.Event()
        self._queue.put((0, (COMMIT, done)))
        return done.wait(timeout) and not self.failure

    def close(self, timeout: float = 60.0, slot: int | None = None) -> bool:
        """End the run of ``slot`` (None: every run; marked clean); once every run has ended,
        commit and close. True if the thread finished in time (or runs are left open)."""
        slots = set(self._open_slots) if slot is None else {slot} & self._open_slots
        self._open_slots -= slots
        if self._thread.is_alive():
            for each in sorted(slots):
                self._queue.put((each, (END,)))
            if self._open_slots:
                return True
            self._queue.put(None)
            self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the thread -----------------------------------------------------------------------------

    def _fail(self, text: str) -> None:
        if not self.failure:
            self.failure = text
            self.text = f"not stored: {text}"

    def _main(self) -> None:
        try:
            self._open()
        except MapDatabaseError as error:
            self._fail(str(error))
        except Exception as error:   # anything else the file system says: report, never raise
            self._fail(f"{self.path}: {type(error).__name__}: {error}")
        in_transaction, deadline = False, 0.0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                if in_transaction and time.monotonic() >= deadline:
                    in_transaction = self._commit()
                # Polled, not waited on: with no thread waiting, a put is a plain append and never
                # hands the GIL to this thread in the middle of the frame loop's step.
                time.sleep(POLL_S)
                continue
            if item is None:
                break
            slot, event = item
            if self.failure:
                if event[0] == COMMIT:
                    event[1].set()
                continue
            if event[0] == COMMIT:
                in_transaction = self._commit() if in_transaction else False
                event[1].set()
                continue
            try:
                if not in_transaction:
                    self._conn.execute("BEGIN IMMEDIATE")
                    in_transaction, deadline = True, time.monotonic() + self.commit_s
                self._apply(self._runs[slot], event)
                if time.monotonic() >= deadline or event[0] == END:
                    in_transaction = self._commit()
            except Exception as error:
                in_transaction = False
                self._abandon(error)
        if in_transaction and not self.failure:
            self._commit()
        if not self.failure and self.run is not None:
            self.text = f"{self._what()} stored in {self.path}"
        self._shut()

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = WriterLock(self.path)
        self._conn = connect(self.path, readonly=False)
        try:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            self.crashed_runs = mark_crashed(conn)
            started = time.time_ns()
            for run in self._runs:
                run.id = conn.execute("INSERT INTO runs (started_ns, settings, model, ending) VALUES (?, ?, ?, ?)",
                                      (started, *self._run_row, RUNNING)).lastrowid
            if self.cameras:
                self.rig = conn.execute("INSERT INTO rigs (primary_camera) VALUES (?)", (self.primary,)).lastrowid
                for position, (camera, run) in enumerate(zip(self.cameras, self._runs)):
                    conn.execute("INSERT INTO rig_cameras (run, rig, position, camera) VALUES (?, ?, ?, ?)",
                                 (run.id, self.rig, position, camera))
            if self._resume_from is not None:
                self._take_over(self._resume_from)
            apply_retention(conn, self.runs, *self._retention)
            conn.execute("COMMIT")
        except sqlite3.Error as error:
            self._abandon(error)
            raise MapDatabaseError(self.failure) from None
        self.text = f"writing {self._what()} to {self.path}"

    def _what(self) -> str:
        if self.rig is None:
            return f"run {self.run}"
        return f"rig {self.rig} (runs {', '.join(f'{r.id} {c}' for c, r in zip(self.cameras, self._runs))})"

    def _take_over(self, source: int) -> None:
        """A resumed run starts as the run it continues: that run's records become this run's (moved,
        not copied: the file grows with the map, not with the number of restarts) and its row goes.
        Its continuation and provisional points come too, in this first transaction: a crash before
        the Mapper stores its own resumes from them again."""
        conn, state = self._conn, self._runs[0]
        run = state.id
        for table in RUN_TABLES:
            conn.execute(f"UPDATE {table} SET run = ? WHERE run = ?", (run, source))
        # Its conversion too: the Mapper's own reaches the file at the first commit, after a crash maybe not.
        conn.execute("UPDATE runs SET (scale, scale_known, mount, origins) = (SELECT scale, scale_known, mount, "
                     "origins FROM runs WHERE id = ?) WHERE id = ?", (source, run))
        conn.execute("DELETE FROM runs WHERE id = ?", (source,))
        state.indices.extend(row[0] for row in conn.execute("SELECT idx FROM frames WHERE run = ? ORDER BY idx",
                                                            (run,)))
        state.last_index = state.indices[-1] if state.indices else -1
        state.replica = replay_voxel_map(conn, run, state.replica.voxel_size_m, state.replica.max_points)[0]
        state.seq = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM map_inserts WHERE run = ?", (run,)).fetchone()[0]

    def _commit(self) -> bool:
        """Commit the open transaction; False (no transaction open) afterwards either way."""
        start = time.perf_counter()
        try:
            self._conn.executemany("UPDATE runs SET last_commit_ns = ? WHERE id = ?",
                                   [(time.time_ns(), run.id) for run in self._runs])
            self._conn.execute("COMMIT")
        except Exception as error:
            self._abandon(error)
            return False
        self.commit_ms.append((time.perf_counter() - start) * 1e3)
        self.commits += 1
        if self._on_commit is not None:
            self._on_commit(self.commits, self._runs[0].last_index)
        return False

    def _abandon(self, error: BaseException) -> None:
        """Roll the open transaction back (the committed state stays) and stop storing this run."""
        try:
            if self._conn is not None and self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        self._fail(describe_error(error, self.path))

    def _shut(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
        if self._lock is not None:
            self._lock.release()

    def _apply(self, state: _Run, event: tuple) -> None:
        kind, conn, run = event[0], self._conn, state.id
        if kind == FRAME:
            _, index, stamp_ns, pose, keyframe, window, final = event
            if not state.indices or index > state.indices[-1]:
                if len(state.indices) == state.indices.maxlen:   # the trajectory drops its oldest too
                    conn.execute("DELETE FROM frames WHERE run = ? AND idx = ?", (run, state.indices[0]))
                    # And every older image (an ended stream's too: the combined trajectory is bounded).
                    conn.execute("DELETE FROM keyframe_images WHERE run = ? AND idx <= ?", (run, state.indices[0]))
                state.indices.append(index)
            elif not _holds(state.indices, index):
                return   # a pose the trajectory no longer holds (beyond its bound) is not stored either
            conn.execute("INSERT OR REPLACE INTO frames VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (run, index, stamp_ns, np.asarray(pose, np.float64).tobytes(), int(keyframe), window,
                          int(final)))
            state.last_index = max(state.last_index, index)
        elif kind == IMAGE:   # a final keyframe's image, after its FRAME: encoded here, off the frame loop
            _, index, rgb, intrinsic, image_size = event
            self._done_bytes += rgb.nbytes
            if _holds(state.indices, index):
                stored = KeyframeImage.of(rgb, intrinsic, image_size)
                conn.execute("INSERT OR REPLACE INTO keyframe_images VALUES (?, ?, ?, ?, ?, ?)",
                             (run, index, stored.width, stored.height, stored.intrinsic.tobytes(), stored.jpeg))
        elif kind == REMOVED:
            if _holds(state.indices, event[1]):
                state.indices.remove(event[1])
            for table in ("frames", "keyframe_images"):
                conn.execute(f"DELETE FROM {table} WHERE run = ? AND idx = ?", (run, event[1]))
        elif kind == CLEARED:
            state.indices.clear()
            state.replica = VoxelMap(self._voxel_size, state.replica.max_points)
            state.since_checkpoint = 0
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
            state.indices.clear()
            state.replica = VoxelMap(self._voxel_size, state.replica.max_points)
            state.since_checkpoint = 0
        elif kind == POINTS:
            _, xyz, rgb = event
            xyz_blob, rgb_blob = array_blob(xyz), array_blob(rgb)
            seq = self._insert_points(state, xyz_blob, rgb_blob, provisional=False)
            self._done_bytes += xyz.nbytes + rgb.nbytes
            try:
                state.replica.insert(xyz, rgb)
            except VoxelRangeError:
                pass   # the Mapper's map raised and went on the same way
            state.since_checkpoint += len(xyz_blob) + len(rgb_blob)
            if state.since_checkpoint >= max(MIN_CHECKPOINT_BYTES, CHECKPOINT_RATIO * state.replica.nbytes()):
                self._checkpoint(state, seq)
        elif kind == PITCH:   # the map resampled at its new pitch, as MapStore.set_pitch does
            state.replica = state.replica.resampled(event[1])
            self._checkpoint(state, state.seq)   # replay starts from this pitch
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
            self._done_bytes += _payload_bytes(event)
            write_continuation(conn, run, event[1], event[2], functools.partial(self._insert_points, state))
        elif kind == RIG_SCALES:
            conn.executemany("UPDATE rig_cameras SET scale = ?, scale_source = ?, scale_text = ? WHERE run = ?",
                             [(scale.value, scale.source, scale.text, self._runs[self.cameras.index(camera)].id)
                              for camera, scale in event[1].items()])
        elif kind == END:
            conn.execute("UPDATE runs SET ending = ?, ended_ns = ? WHERE id = ?", (CLEAN, time.time_ns(), run))

    def _insert_points(self, state: _Run, xyz_blob: bytes, rgb_blob: bytes, provisional: bool) -> int:
        state.seq += 1
        self._conn.execute("INSERT INTO map_inserts VALUES (?, ?, ?, ?, ?)",
                           (state.id, state.seq, xyz_blob, rgb_blob, int(provisional)))
        return state.seq

    def _checkpoint(self, state: _Run, seq: int) -> None:
        self._conn.execute("INSERT OR REPLACE INTO map_checkpoints VALUES (?, ?, ?)",
                           (state.id, seq, voxel_map_blob(state.replica)))
        # The provisional points stay: the continuation they belong to replaces them.
        self._conn.execute("DELETE FROM map_inserts WHERE run = ? AND seq <= ? AND provisional = 0", (state.id, seq))
        state.since_checkpoint = 0


def _payload_bytes(event: tuple) -> int:
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


def stored_bytes(path: Path) -> int:
    """The database's bytes on disk, its WAL included."""
    return sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if os.path.exists(p))
