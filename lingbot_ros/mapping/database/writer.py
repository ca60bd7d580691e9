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
``rig_cameras`` (schema.py). What each event does to its run's records is events.py's.
"""
from __future__ import annotations

import collections
import json
import queue
import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from .blobs import MapDatabaseError
from .events import COMMIT, END, RIG_SCALES, RunRecords, payload_bytes
from .retention import apply_retention, mark_crashed
from .schema import RUN_TABLES, RUNNING, connect, describe_error
from .writer_lock import WriterLock

MAX_BACKLOG_BYTES = 256 * 2**20
POLL_S = 0.02   # how often the thread looks for new events


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
        self._runs = [RunRecords(max_poses, voxel_size, max_points) for _ in range(max(1, len(self.cameras)))]
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
        nbytes = payload_bytes(event)
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
                self._done_bytes += payload_bytes(event)
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
        conn, records = self._conn, self._runs[0]
        for table in RUN_TABLES:
            conn.execute(f"UPDATE {table} SET run = ? WHERE run = ?", (records.id, source))
        # Its conversion too: the Mapper's own reaches the file at the first commit, after a crash maybe not.
        conn.execute("UPDATE runs SET (scale, scale_known, mount, origins) = (SELECT scale, scale_known, mount, "
                     "origins FROM runs WHERE id = ?) WHERE id = ?", (source, records.id))
        conn.execute("DELETE FROM runs WHERE id = ?", (source,))
        records.taken_over(conn)

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

    def _apply(self, records: RunRecords, event: tuple) -> None:
        if event[0] == RIG_SCALES:   # every camera's run at once
            self._conn.executemany(
                "UPDATE rig_cameras SET scale = ?, scale_source = ?, scale_text = ? WHERE run = ?",
                [(scale.value, scale.source, scale.text, self._runs[self.cameras.index(camera)].id)
                 for camera, scale in event[1].items()])
        else:
            records.apply(self._conn, event)
