"""lingbot-ros-map on databases lingbot-ros-offline wrote (tiny fixture, CPU): export gives the
offline tool's files byte for byte, info says how each run ended, preview draws the run."""
import subprocess
import sys

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
