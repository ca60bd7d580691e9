"""Files written all or none (mapping/files/staged_files.py), through the tools that write them, on real
files: a failure half way keeps the previous files and leaves no temporary file; a symlink at a
target is replaced, not followed. And lingbot-ros-map on a database whose stored settings lack
keys added later."""
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lingbot_ros.mapping.files.export import read_ply, write_files
from lingbot_ros.mapping.files.staged_files import StagedFiles
from lingbot_ros.tools import map_db, offline

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _files(directory: Path) -> dict:
    """Every file under ``directory`` (relative path -> bytes); a directory maps to None."""
    return {str(p.relative_to(directory)): (None if p.is_dir() else p.read_bytes())
            for p in sorted(directory.rglob("*"))}


def _temporaries(directory: Path) -> list[str]:
    return [str(p) for p in directory.rglob("*") if p.name.endswith((".tmp", ".old"))]


def _offline(fixture_files, source, output: Path, *extra) -> int:
    return offline.main(["--input", str(source), "--output", str(output), "--max-frames", "8",
                         "--checkpoint", fixture_files["checkpoint"], "--model-config", fixture_files["model_config"],
                         "--device", "cpu", "--image-width", "112", "--num-scale-frames", "3",
                         "--sliding-window", "4", "--no-warmup", "--map-database", "", *extra])


def test_staged_files_commit_all_or_put_the_previous_ones_back(tmp_path):
    write_files({tmp_path / "a": b"old a", tmp_path / "b": b"old b"})
    staged = StagedFiles()
    staged.add(tmp_path / "a", b"new a")
    staged.add(tmp_path / "b", b"new b")
    staged.add(tmp_path / "c", b"new c")
    assert (tmp_path / "a").read_bytes() == b"old a"   # nothing is visible before the commit
    (tmp_path / "c").mkdir()   # the last rename now fails, after a and b were renamed
    with pytest.raises(IsADirectoryError):
        staged.commit()
    assert (tmp_path / "a").read_bytes() == b"old a" and (tmp_path / "b").read_bytes() == b"old b"
    assert _temporaries(tmp_path) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="twice"), StagedFiles() as twice:
        twice.add(tmp_path / "a", b"1")
        twice.add(tmp_path / "a", b"2")
    assert (tmp_path / "a").read_bytes() == b"old a" and _temporaries(tmp_path) == []


def test_offline_failing_half_way_keeps_the_previous_run_and_leaves_no_temporary(
        fixture_files, shared_data, tmp_path, capsys):
    output = tmp_path / "out"
    assert _offline(fixture_files, shared_data("loop_jpg"), output) == 0
    before = _files(output)
    assert "frames.csv" in before and "depth/000007.png" in before
    # A longer run over the same folder: its 11th depth file's name is taken by a directory.
    (output / "depth" / "000010.png").mkdir()
    capsys.readouterr()
    assert _offline(fixture_files, shared_data("loop_jpg"), output, "--max-frames", "12") == 1
    err = capsys.readouterr().err
    assert "lingbot-ros-offline: error:" in err and "000010.png" in err and "Traceback" not in err
    after = _files(output)
    assert after.pop("depth/000010.png") is None
    assert after == before and _temporaries(output) == []


@pytest.fixture
def database(fixture_files, shared_data, tmp_path) -> Path:
    """A map database of one offline run (8 frames of loop_jpg)."""
    path = tmp_path / "map.db"
    assert _offline(fixture_files, shared_data("loop_jpg"), tmp_path / "offline", "--map-database", str(path)) == 0
    return path


def _read_only(directory: Path):
    """Make ``directory`` refuse new files (chmod, or the immutable flag where root ignores
    modes); returns the undo, or skips where neither holds."""
    directory.chmod(0o555)
    undo = [lambda: directory.chmod(0o755)]
    if os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode == 0:
        undo.insert(0, lambda: subprocess.run(["chattr", "-i", str(directory)], check=True))
    try:
        (directory / "probe").write_bytes(b"")
    except OSError:
        return lambda: [step() for step in undo]
    (directory / "probe").unlink()
    for step in undo:
        step()
    pytest.skip("no way here to make a directory refuse new files")


def test_map_export_failing_half_way_or_in_a_read_only_directory_keeps_the_previous_files(database, tmp_path, capsys):
    exported = tmp_path / "export"
    assert map_db.main(["export", str(database), str(exported)]) == 0
    before = _files(exported)
    assert set(before) == {"map.ply", "trajectory.tum", "preview.png", "windows.csv"}
    (exported / "windows.csv").unlink()
    (exported / "windows.csv").mkdir()   # the last file of the export: three are staged before it
    capsys.readouterr()
    assert map_db.main(["export", str(database), str(exported)]) == 1
    assert "windows.csv is a directory" in capsys.readouterr().err
    after = _files(exported)
    assert after.pop("windows.csv") is None and after == {k: v for k, v in before.items() if k != "windows.csv"}
    assert _temporaries(exported) == []
    (exported / "windows.csv").rmdir()
    undo = _read_only(exported)
    try:
        assert map_db.main(["export", str(database), str(exported)]) == 1
        assert map_db.main(["preview", str(database), str(exported / "preview.png")]) == 1
    finally:
        undo()
    assert "lingbot-ros-map: error:" in capsys.readouterr().err
    assert _files(exported) == {k: v for k, v in before.items() if k != "windows.csv"}


def test_a_symlink_at_a_target_is_replaced_not_followed(database, tmp_path):
    exported = tmp_path / "export"
    exported.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    (exported / "map.ply").symlink_to(victim)
    (exported / "preview.png").symlink_to(tmp_path / "nowhere")   # dangling
    picture = tmp_path / "picture.png"
    picture.symlink_to(victim)
    assert map_db.main(["export", str(database), str(exported)]) == 0
    assert map_db.main(["preview", str(database), str(picture)]) == 0
    assert victim.read_bytes() == b"keep me" and not (tmp_path / "nowhere").exists()
    for path in (exported / "map.ply", exported / "preview.png", picture):
        assert path.is_file() and not path.is_symlink()
    assert len(read_ply(exported / "map.ply")[0]) > 0 and picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_map_tool_reads_a_run_stored_without_later_settings_with_their_defaults(database, tmp_path, capsys):
    """Runs stored by an older version lack settings added since: camera_mount here (and in the
    second run, every setting the read-back uses but the voxel size)."""
    conn = sqlite3.connect(database)
    settings = json.loads(conn.execute("SELECT settings FROM runs").fetchone()[0])
    del settings["camera_mount"]
    conn.execute("UPDATE runs SET settings = ?, mount = NULL", (json.dumps(settings),))
    conn.commit()
    conn.close()
    out = tmp_path / "reference"
    assert map_db.main(["export", str(database), str(out)]) == 0   # the default mount is the one it ran with
    text = capsys.readouterr().out
    assert "stored settings lack camera_mount (an older version wrote the run): read with the default" in text
    offline_files = _files(tmp_path / "offline")
    assert (out / "map.ply").read_bytes() == offline_files["map.ply"]
    assert (out / "trajectory.tum").read_bytes() == offline_files["trajectory.tum"]
    conn = sqlite3.connect(database)
    conn.execute("UPDATE runs SET settings = ?", (json.dumps({"map_voxel_size_m": settings["map_voxel_size_m"]}),))
    conn.commit()
    conn.close()
    for args in (["info", str(database)], ["export", str(database), str(tmp_path / "old")],
                 ["preview", str(database), str(tmp_path / "old.png")]):
        result = subprocess.run([sys.executable, "-m", "lingbot_ros.tools.map_db", *args], capture_output=True,
                                text=True)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        assert ("stored settings lack camera_mount, max_map_points, max_trajectory_poses, long_run_policy "
                "(an older version wrote the run): read with the defaults") in result.stdout, result.stdout
    assert len(read_ply(tmp_path / "old" / "map.ply")[0]) == len(read_ply(out / "map.ply")[0])
    assert (tmp_path / "old" / "windows.csv").is_file()   # long_run_policy's default: windowed
    assert np.array_equal(np.loadtxt(tmp_path / "old" / "trajectory.tum"), np.loadtxt(out / "trajectory.tum"))
