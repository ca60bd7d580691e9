"""What a new writer does to the runs before its own (crashed ones marked, the oldest deleted),
and the sizes the retention bound and ``lingbot-ros-map info`` read."""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Sequence

from .schema import CRASHED, RUN_TABLES, RUNNING


def mark_crashed(conn: sqlite3.Connection) -> list[int]:
    """Runs still 'running' when a new writer opens the file died without their end: say so."""
    ids = [row[0] for row in conn.execute("SELECT id FROM runs WHERE ending = ?", (RUNNING,))]
    conn.execute("UPDATE runs SET ending = ? WHERE ending = ?", (CRASHED, RUNNING))
    return ids


def delete_run(conn: sqlite3.Connection, run: int) -> None:
    for table in RUN_TABLES:
        conn.execute(f"DELETE FROM {table} WHERE run = ?", (run,))
    conn.execute("DELETE FROM runs WHERE id = ?", (run,))
    conn.execute("DELETE FROM rigs WHERE id NOT IN (SELECT rig FROM rig_cameras)")


def used_bytes(conn: sqlite3.Connection) -> int:
    """Bytes of pages in use (freed pages are reused by later writes, so the file stops growing)."""
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    pages = conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]
    return page_size * pages


def apply_retention(conn: sqlite3.Connection, keep: Sequence[int], max_runs: int, max_mb: float) -> list[int]:
    """Delete the oldest runs (never ``keep``, the new one or the new rig's) beyond ``max_runs``
    (0 = any number) and while the used size is over ``max_mb`` (0 = any size); a rig counts as
    one run and its runs go together. Returns the deleted ids."""
    units: dict[tuple, list[int]] = {}   # oldest first: a rig, or a run of its own
    for run, rig in conn.execute("SELECT r.id, c.rig FROM runs r LEFT JOIN rig_cameras c ON c.run = r.id "
                                 "ORDER BY r.id"):
        if run not in keep:
            units.setdefault(("rig", rig) if rig is not None else ("run", run), []).append(run)
    older, deleted = list(units.values()), []
    while older and ((max_runs and len(older) + 1 > max_runs) or (max_mb and used_bytes(conn) > max_mb * 1e6)):
        for run in older.pop(0):
            deleted.append(run)
            delete_run(conn, run)
    return deleted


def stored_bytes(path: Path) -> int:
    """The database's bytes on disk, its WAL included."""
    return sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if os.path.exists(p))
