"""A camera rig in the map database, read with real readers (sqlite3 on the file, lingbot-ros-map as
a subprocess): a two-camera rig records one run per camera and the rig, info lists the rig with its
cameras, export writes what RigMapper.save wrote; pruning counts a rig as one and never deletes the
live rig's runs; a rig writer SIGKILLed mid-run leaves a readable rig; old schema files migrate."""
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lingbot_ros.mapping import factory
from lingbot_ros.mapping.database import schema as mdb
from lingbot_ros.mapping.database import retention, writer_lock
from lingbot_ros.mapping.database.events import FRAME, POINTS
from lingbot_ros.mapping.database.writer import MapWriter
from lingbot_ros.mapping.files.export import read_ply, read_tum
from lingbot_ros.mapping.records import InputFrame
from lingbot_ros.mapping.rig.grouping import RigFrame
from lingbot_ros.mapping.rig.rig_mapper import RigMapper
from lingbot_ros.mapping.settings import SettingsError

from helpers import GET_SHARED, missing, rig_bundle_of, tiny_settings
from map_db_writer import points, pose

pytestmark = pytest.mark.usefixtures("torch_single_thread")

REPO = Path(__file__).resolve().parents[1]
FRAMES = 10


def tool(*args) -> subprocess.CompletedProcess:
    """lingbot-ros-map as a subprocess (its own process: a real reader of the file)."""
    return subprocess.run([sys.executable, "-m", "lingbot_ros.tools.map_db", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)


@pytest.fixture(scope="module")
def images(shared_data):
    out = []
    for name in ("courthouse_jpg", "loop_jpg"):
        files = sorted(shared_data(name).glob("*.jpg"))
        if len(files) < FRAMES:
            missing(f"{FRAMES} images in {shared_data(name)}", GET_SHARED)
        out.append([np.asarray(Image.open(f).convert("RGB")) for f in files[:FRAMES]])
    return out


@pytest.mark.parametrize("overrides", [{"long_run_policy": "reset"},
                                       {"long_run_policy": "windowed", "window_size": 6, "overlap_size": 3}],
                         ids=["reset", "windowed"])
def test_a_rig_records_and_export_is_what_save_wrote(fixture_files, images, tmp_path, overrides):
    database = tmp_path / "map.db"
    settings = tiny_settings(fixture_files, map_database=str(database), map_voxel_size_m=0.05,
                             map_database_commit_s=0.05, **overrides)
    rig = RigMapper(settings, rig_bundle_of(settings, 2), ("front", "back"))
    try:
        for k in range(FRAMES):
            rig.process([RigFrame(camera, InputFrame(rgb=images[c][k], stamp_ns=10**9 + k * 10**8 + c * 10**6))
                         for c, camera in enumerate(("front", "back"))])
        rig.finish()
        scales = rig.scales
        assert scales["back"].known, scales["back"]
        saved = rig.save(tmp_path / "saved")
        snapshots = rig.snapshots
        map_points = {camera: len(rig.camera(camera).map_points()[0]) for camera in ("front", "back")}
    finally:
        rig.close()
    assert not saved.left_out

    conn = sqlite3.connect(database)   # the file itself, as any SQLite reader sees it
    assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == mdb.SCHEMA_VERSION == 3
    assert conn.execute("SELECT id, primary_camera FROM rigs").fetchall() == [(1, "front")]
    rows = conn.execute("SELECT c.camera, c.position, r.ending, c.scale, c.scale_source, "
                        "(SELECT COUNT(*) FROM frames f WHERE f.run = r.id) FROM rig_cameras c "
                        "JOIN runs r ON r.id = c.run ORDER BY c.position").fetchall()
    conn.close()
    assert [row[:3] for row in rows] == [("front", 0, "clean"), ("back", 1, "clean")]
    assert rows[0][3:5] == (1.0, "primary")
    assert rows[1][3] == pytest.approx(scales["back"].value, rel=1e-12) and rows[1][4] == "trajectories"
    assert [row[5] for row in rows] == [snapshots["front"].trajectory_poses, snapshots["back"].trajectory_poses]

    info = tool("info", database)
    assert info.returncode == 0, info.stderr
    lines = info.stdout.splitlines()
    assert "2 run(s), 1 of them rig(s)" in lines[0]
    assert lines[1].startswith("rig 1: clean; 2 cameras")
    assert lines[2].startswith("  camera front (primary): run 1;") and "scale 1 (the primary camera)" in lines[2]
    assert lines[3].startswith("  camera back: run 2;") and f"scale {scales['back'].value:.6g} to the primary" \
        in lines[3]
    for line, camera in zip(lines[2:4], ("front", "back")):
        assert f"{rows[('front', 'back').index(camera)][5]} frames" in line
        assert f"{map_points[camera]} map points" in line

    exported = tool("export", database, tmp_path / "exported")
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.startswith("rig 1 (clean): wrote")
    names = ["map.ply", "trajectory_front.tum", "trajectory_back.tum"]
    windowed = overrides["long_run_policy"] == "windowed"
    names += ["windows_front.csv", "windows_back.csv"] if windowed else []
    for name in names:
        assert (tmp_path / "saved" / name).read_bytes() == (tmp_path / "exported" / name).read_bytes(), name
    assert (tmp_path / "exported" / "windows_front.csv").exists() == windowed
    xyz, _ = read_ply(tmp_path / "exported" / "map.ply")
    assert len(xyz) == saved.num_points > 0
    assert len(read_tum(tmp_path / "exported" / "trajectory_back.tum")) == saved.num_poses["back"]

    # One camera alone, in its own units (a single run's export).
    alone = tool("export", database, tmp_path / "back", "--run", 2)
    assert alone.returncode == 0, alone.stderr
    assert (tmp_path / "back" / "trajectory.tum").exists()
    refused = tool("export", database, tmp_path / "none", "--rig", 7)
    assert refused.returncode == 1 and "no rig 7 (rigs: 1)" in refused.stderr


def test_resume_with_a_rig_is_refused(fixture_files):
    settings = tiny_settings(fixture_files, map_database="/tmp/never.db", resume=True)
    with pytest.raises(SettingsError, match="resume is set but a rig of several cameras cannot continue"):
        factory.build_rig(settings, ["front", "back"])
    with pytest.raises(SettingsError, match="set resume to false"):
        RigMapper(settings, rig_bundle_of(settings, 2), ["front", "back"])
    assert not Path("/tmp/never.db").exists()


def test_window_switches_ahead_with_a_rig_are_refused(fixture_files):
    settings = tiny_settings(fixture_files, long_run_policy="windowed", window_size=10, overlap_size=4,
                             window_switch_ahead=True)
    for build in (lambda: factory.build_rig(settings, ["front", "back"]),
                  lambda: RigMapper(settings, rig_bundle_of(settings, 2), ["front", "back"])):
        with pytest.raises(SettingsError, match="set window_switch_ahead to false"):
            build()


def rig_writer(path, cameras=("a", "b"), **overrides) -> MapWriter:
    args = dict(settings={"map_voxel_size_m": 0.05}, model="test", commit_s=0.05, max_runs=0, max_mb=0.0,
                max_poses=10**6, voxel_size=0.05, max_points=10**6, cameras=cameras,
                primary=cameras[0] if cameras else "")
    args.update(overrides)
    return MapWriter(path, **args)


def write(w: MapWriter, frames=20) -> MapWriter:
    for slot in range(max(1, len(w.cameras))):
        for index in range(frames):
            w.put((FRAME, index, index * 10**8, pose(index), True, 0, True), slot)
            w.put((POINTS, *points(index)), slot)
    return w


def stored(path) -> list[tuple]:
    """(run, rig or None, camera or None) of every run in the file, by sqlite3."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT r.id, c.rig, c.camera FROM runs r LEFT JOIN rig_cameras c ON c.run = r.id "
                            "ORDER BY r.id").fetchall()
    finally:
        conn.close()


def test_pruning_counts_a_rig_as_one_and_never_deletes_the_live_rigs_runs(tmp_path):
    path = tmp_path / "map.db"
    for cameras in ((), ("a", "b"), (), ("a", "b", "c")):
        assert write(rig_writer(path, cameras)).close()
    assert stored(path) == [(1, None, None), (2, 1, "a"), (3, 1, "b"), (4, None, None),
                            (5, 2, "a"), (6, 2, "b"), (7, 2, "c")]
    # max_runs 3: the new rig and the two newest others (a run, a rig of three) stay; the older go whole.
    assert write(rig_writer(path, ("x", "y"), max_runs=3)).close()
    assert stored(path) == [(4, None, None), (5, 2, "a"), (6, 2, "b"), (7, 2, "c"), (8, 3, "x"), (9, 3, "y")]
    # max_runs 1: only the new rig, both its runs (it is live while the retention runs).
    w = write(rig_writer(path, ("p", "q"), max_runs=1))
    assert w.commit(30.0)
    assert stored(path) == [(10, 4, "p"), (11, 4, "q")]
    assert w.close()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT id FROM rigs").fetchall() == [(4,)]   # the deleted rigs' rows went too
    assert conn.execute("SELECT COUNT(DISTINCT run) FROM map_inserts").fetchone()[0] == 2
    conn.close()
    # By size: a single run that needs the room deletes the whole rig before it, never half of it.
    size = retention.used_bytes(mdb.connect(path, readonly=True))
    assert write(rig_writer(path, (), max_mb=0.1 * size / 1e6)).close()
    assert stored(path) == [(12, None, None)]


def test_a_rig_writer_killed_mid_run_leaves_a_readable_rig(tmp_path):
    path = tmp_path / "map.db"
    process = subprocess.Popen([sys.executable, str(REPO / "test" / "map_db_writer.py"), str(path), "0.02",
                                str(10**9), "front,back"], stdout=subprocess.PIPE, text=True, cwd=REPO,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    newest = -1
    for line in process.stdout:
        if line.startswith("committed"):
            commits, newest = map(int, line.split()[1:])
            if commits >= 8:
                break
    threading.Event().wait(0.03)
    process.send_signal(signal.SIGKILL)
    process.wait()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    rows = conn.execute("SELECT c.camera, r.ending, c.scale, (SELECT MAX(idx) FROM frames f WHERE f.run = r.id) "
                        "FROM rig_cameras c JOIN runs r ON r.id = c.run ORDER BY c.position").fetchall()
    conn.close()
    assert [row[:3] for row in rows] == [("front", "running", 1.0), ("back", "running", 0.5)]
    # One transaction for both cameras, their events in the order put: back is at most one frame behind.
    assert rows[0][3] - 1 <= rows[1][3] <= rows[0][3] and rows[0][3] >= newest >= 0
    info = tool("info", path)
    assert info.returncode == 0, info.stderr
    assert info.stdout.splitlines()[1].startswith("rig 1: crashed (no end recorded yet); 2 cameras")
    exported = tool("export", path, tmp_path / "out")
    assert exported.returncode == 0, exported.stderr
    front, back = (read_tum(tmp_path / "out" / f"trajectory_{camera}.tum") for camera in ("front", "back"))
    assert (len(front), len(back)) == (rows[0][3] + 1, rows[1][3] + 1)
    # back's poses are twice front's, its scale 1/2: at the primary's scale they are front's.
    np.testing.assert_allclose(back.poses(), front.poses()[:len(back)], atol=1e-9)
    xyz, _ = read_ply(tmp_path / "out" / "map.ply")
    assert len(xyz) > 0
    # The next writer marks both runs crashed.
    w = rig_writer(path, ())
    assert w.commit(30.0) and sorted(w.crashed_runs) == [1, 2]
    assert w.close()


@pytest.mark.parametrize("version", [1, 2])
def test_an_old_schema_file_reads_and_migrates(tmp_path, version):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.execute("INSERT INTO schema_version VALUES (?)", (version,))
    for step in range(1, version + 1):
        conn.executescript(mdb._MIGRATIONS[step])
    conn.execute("INSERT INTO runs (id, started_ns, ending, settings, model) VALUES (1, 0, 'clean', ?, 'old')",
                 ('{"map_voxel_size_m": 0.05}',))
    for index in range(3):
        conn.execute("INSERT INTO frames VALUES (1, ?, ?, ?, 1, 0, 1)", (index, index, pose(index).tobytes()))
    conn.commit()
    conn.close()
    info = tool("info", path)   # read-only: the file stays as it is
    assert info.returncode == 0, info.stderr
    assert "run 1: clean;" in info.stdout and "3 frames" in info.stdout
    exported = tool("export", path, tmp_path / "out")
    assert exported.returncode == 0, exported.stderr
    assert len(read_tum(tmp_path / "out" / "trajectory.tum")) == 3
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == version
    conn.close()
    assert write(rig_writer(path, ("a", "b")), frames=3).close()   # a rig's writer migrates it
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == 3
    conn.close()
    assert stored(path) == [(1, None, None), (2, 1, "a"), (3, 1, "b")]
    lines = tool("info", path).stdout.splitlines()
    assert lines[1].startswith("run 1: clean;") and lines[2].startswith("rig 1: clean; 2 cameras")


def test_a_damaged_rig_record_is_refused_or_read_as_unknown(tmp_path):
    """A stored scale that is not a positive number is read as unknown (that camera out of the map),
    told as a damaged record (exit 1, the rest exported); a camera name that would leave the
    export's folder is refused, nothing written."""
    path = tmp_path / "map.db"
    assert write(rig_writer(path, ("a", "b")), frames=3).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE rig_cameras SET scale = 'NaN?' WHERE camera = 'b'")
    conn.commit()
    told = "lingbot-ros-map: refused (damaged record, left out): run 2: rig camera scale: 'NaN?' is not a positive"
    info = tool("info", path)
    assert info.returncode == 1 and info.stderr.startswith(told), info.stderr
    assert "scale unknown (the stored scale 'NaN?' is damaged" in info.stdout
    exported = tool("export", path, tmp_path / "out")
    assert exported.returncode == 1 and exported.stderr.startswith(told), exported.stderr
    assert "not in the map, scale against the primary unknown: b" in exported.stdout
    conn.execute("UPDATE rig_cameras SET camera = '../escape' WHERE camera = 'b'")
    conn.commit()
    conn.close()
    refused = tool("export", path, tmp_path / "out2")
    assert refused.returncode == 1 and "rig 1: its stored cameras are damaged" in refused.stderr
    assert not (tmp_path / "out2").exists() and not (tmp_path / "escape.tum").exists()


def test_a_rig_that_fails_to_build_ends_every_run_and_frees_the_file(fixture_files, tmp_path, monkeypatch):
    """The second camera's Mapper fails: the first's run and the one never mapped both end, and the
    writer's lock is released (the next writer is not kept out)."""
    from lingbot_ros.mapping.rig import rig_mapper

    database = tmp_path / "map.db"
    settings = tiny_settings(fixture_files, map_database=str(database), map_database_commit_s=0.05)
    made, mapper = [], rig_mapper.Mapper

    def second_fails(*args, **kwargs):
        if made:
            raise RuntimeError("no second camera")
        made.append(mapper(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(rig_mapper, "Mapper", second_fails)
    with pytest.raises(RuntimeError, match="no second camera"):
        RigMapper(settings, rig_bundle_of(settings, 2), ("front", "back"))
    assert not writer_lock.WriterLock.held(database)
    conn = sqlite3.connect(database)
    assert conn.execute("SELECT c.camera, r.ending FROM rig_cameras c JOIN runs r ON r.id = c.run "
                        "ORDER BY c.position").fetchall() == [("front", "clean"), ("back", "clean")]
    conn.close()
