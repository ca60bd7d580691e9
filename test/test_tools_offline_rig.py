"""lingbot-ros-offline with a camera rig: two real sequences in, one map and per-camera files out.

The tiny fixture checkpoint at a 112-pixel width on CPU, as test_tools_offline.py runs it; every
file written is read back (PLY and TUM with the repo's readers, depth PNGs with OpenCV, the frame
tables with csv) and checked against what a single-camera run of each input writes.
"""
import csv

import cv2
import numpy as np
import pytest

from lingbot_ros.mapping.files.export import read_ply, read_tum
from lingbot_ros.tools.offline import main

from helpers import GET_SHARED, need_path

pytestmark = pytest.mark.usefixtures("torch_single_thread")


@pytest.fixture
def fixture_dir(shared_dir):
    return need_path(shared_dir / "fixtures" / "tiny_default", how=GET_SHARED)


def argv(fixture_dir, out, *extra):
    return ["--model-config", str(fixture_dir / "config.json"), "--checkpoint", str(fixture_dir / "ckpt.pt"),
            "--output", str(out), "--device", "cpu", "--num-scale-frames", "3", "--scale-frames", "3",
            "--sliding-window", "4", "--image-width", "112", "--min-confidence", "0.0",
            "--map-voxel-size-m", "0.05", "--map-database", "", "--rate-hz", "5", *extra]


def table(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_offline_rig_of_two_sequences_writes_one_map_and_each_cameras_files(tmp_path, capsys, shared_dir,
                                                                             fixture_dir):
    front = need_path(shared_dir / "data" / "courthouse_jpg", how=GET_SHARED)
    back = need_path(shared_dir / "data" / "loop_jpg", how=GET_SHARED)
    out = tmp_path / "rig"
    assert main(argv(fixture_dir, out, "--input", str(front), "--input", str(back), "--cameras", "front,back",
                     "--max-frames", "8")) == 0
    captured = capsys.readouterr()
    assert "camera front (primary): 8 frames" in captured.out and "camera back (scale " in captured.out
    assert "groups: 8 (8 with a frame of every camera" in captured.out   # equal stamps: one group each
    # Each camera's files equal a single-camera run of its input (the rig's batched steps are exact).
    for camera, source in (("front", front), ("back", back)):
        single = tmp_path / camera
        assert main(argv(fixture_dir, single, "--input", str(source), "--max-frames", "8")) == 0
        rig_poses, alone = read_tum(out / f"trajectory_{camera}.tum"), read_tum(single / "trajectory.tum")
        assert rig_poses.stamps_ns().tolist() == alone.stamps_ns().tolist() == [k * 200_000_000 for k in range(8)]
        if camera == "front":   # the primary: its own scale
            np.testing.assert_allclose(rig_poses.poses(), alone.poses(), atol=1e-5)
        rows, alone_rows = table(out / f"frames_{camera}.csv"), table(single / "frames.csv")
        assert [r["index"] for r in rows] == [str(k) for k in range(8)]
        assert [r["stamp_s"] for r in rows] == [r["stamp_s"] for r in alone_rows]
        for row, alone_row in zip(rows, alone_rows):
            depth = cv2.imread(str(out / row["depth"]), cv2.IMREAD_UNCHANGED)
            expected = cv2.imread(str(single / alone_row["depth"]), cv2.IMREAD_UNCHANGED)
            assert row["depth"].startswith(f"depth_{camera}/") and depth.shape == (70, 112)
            assert np.abs(depth.astype(int) - expected.astype(int)).max() <= 1   # mm rounding
    xyz, rgb = read_ply(out / "map.ply")
    front_xyz, _ = read_ply(tmp_path / "front" / "map.ply")
    assert len(xyz) >= len(front_xyz) > 0 and np.isfinite(xyz).all() and rgb.dtype == np.uint8
    assert (out / "preview.png").exists()
    assert not (out / "trajectory.tum").exists() and not (out / "frames.csv").exists()


def test_offline_rig_refusals_say_what_to_change(tmp_path, capsys, shared_dir, fixture_dir):
    front = str(need_path(shared_dir / "data" / "courthouse_jpg", how=GET_SHARED))
    cases = [
        (["--input", front, "--input", front], "name their cameras, --cameras NAME,NAME"),
        (["--input", front, "--input", front, "--cameras", "a"], "--cameras names 1 cameras for 2 --input"),
        (["--input", front, "--input", front, "--cameras", "a,a"], "must name each camera once"),
        (["--input", front, "--input", front, "--cameras", "a,b", "--primary-camera", "c"],
         "primary_camera 'c' is not one of cameras (a, b)"),
        (["--input", front, "--input", front, "--cameras", "a,b", "--topic", "/x", "--topic", "/y",
          "--topic", "/z"], "3 --topic for 2 --input"),
    ]
    for extra, says in cases:
        assert main(argv(fixture_dir, tmp_path / "out", *extra)) == 1
        assert says in capsys.readouterr().err, extra
    # Inputs whose stamps never meet (a bag of 2023 and a folder from 0 s) run in groups of one camera.
    assert main(argv(fixture_dir, tmp_path / "apart", "--input", front, "--input",
                     str(need_path(shared_dir / "data" / "courthouse_bag", how=GET_SHARED)),
                     "--cameras", "folder,bag", "--max-frames", "4")) == 0
    assert "groups: 8 (0 with a frame of every camera" in capsys.readouterr().out
    no_database = [a for a in argv(fixture_dir, tmp_path / "out") if a not in ("--map-database", "")]
    assert main(no_database + ["--input", front, "--input", front, "--cameras", "a,b"]) == 1
    assert "set map_database to ''" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
