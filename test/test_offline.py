"""tools/offline.py: output writing on hand-made results, and end to end on the tiny fixture."""
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch

from lingbot_ros.mapping import VoxelMap, depth_to_points, read_ply, read_tum
from lingbot_ros.model import ModelConfig, build_model, load_checkpoint
from lingbot_ros.stream import Preprocessor, StreamingSession, StreamSettings
from lingbot_ros.tools.offline import OutputWriter, main
from lingbot_ros.io.sources import SyntheticSource



def fake_result(index, is_keyframe, height=4, width=6, depth_m=2.0):
    """A FrameResult-shaped object (docs/interfaces.md) with known geometry."""
    intrinsic = torch.tensor([[5.0, 0, width / 2], [0, 5.0, height / 2], [0, 0, 1]])
    extrinsic = torch.zeros(3, 4)
    extrinsic[:, :3] = torch.eye(3)
    extrinsic[0, 3] = 10.0 * index                   # camera moves along x; frames never overlap
    depth = torch.full((height, width), depth_m)
    depth[0, 0] = 70.0                               # beyond the 16-bit PNG range
    conf = torch.full((height, width), 2.0)
    conf[1, :] = 1.0                                 # one low-confidence row
    image = torch.rand(3, height, width)
    return SimpleNamespace(index=index, is_keyframe=is_keyframe, extrinsic=extrinsic,
                           intrinsic=intrinsic, depth=depth, depth_conf=conf, image=image,
                           world_points=depth_to_points(depth, intrinsic, extrinsic),
                           image_size=(width, height))


@pytest.mark.parametrize("depth_format", ["png16", "npy"])
def test_output_writer_files(tmp_path, depth_format):
    writer = OutputWriter(tmp_path, depth_format, VoxelMap(1e-3), min_confidence=1.5,
                          point_stride=1)
    for i in range(3):
        writer.add(fake_result(i, is_keyframe=i != 1), stamp_s=100.0 + 0.5 * i)
    outputs = writer.close()

    trajectory = read_tum(tmp_path / "trajectory.tum")
    np.testing.assert_allclose(trajectory.stamps_s(), [100.0, 100.5, 101.0])
    np.testing.assert_allclose(trajectory.c2w()[:, 0, 3], [0, 10, 20], atol=1e-9)

    if depth_format == "png16":
        depth = cv2.imread(str(tmp_path / "depth" / "000001.png"), cv2.IMREAD_UNCHANGED)
        assert depth.dtype == np.uint16 and depth.shape == (4, 6)
        assert depth[1, 1] == 2000 and depth[0, 0] == 65535     # millimetres, clipped
    else:
        depth = np.load(tmp_path / "depth" / "000001.npy")
        assert depth.dtype == np.float32 and depth[1, 1] == 2.0 and depth[0, 0] == 70.0

    lines = (tmp_path / "frames.csv").read_text().splitlines()
    assert lines[0] == "index,stamp_s,is_keyframe,fx,fy,cx,cy,depth"
    assert lines[2].split(",")[:3] == ["1", "100.500000000", "0"]

    # Keyframes 0 and 2 only, minus the low-confidence row: 2 * 3 rows * 6 pixels, each its own
    # voxel at 1 mm voxels.
    xyz, rgb = read_ply(tmp_path / "map.ply")
    assert len(xyz) == outputs["map_points"] == 2 * 3 * 6
    assert sorted(set(np.round(xyz[:, 2], 3))) == [2.0, 70.0]


# ------------------------------------------------------------------------ end to end

def needs(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is absent (see ../shared/data/README.md and fixtures/README.md)")
    return path


@pytest.fixture
def fixture_dir(shared_dir) -> Path:
    """The tiny_default parity fixture: a small architecture with seeded random weights."""
    return needs(shared_dir / "fixtures" / "tiny_default")


def run_offline(tmp_path, fixture_dir, input_path, *extra):
    out = tmp_path / "out"
    argv = ["--config", str(fixture_dir / "config.json"),
            "--checkpoint", str(fixture_dir / "ckpt.pt"),
            "--input", str(needs(input_path)), "--output", str(out), "--device", "cpu",
            "--max-frames", "12", "--num-scale-frames", "3", "--scale-frames", "3",
            "--window", "4", "--image-width", "112", "--min-confidence", "1.0",
            "--voxel-size", "0.05", *extra]
    assert main(argv) == 0
    return out


def check_outputs(out, expected_stamps_s, depth_suffix=".png"):
    trajectory = read_tum(out / "trajectory.tum")
    assert len((out / "trajectory.tum").read_text().splitlines()) == 12
    np.testing.assert_allclose(trajectory.stamps_s(), expected_stamps_s, atol=1e-6)
    assert np.all(np.diff(trajectory.stamps_s()) > 0)
    rotations = trajectory.c2w()[:, :3, :3]
    np.testing.assert_allclose(rotations @ rotations.transpose(0, 2, 1),
                               np.broadcast_to(np.eye(3), rotations.shape), atol=1e-6)
    # 518x294 sources at width 112: height round(294 * 112 / 518 / 14) * 14 = 70 (spec 3).
    for i in range(12):
        path = out / "depth" / f"{i:06d}{depth_suffix}"
        depth = (cv2.imread(str(path), cv2.IMREAD_UNCHANGED) if depth_suffix == ".png"
                 else np.load(path))
        assert depth.shape == (70, 112), path
        assert depth.dtype == (np.uint16 if depth_suffix == ".png" else np.float32)
    xyz, rgb = read_ply(out / "map.ply")
    assert len(xyz) > 0 and np.isfinite(xyz).all()


@pytest.mark.slow
def test_offline_loop_jpg(tmp_path, capsys, shared_dir, fixture_dir):
    out = run_offline(tmp_path, fixture_dir, shared_dir / "data" / "loop_jpg", "--rate-hz", "5")
    check_outputs(out, 0.2 * np.arange(12))
    captured = capsys.readouterr()
    assert "frame 12/12" in captured.err
    assert "frames: 12 (12 keyframes)" in captured.out and "map.ply" in captured.out


@pytest.mark.slow
def test_offline_courthouse_bag_npy_keyframe_interval(tmp_path, capsys, shared_dir, fixture_dir):
    out = run_offline(tmp_path, fixture_dir, shared_dir / "data" / "courthouse_bag",
                      "--depth-format", "npy", "--keyframe-interval", "2")
    check_outputs(out, 1_700_000_000 + 0.1 * np.arange(12), depth_suffix=".npy")
    # 3 scale frames, then streamed frames 3..11 with every 2nd a keyframe: 3, 5, 7, 9, 11.
    assert "frames: 12 (8 keyframes)" in capsys.readouterr().out


def test_offline_refuses_without_checkpoint(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--input", "synthetic:64x48:2", "--output", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--random-weights" in capsys.readouterr().err


def test_offline_random_weights_warns(tmp_path, capsys, fixture_dir):
    code = main(["--config", str(fixture_dir / "config.json"), "--random-weights",
                 "--input", "synthetic:112x84:3", "--output", str(tmp_path), "--device", "cpu",
                 "--num-scale-frames", "2", "--image-width", "112", "--min-confidence", "1.0"])
    assert code == 0
    assert "UNTRAINED" in capsys.readouterr().err
    assert len((tmp_path / "trajectory.tum").read_text().splitlines()) == 3


def test_offline_reports_bad_input(tmp_path, capsys):
    code = main(["--config", "tiny", "--random-weights",
                 "--input", str(tmp_path / "missing"), "--output", str(tmp_path / "o")])
    assert code == 1
    assert "does not exist" in capsys.readouterr().err


def test_offline_endless_source_needs_max_frames(tmp_path, capsys):
    code = main(["--random-weights", "--input", "synthetic", "--output", str(tmp_path)])
    assert code == 1
    assert "pass --max-frames" in capsys.readouterr().err


def test_offline_short_sequence_closes_scale_phase(tmp_path, fixture_dir):
    """Fewer frames than --num-scale-frames: phase 1 runs on what arrived (spec 13)."""
    code = main(["--config", str(fixture_dir / "config.json"),
                 "--checkpoint", str(fixture_dir / "ckpt.pt"), "--input", "synthetic:112x84:2",
                 "--output", str(tmp_path), "--device", "cpu", "--image-width", "112"])
    assert code == 0
    assert len(read_tum(tmp_path / "trajectory.tum")) == 2


def test_stream_world_points_are_spec_unprojection(fixture_dir):
    """The stream's world_points (used for the map) equal mapping.depth_to_points (spec 12)."""
    model = build_model(ModelConfig.from_json(fixture_dir / "config.json"), device="cpu")
    load_checkpoint(model, fixture_dir / "ckpt.pt")
    session = StreamingSession(model, StreamSettings(num_scale_frames=2))
    preprocess = Preprocessor(target_width=112)
    results = []
    with torch.inference_mode():
        for frame in SyntheticSource(112, 84, num_frames=3):
            results += session.step(preprocess(frame.rgb))
    assert [r.index for r in results] == [0, 1, 2]
    for r in results:
        expected = depth_to_points(r.depth, r.intrinsic, r.extrinsic)
        torch.testing.assert_close(r.world_points, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("flag,value", [("--voxel-size", "0"), ("--point-stride", "0"),
                                        ("--max-frames", "0")])
def test_offline_rejects_bad_numbers(tmp_path, capsys, flag, value):
    code = main(["--random-weights", "--input", "synthetic:64x48:2", "--output", str(tmp_path),
                 flag, value])
    assert code == 1
    assert f"{flag} must be" in capsys.readouterr().err


def test_progress_steady_rate_leaves_out_the_warm_up(monkeypatch, capsys):
    from lingbot_ros.tools import offline

    # start; frame 1 takes 10 s (scale batch, JIT) and gives no result; frames 2-3 take 1 s each
    clock = iter([0.0, 10.0, 11.0, 12.0, 12.0])
    monkeypatch.setattr(offline.time, "perf_counter", lambda: next(clock))
    progress = offline.Progress(3)
    progress.update(1, have_results=False)
    progress.update(2, have_results=True)
    progress.update(3, have_results=True)
    progress.finish()
    assert progress.elapsed_s == 12.0
    assert progress.steady_fps(3) == pytest.approx(1.0)
    assert "frame 3/3  1.00 FPS" in capsys.readouterr().err   # the recent rate, not 3 / 12 s
