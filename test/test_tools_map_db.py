"""lingbot-ros-map on databases lingbot-ros-offline wrote (tiny fixture, CPU): export gives the
offline tool's files byte for byte, info says how each run ended, preview draws the run."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lingbot_ros.tools import map_db, offline

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def run_offline(fixture_files, shared_data, output, database, *extra):
    code = offline.main(["--input", str(shared_data("loop_jpg")), "--output", str(output), "--max-frames", "16",
                         "--checkpoint", fixture_files["checkpoint"], "--model-config", fixture_files["model_config"],
                         "--device", "cpu", "--image-width", "112", "--num-scale-frames", "3",
                         "--sliding-window", "4", "--no-warmup", "--map-database", str(database), *extra])
    assert code == 0


@pytest.mark.parametrize("extra", [
    ("--long-run-policy", "windowed", "--window-size", "8", "--overlap-size", "3"),
    ("--long-run-policy", "reset", "--scale-source", "fixed", "--scale", "3.0"),
], ids=["windowed", "fixed-scale"])
def test_export_is_what_the_offline_tool_wrote(fixture_files, shared_data, tmp_path, capsys, extra):
    database = tmp_path / "map.db"
    run_offline(fixture_files, shared_data, tmp_path / "first", database, "--max-frames", "9", *extra)
    run_offline(fixture_files, shared_data, tmp_path / "offline", database, *extra)
    assert map_db.main(["export", str(database), str(tmp_path / "export")]) == 0
    assert map_db.main(["export", str(database), str(tmp_path / "export1"), "--run", "1"]) == 0
    names = ["map.ply", "trajectory.tum"] + (["windows.csv"] if "windowed" in extra else [])
    for run, exported in (("offline", "export"), ("first", "export1")):
        for name in names:
            assert (tmp_path / run / name).read_bytes() == (tmp_path / exported / name).read_bytes(), name
    assert not (tmp_path / "export" / "windows.csv").exists() or "windowed" in extra
    capsys.readouterr()
    assert map_db.main(["info", str(database)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "2 run(s)" in lines[0]
    assert lines[1].startswith("run 1: clean;") and "9 frames" in lines[1]
    assert lines[2].startswith("run 2: clean;") and "16 frames" in lines[2]


def test_preview_draws_the_map_and_the_trajectory(fixture_files, shared_data, tmp_path):
    database = tmp_path / "map.db"
    run_offline(fixture_files, shared_data, tmp_path / "offline", database, "--scale-source", "fixed",
                "--scale", "2.0")
    out = tmp_path / "preview.png"
    assert map_db.main(["preview", str(database), str(out)]) == 0
    image = np.asarray(Image.open(out).convert("RGB"))
    assert image.shape[0] > 300 and image.shape[1] > 300
    red = (image[..., 0] > 200) & (image[..., 1] < 60) & (image[..., 2] < 60)
    coloured = (np.abs(image.astype(int) - image.mean(axis=2, keepdims=True)).max(axis=2) > 40) & ~red
    assert red.sum() > 50, "no trajectory drawn"
    assert coloured.sum() > 500, "no map points drawn"


def test_bad_input_is_an_error_message(tmp_path):
    garbage = tmp_path / "x.db"
    garbage.write_bytes(b"nope" * 100)
    for args in (["info", str(tmp_path / "missing.db")], ["export", str(garbage), str(tmp_path / "out")]):
        result = subprocess.run([sys.executable, "-m", "lingbot_ros.tools.map_db", *args], capture_output=True,
                                text=True)
        assert result.returncode == 1 and result.stderr.startswith("lingbot-ros-map: error:"), result.stderr
    assert garbage.read_bytes() == b"nope" * 100


# -- the database at its edges (issue 28): hostile output paths, damaged records, a read-only disk --

@pytest.fixture(scope="module")
def stored_db(fixture_files, shared_data, tmp_path_factory):
    """A windowed run of 12 frames the offline tool stored (built once for the module)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("stored")
    try:
        run_offline(fixture_files, shared_data, root / "offline", root / "map.db", "--max-frames", "12",
                    "--long-run-policy", "windowed", "--window-size", "8", "--overlap-size", "3")
    finally:
        torch.set_num_threads(threads)
    return root / "map.db"


def tool(*args) -> subprocess.CompletedProcess:
    """lingbot-ros-map as a user runs it (its own process: a traceback would show on stderr)."""
    return subprocess.run([sys.executable, "-m", "lingbot_ros.tools.map_db", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def test_an_output_path_that_is_the_database_is_refused_and_nothing_is_written(stored_db, tmp_path):
    import shutil

    database = tmp_path / "map.db"
    shutil.copy(stored_db, database)
    before = database.read_bytes()
    (tmp_path / "link.png").symlink_to(database)
    os.link(database, tmp_path / "hard.png")
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "map.ply").symlink_to(database)
    (tmp_path / "db_link").symlink_to(database)
    cases = [("preview", database, database), ("preview", database, tmp_path / "link.png"),
             ("preview", database, tmp_path / "hard.png"), ("preview", tmp_path / "db_link", database),
             ("preview", database, f"{database}-wal"), ("export", database, database),
             ("export", database, tmp_path / "export")]
    for command, db, output in cases:
        result = tool(command, db, output)
        assert result.returncode == 1, (command, output, result.stdout)
        assert result.stderr.startswith("lingbot-ros-map: error: ") and "(an input)" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
        assert database.read_bytes() == before, (command, output)
    assert not os.path.exists(f"{database}-wal") and (tmp_path / "export" / "map.ply").is_symlink()
    assert tool("preview", database, tmp_path / "fine.png").returncode == 0   # another path: written
    assert database.read_bytes() == before


def _npy(array) -> bytes:
    from lingbot_ros.mapping.database.blobs import array_blob
    return array_blob(np.asarray(array))


def _far_pose(conn, index: int) -> bytes:
    pose = np.frombuffer(conn.execute("SELECT pose FROM frames WHERE idx = ?", (index,)).fetchone()[0]).copy()
    pose[[3, 7, 11]] = 1e308   # the translation
    return pose.tobytes()


def _far_points(conn) -> bytes:
    from lingbot_ros.mapping.database.blobs import blob_array
    xyz = blob_array(conn.execute("SELECT xyz FROM map_inserts WHERE seq = 2").fetchone()[0])
    return _npy(np.full_like(xyz, 1e30))


# (SQL, its parameters from the connection, the refused record, whether the run still exports)
DAMAGES = {
    "settings not JSON": ("UPDATE runs SET settings = 'not json'", None, "run 1: settings: not JSON", False),
    "settings a JSON list": ("UPDATE runs SET settings = '[1, 2]'", None, "run 1: settings: JSON list, not an object",
                             False),
    "settings of the wrong type": ("UPDATE runs SET settings = json_set(settings, '$.map_voxel_size_m', 'big')", None,
                                   "run 1: settings: map_voxel_size_m 'big' is not a usable value", False),
    "NaN mount": ("UPDATE runs SET mount = ?", lambda c: (_npy(np.full((4, 4), np.nan)),),
                  "run 1: mount: mount holds non-finite values", False),
    "origins of the wrong size": ("UPDATE runs SET origins = ?", lambda c: (_npy(np.zeros(5)),),
                                  "run 1: origins: origins has shape (5,), not (6,)", False),
    "pose blob of the wrong size": ("UPDATE frames SET pose = X'0011' WHERE idx = 3", None,
                                    "run 1: frame 3: pose of 2 bytes, not 16 float64", True),
    "NaN pose": ("UPDATE frames SET pose = ? WHERE idx = 4", lambda c: (np.full(16, np.nan).tobytes(),),
                 "run 1: frame 4: pose holds non-finite values", True),
    "inf pose": ("UPDATE frames SET pose = ? WHERE idx = 5", lambda c: (np.full(16, np.inf).tobytes(),),
                 "run 1: frame 5: pose holds non-finite values", True),
    "insert blob cut short": ("UPDATE map_inserts SET xyz = substr(xyz, 1, 60) WHERE seq = 1", None,
                              "run 1: map insert 1: a stored record cannot be read", True),
    "insert of another shape": ("UPDATE map_inserts SET xyz = ? WHERE seq = 3", lambda c: (_npy(np.zeros((7, 2))),),
                                "run 1: map insert 3: points of shape (7, 2)", True),
    "NaN points": ("UPDATE map_inserts SET xyz = ? WHERE seq = 4", lambda c: (_npy(np.full((5, 3), np.nan)),),
                   "run 1: map insert 4: colours of shape", True),
    "points at 1e30": ("UPDATE map_inserts SET xyz = ? WHERE seq = 2", lambda c: (_far_points(c),),
                       "run 1: map insert 2: points beyond the map's range", True),
    "window rotation of the wrong size": ("UPDATE windows SET rotation = X'00' WHERE seq = 1", None,
                                          "run 1: window record 1: rotation or translation of another size", True),
    "infinite window scale": ("UPDATE windows SET scale = ? WHERE seq = 1", lambda c: (float("inf"),),
                              "run 1: window record 1: scale inf is not a positive number", True),
    # SQLite keeps any value in any column: a column of another type is a damaged record too.
    "a stamp stored as text": ("UPDATE frames SET stamp_ns = 'abc' WHERE idx = 2", None,
                               "run 1: frame 2: stamp 'abc' is not an integer", True),
    "a frame index stored as text": ("UPDATE frames SET idx = 'x' WHERE idx = 6", None,
                                     "run 1: frame x: index 'x' is not an integer", True),
    "a window's first index as text": ("UPDATE windows SET first_index = 'f' WHERE seq = 1", None,
                                       "run 1: window record 1: first index 'f' is not an integer", True),
    "a start time as text": ("UPDATE runs SET started_ns = 'yesterday'", None,
                             "run 1: started_ns: value 'yesterday' is not an integer", True),
    "an unknown ending": ("UPDATE runs SET ending = 'weird'", None, "run 1: ending: 'weird' is none of", True),
    # Finite but beyond any map: the conversions' products would overflow.
    "a pose at 1e308": ("UPDATE frames SET pose = ? WHERE idx = 5", lambda c: (_far_pose(c, 5),),
                        "run 1: frame 5: pose holds values beyond +-1e+09", True),
    "a scale of 0": ("UPDATE runs SET scale = 0, scale_known = 1", None,
                     "run 1: scale: value 0.0 is not a positive number", False),
}
RUN_ROW = ("settings", "scale", "mount", "origins", "started_ns", "ending")   # what info reads of a run


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_record_is_one_line_naming_it_the_rest_is_exported_and_the_exit_is_1(stored_db, tmp_path, capsys,
                                                                                       damage):
    import shutil
    import sqlite3

    from lingbot_ros.mapping.files.export import read_ply, read_tum

    sql, parameters, record, exports = DAMAGES[damage]
    database = tmp_path / "map.db"
    shutil.copy(stored_db, database)
    conn = sqlite3.connect(database)
    conn.execute(sql, parameters(conn) if parameters else ())
    conn.commit()
    conn.close()
    before = database.read_bytes()
    capsys.readouterr()
    for args in (["info", database], ["export", database, tmp_path / "export"],
                 ["preview", database, tmp_path / "preview.png"]):
        code = map_db.main([str(a) for a in args])   # in process: an exception fails the test
        err = capsys.readouterr().err
        if args[0] == "info" and record.split(": ")[1] not in RUN_ROW:
            assert code == 0 and err == "", err   # info reads the run's own records only
            continue
        assert code == 1, (args[0], err)
        lines = err.splitlines()
        assert lines and all(line.startswith("lingbot-ros-map: ") for line in lines), err
        assert any(record in line for line in lines), (record, err)
        assert database.read_bytes() == before
    if exports:   # what is good was exported, all finite
        xyz, _ = read_ply(tmp_path / "export" / "map.ply")
        poses = read_tum(tmp_path / "export" / "trajectory.tum").poses()
        assert len(xyz) > 100 and np.isfinite(xyz).all() and np.abs(xyz).max() < 1e6
        assert len(poses) >= 11 and np.isfinite(poses).all()
        assert (tmp_path / "preview.png").is_file()
    else:   # nothing of the run can be placed without its settings and conversion
        assert not (tmp_path / "export").exists() and not (tmp_path / "preview.png").exists()
    result = tool("export", database, tmp_path / "again")   # the command line: the same, no traceback
    assert result.returncode == 1 and "Traceback" not in result.stderr and record in result.stderr, result.stderr


def test_the_reading_tools_work_on_a_read_only_disk(stored_db, tmp_path, fixture_files):
    """A cleanly closed database (WAL mode, no -wal or -shm left) on a read-only mount: SQLite cannot
    make its -shm there; the tools open it immutable. A writer there is refused with the reason and
    runs on without storing. The mount is a read-only bind in a user and mount namespace (unshare),
    as a user's read-only USB disk would be."""
    import shutil

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.fail("this test needs unshare -rm (user and mount namespaces) to make a read-only mount")
    disk = tmp_path / "disk"
    disk.mkdir()
    shutil.copy(stored_db, disk / "map.db")
    before = (disk / "map.db").read_bytes()
    script = (f"mount --bind {disk} {disk} && mount -o remount,ro,bind {disk} && touch {disk}/x 2>/dev/null "
              f"&& exit 9; {sys.executable} -m lingbot_ros.tools.map_db info {disk}/map.db && "
              f"{sys.executable} -m lingbot_ros.tools.map_db export {disk}/map.db {tmp_path}/export && "
              f"{sys.executable} -m lingbot_ros.tools.offline --input synthetic:128x96 --output {tmp_path}/offline "
              f"--max-frames 4 --checkpoint {fixture_files['checkpoint']} --model-config "
              f"{fixture_files['model_config']} --device cpu --image-width 112 --num-scale-frames 3 "
              f"--sliding-window 4 --no-warmup --map-database {disk}/map.db")
    result = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "run 1: clean;" in result.stdout and "wrote" in result.stdout, result.stdout
    assert f"map database: not stored: {disk}/map.db-writer.lock is read-only" in result.stdout + result.stderr
    assert (tmp_path / "export" / "map.ply").is_file()
    assert (disk / "map.db").read_bytes() == before and sorted(p.name for p in disk.iterdir()) == ["map.db"]


# A damaged keyframe image: the COLMAP export leaves that image out and writes the others.
IMAGE_DAMAGES = {
    "intrinsics of the wrong size": ("UPDATE keyframe_images SET intrinsic = X'0011' WHERE idx = 2",
                                     "run 1: keyframe image 2: intrinsics of another size"),
    "a JPEG that is not one": ("UPDATE keyframe_images SET jpeg = X'00112233' WHERE idx = 2",
                               "run 1: keyframe image 2: corrupt or unknown compressed data"),
    "a width of 0": ("UPDATE keyframe_images SET width = 0 WHERE idx = 2",
                     "run 1: keyframe image 2: a JPEG of 518x294 stored as 0x294"),
}


@pytest.mark.parametrize("damage", list(IMAGE_DAMAGES))
def test_a_damaged_keyframe_image_is_left_out_of_the_colmap_export(stored_db, tmp_path, damage):
    import shutil
    import sqlite3

    sql, record = IMAGE_DAMAGES[damage]
    database = tmp_path / "map.db"
    shutil.copy(stored_db, database)
    with sqlite3.connect(database) as conn:
        conn.execute(sql)
        keyframes = conn.execute("SELECT COUNT(*) FROM keyframe_images").fetchone()[0]
    conn.close()
    before = database.read_bytes()
    result = tool("export", "--format", "colmap", database, tmp_path / "colmap")
    lines = result.stderr.splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr   # one line, no traceback
    assert lines[0].startswith("lingbot-ros-map: refused (damaged record, left out): ") and record in lines[0]
    images = sorted(p.name for p in (tmp_path / "colmap" / "images").iterdir())
    assert len(images) == keyframes - 1 and "000002.jpg" not in images
    assert database.read_bytes() == before


def test_a_symlink_at_the_journal_is_refused_by_reader_and_writer(stored_db, tmp_path, fixture_files, shared_data):
    """SQLite would write its -wal / -shm into the file a link there points at: refused, with the reason."""
    import shutil

    for suffix in ("-wal", "-shm"):
        folder = tmp_path / suffix
        folder.mkdir()
        victim = folder / "victim.yaml"
        victim.write_text("keep: me\n")
        database = folder / "map.db"
        shutil.copy(stored_db, database)
        Path(f"{database}{suffix}").symlink_to(victim)
        result = tool("info", database)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert f"map.db{suffix} is a symlink, not followed" in result.stderr, result.stderr
        writer = subprocess.run([sys.executable, "-m", "lingbot_ros.tools.offline", "--input", "synthetic:128x96",
                                 "--output", str(folder / "offline"), "--max-frames", "4", "--checkpoint",
                                 fixture_files["checkpoint"], "--model-config", fixture_files["model_config"],
                                 "--device", "cpu", "--image-width", "112", "--num-scale-frames", "3",
                                 "--sliding-window", "4", "--no-warmup", "--map-database", str(database)],
                                capture_output=True, text=True, timeout=300)
        assert writer.returncode == 0 and "Traceback" not in writer.stderr, writer.stderr
        assert f"map.db{suffix} is a symlink, not followed" in writer.stdout + writer.stderr
        assert victim.read_text() == "keep: me\n" and database.read_bytes() == stored_db.read_bytes()


def test_a_crashed_database_on_a_read_only_disk_is_one_line_saying_why(tmp_path):
    """A writer killed outright leaves its last commits in the -wal; on a read-only disk without the
    -shm SQLite reads them with, the tools say so (immutable would read without those commits)."""
    import shutil
    import signal as signals

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.fail("this test needs unshare -rm (user and mount namespaces) to make a read-only mount")
    disk = tmp_path / "disk"
    disk.mkdir()
    repo = Path(__file__).parent.parent
    writer = subprocess.Popen([sys.executable, str(repo / "test" / "map_db_writer.py"), str(disk / "map.db"), "0.1"],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(repo)})
    while "committed 3" not in writer.stdout.readline():
        pass
    writer.send_signal(signals.SIGKILL)
    writer.wait()
    Path(f"{disk}/map.db-shm").unlink()
    Path(f"{disk}/map.db-writer.lock").unlink()
    before = {p.name: p.read_bytes() for p in disk.iterdir()}
    script = (f"mount --bind {disk} {disk} && mount -o remount,ro,bind {disk} && "
              f"{sys.executable} -m lingbot_ros.tools.map_db info {disk}/map.db")
    result = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines() == [f"lingbot-ros-map: error: {disk}/map.db cannot be read on this read-only "
                                          "disk: its -wal holds the last commits of a writer that did not end, and "
                                          "SQLite cannot make the -shm it reads them with here; copy the file with "
                                          "its -wal to a writable disk"], result.stderr
    assert {p.name: p.read_bytes() for p in disk.iterdir()} == before
