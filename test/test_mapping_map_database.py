"""The map database and its writer thread on real SQLite files: schema, crash safety (a writer
process SIGKILLed at random moments), crash marking, retention, map checkpoints, and the bad-file
cases (held by another process, full disk, read-only, corrupt, newer schema)."""
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from lingbot_ros.mapping.database import events, retention, run_info, writer_lock
from lingbot_ros.mapping.database import schema as mdb
from lingbot_ros.mapping.database.readback import replay_map
from lingbot_ros.mapping.database.events import CLEARED, FRAME, POINTS, REMOVED
from lingbot_ros.mapping.database.writer import MapWriter
from lingbot_ros.mapping.store.voxel_map import VoxelMap

from map_db_writer import points, pose

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "test" / "map_db_writer.py"

SETTINGS = {"map_voxel_size_m": 0.05, "max_map_points": 10**6, "long_run_policy": "reset",
            "camera_mount": "0 0 0 0 0 0"}


def writer(path, **overrides) -> MapWriter:
    args = dict(settings=SETTINGS, model="test", commit_s=0.05, max_runs=0, max_mb=0.0, max_poses=10**6,
                voxel_size=0.05, max_points=10**6)
    args.update(overrides)
    return MapWriter(path, **args)


def opened(w: MapWriter) -> MapWriter:
    """Wait until the writer has opened its file (or failed to)."""
    assert w.commit(30.0) or w.failure
    return w


def frames(path, run=None) -> dict:
    conn = mdb.connect(path, readonly=True)
    run = run or run_info.runs(conn)[-1].id
    rows = {idx: np.frombuffer(p, np.float64).reshape(4, 4)
            for idx, p in conn.execute("SELECT idx, pose FROM frames WHERE run = ?", (run,))}
    conn.close()
    return rows


def integrity(path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def test_schema_round_trip_and_clean_end(tmp_path):
    path = tmp_path / "map.db"
    w = writer(path)
    for index in range(5):
        w.put((FRAME, index, index * 10**8, pose(index), True, 0, True))
    w.put((REMOVED, 4))
    w.put((FRAME, 2, 2 * 10**8, pose(20), True, 0, True))   # a final value replaces a provisional one
    assert w.close()
    assert not w.failure
    conn = mdb.connect(path, readonly=True)
    assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == mdb.SCHEMA_VERSION
    (info,) = run_info.runs(conn)
    assert (info.ending, info.frames) == (mdb.CLEAN, 4)
    assert info.ended_ns is not None and info.settings == SETTINGS
    stored = frames(path)
    assert sorted(stored) == [0, 1, 2, 3]
    np.testing.assert_array_equal(stored[2], pose(20))


def test_trajectory_bound_drops_the_oldest_as_the_trajectory_does(tmp_path):
    path = tmp_path / "map.db"
    w = writer(path, max_poses=3)
    for index in range(6):
        w.put((FRAME, index, index, pose(index), True, 0, False))
    w.put((FRAME, 1, 1, pose(1), True, 0, True))   # dropped already: a late final value is not stored
    w.put((REMOVED, 5))
    assert w.close()
    assert sorted(frames(path)) == [3, 4]


def test_a_reset_clears_the_run_and_the_map_replays_through_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setattr(events, "MIN_CHECKPOINT_BYTES", 20_000)
    path = tmp_path / "map.db"
    w = writer(path, max_points=1500, settings={**SETTINGS, "max_map_points": 1500})
    w.put((FRAME, 0, 0, pose(0), True, 0, True))
    w.put((POINTS, *points(0)))
    w.put((CLEARED,))
    reference = VoxelMap(0.05, 1500)
    for index in range(1, 30):
        w.put((POINTS, *points(index)))
        reference.insert(*points(index))
    assert w.close()
    conn = mdb.connect(path, readonly=True)
    (info,) = run_info.runs(conn)
    assert info.frames == 0
    assert conn.execute("SELECT COUNT(*) FROM map_checkpoints").fetchone()[0] == 1
    assert info.map_inserts < 29   # compacted into the checkpoint
    xyz, rgb = replay_map(conn, info)
    expected = reference.points()
    np.testing.assert_array_equal(xyz, expected[0])
    np.testing.assert_array_equal(rgb, expected[1])


def run_writer(path, commit_s="0.05", frames=None):
    args = [sys.executable, str(SCRIPT), str(path), commit_s] + ([str(frames)] if frames else [])
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_sigkill_at_a_random_moment_loses_nothing_committed(tmp_path, seed):
    path = tmp_path / "map.db"
    rng = random.Random(seed)
    process = run_writer(path)
    wanted = rng.randint(2, 25)   # kill after this many commits, at a random point of the next one
    newest = -1
    for line in process.stdout:
        if line.startswith("committed"):
            commits, newest = map(int, line.split()[1:])
            if commits >= wanted:
                break
    threading.Event().wait(rng.random() * 0.1)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert newest >= 0
    assert integrity(path) == "ok"
    stored = frames(path)
    assert set(range(newest + 1)) <= set(stored), "a committed frame was lost"
    for index, value in stored.items():
        np.testing.assert_array_equal(value, pose(index))
    conn = mdb.connect(path, readonly=True)
    assert run_info.runs(conn)[-1].ending == mdb.RUNNING
    assert not writer_lock.WriterLock.held(path)   # the killed writer's lock went with it
    conn.close()
    # The next writer marks the dead run as crashed and starts its own.
    w = opened(writer(path))
    assert w.crashed_runs == [1]
    assert w.close()
    conn = mdb.connect(path, readonly=True)
    assert [(r.id, r.ending) for r in run_info.runs(conn)] == [(1, mdb.CRASHED), (2, mdb.CLEAN)]


def test_a_database_held_by_another_process_is_reported_and_left_alone(tmp_path):
    path = tmp_path / "map.db"
    process = run_writer(path, commit_s="0.05", frames=10**6)
    try:
        for line in process.stdout:
            if line.startswith("committed"):
                break
        assert writer_lock.WriterLock.held(path)
        w = writer(path)
        w.put((FRAME, 0, 0, pose(0), True, 0, True))
        assert not w.commit(30.0)
        assert "being written by another process" in w.failure and str(process.pid) in w.failure
        w.close()
    finally:
        process.kill()
        process.wait()
    conn = mdb.connect(path, readonly=True)
    assert [r.id for r in run_info.runs(conn)] == [1]   # no run of the refused writer, the other's intact


def test_a_full_disk_stops_storing_the_run_and_keeps_what_was_committed(tmp_path):
    path = tmp_path / "map.db"
    w = opened(writer(path))
    for index in range(3):
        w.put((FRAME, index, index, pose(index), True, 0, True))
    assert w.commit()
    # SQLite's own full-disk path: the file may not grow beyond its current pages.
    pages = w._conn.execute("PRAGMA page_count").fetchone()[0]
    w._conn.execute(f"PRAGMA max_page_count = {pages + 2}")
    for index in range(3, 60):
        w.put((FRAME, index, index, pose(index), True, 0, True))
        w.put((POINTS, *points(index)))
    assert not w.commit()
    assert "full" in w.failure
    w.put((FRAME, 99, 99, pose(99), True, 0, True))   # later events are dropped, never raised
    w.close()
    assert integrity(path) == "ok"
    assert sorted(frames(path)) == [0, 1, 2]


def test_a_read_only_database_is_reported_and_left_alone(tmp_path):
    path = tmp_path / "map.db"
    assert writer(path).close()
    before = path.read_bytes()
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (the only read-only file root cannot write)")
    try:
        w = writer(path)
        w.put((FRAME, 0, 0, pose(0), True, 0, True))
        assert not w.commit(30.0)
        assert "read-only" in w.failure or "readonly" in w.failure
        w.close()
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    assert path.read_bytes() == before


@pytest.mark.parametrize("damage", ["garbage", "pages", "newer_schema", "other_sqlite"])
def test_a_corrupt_or_foreign_file_is_reported_and_never_overwritten(tmp_path, damage):
    path = tmp_path / "map.db"
    if damage == "garbage":
        path.write_bytes(b"this is not a database" * 100)
    else:
        w = writer(path)
        for index in range(200):
            w.put((FRAME, index, index, pose(index), True, 0, True))
        assert w.close()
        conn = sqlite3.connect(path)
        if damage == "newer_schema":
            conn.execute("UPDATE schema_version SET version = 99")
            conn.commit()
        elif damage == "other_sqlite":
            conn.execute("DROP TABLE schema_version")
            conn.commit()
        conn.close()
        if damage == "pages":   # scribble over the table's pages, keep the header
            data = bytearray(path.read_bytes())
            data[4096 + 100:] = bytes(len(data) - 4096 - 100)
            data[4096 * 3: 4096 * 3 + 64] = b"\xff" * 64
            path.write_bytes(bytes(data))
    before = path.read_bytes()
    w = writer(path)
    w.put((FRAME, 0, 0, pose(0), True, 0, True))
    assert not w.commit(30.0)
    assert w.failure
    w.close()
    assert path.read_bytes() == before
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0


def test_retention_keeps_the_newest_runs(tmp_path):
    path = tmp_path / "map.db"
    for _ in range(4):
        w = writer(path, max_runs=2)
        for index in range(50):
            w.put((FRAME, index, index, pose(index), True, 0, True))
            w.put((POINTS, *points(index)))
        assert w.close()
    conn = mdb.connect(path, readonly=True)
    assert [r.id for r in run_info.runs(conn)] == [3, 4]
    assert conn.execute("SELECT COUNT(DISTINCT run) FROM map_inserts").fetchone()[0] == 2
    conn.close()
    size = retention.used_bytes(mdb.connect(path, readonly=True))
    w = writer(path, max_mb=0.6 * size / 1e6)   # room for one of the two: the older goes
    assert w.close()
    conn = mdb.connect(path, readonly=True)
    assert [r.id for r in run_info.runs(conn)] == [4, 5]


def test_resolve_path_uses_ros_home(monkeypatch, tmp_path):
    monkeypatch.setenv("ROS_HOME", str(tmp_path))
    assert mdb.resolve_path("$ROS_HOME/lingbot_ros/map.db") == tmp_path / "lingbot_ros" / "map.db"
    monkeypatch.delenv("ROS_HOME")
    assert mdb.resolve_path("$ROS_HOME/x.db") == Path.home() / ".ros" / "x.db"
