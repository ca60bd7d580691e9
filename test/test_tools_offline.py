"""tools/offline.py: output writing on hand-made results, and end to end on the tiny fixture."""
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch

from lingbot_ros.mapping.store.points import depth_to_points
from lingbot_ros.mapping.files.export import read_ply, read_tum
from lingbot_ros.mapping.placement.conversion import Placement
from lingbot_ros.mapping.records import InputFrame, MapperOutput
from lingbot_ros.mapping.files.staged_files import StagedFiles
from lingbot_ros.model import ModelConfig, build_model, load_checkpoint
from lingbot_ros.stream import Preprocessor, StreamingSession, StreamSettings
from lingbot_ros.tools.offline import FrameWriter, main
from lingbot_ros.io.sources import SyntheticSource

from helpers import GET_SHARED, need_path



def fake_output(index, is_keyframe, height=4, width=6, depth_m=2.0, stamp_s=0.0):
    """A MapperOutput with known geometry (docs/interfaces.md)."""
    intrinsic = torch.tensor([[5.0, 0, width / 2], [0, 5.0, height / 2], [0, 0, 1]])
    extrinsic = torch.zeros(3, 4)
    extrinsic[:, :3] = torch.eye(3)
    depth = torch.full((height, width), depth_m)
    depth[0, 0] = 70.0                               # beyond the 16-bit PNG range
    result = SimpleNamespace(intrinsic=intrinsic, extrinsic=extrinsic, depth=depth, is_keyframe=is_keyframe)
    frame = InputFrame(rgb=np.zeros((height, width, 3), np.uint8), stamp_ns=round(stamp_s * 1e9))
    return MapperOutput(frame=frame, index=index, camera_pose=np.eye(4), base_pose=np.eye(4),
                        internal_pose=np.eye(4), trusted=True, is_keyframe=is_keyframe, provisional=False,
                        placement=Placement(), result=result)


@pytest.mark.parametrize("depth_format", ["png16", "npy"])
def test_frame_writer_files(tmp_path, depth_format):
    staged = StagedFiles()
    writer = FrameWriter(tmp_path, depth_format, staged)
    writer.add([fake_output(i, is_keyframe=i != 1, stamp_s=100.0 + 0.5 * i) for i in (0, 2)])
    writer.add([fake_output(1, is_keyframe=False, stamp_s=100.5)])     # finalised later: rows sort
    table = writer.close()
    assert not table.exists() and not any(p.suffix != ".tmp" for p in (tmp_path / "depth").iterdir())
    staged.commit()   # only now do the files appear, all together
    assert writer.num_frames == 3 and writer.num_keyframes == 2
    if depth_format == "png16":
        depth = cv2.imread(str(tmp_path / "depth" / "000001.png"), cv2.IMREAD_UNCHANGED)
        assert depth.dtype == np.uint16 and depth.shape == (4, 6)
        assert depth[1, 1] == 2000 and depth[0, 0] == 65535     # millimetres, clipped
    else:
        depth = np.load(tmp_path / "depth" / "000001.npy")
        assert depth.dtype == np.float32 and depth[1, 1] == 2.0 and depth[0, 0] == 70.0
    lines = table.read_text().splitlines()
    assert lines[0] == "index,stamp_s,is_keyframe,fx,fy,cx,cy,depth"
    assert [line.split(",")[:3] for line in lines[1:]] == [["0", "100.000000000", "1"],
                                                           ["1", "100.500000000", "0"],
                                                           ["2", "101.000000000", "1"]]


# ------------------------------------------------------------------------ end to end

def needs(path: Path) -> Path:
    return need_path(path, how=f"{GET_SHARED}; see ../shared/data/README.md and fixtures/README.md")


@pytest.fixture
def fixture_dir(shared_dir) -> Path:
    """The tiny_default parity fixture: a small architecture with seeded random weights."""
    return needs(shared_dir / "fixtures" / "tiny_default")


def run_offline(tmp_path, fixture_dir, input_path, *extra):
    out = tmp_path / "out"
    argv = ["--model-config", str(fixture_dir / "config.json"),
            "--checkpoint", str(fixture_dir / "ckpt.pt"),
            "--input", str(needs(input_path)), "--output", str(out), "--device", "cpu",
            "--max-frames", "12", "--num-scale-frames", "3", "--scale-frames", "3",
            "--sliding-window", "4", "--image-width", "112", "--min-confidence", "1.0",
            "--map-voxel-size-m", "0.05", *extra]
    assert main(argv) == 0
    return out


def check_outputs(out, expected_stamps_ns, depth_suffix=".png"):
    trajectory = read_tum(out / "trajectory.tum")
    assert len((out / "trajectory.tum").read_text().splitlines()) == 12
    assert trajectory.stamps_ns().tolist() == expected_stamps_ns
    rotations = trajectory.poses()[:, :3, :3]
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
    check_outputs(out, [k * 200_000_000 for k in range(12)])
    captured = capsys.readouterr()
    assert "lingbot-ros-offline: 12/12 frame (100%)" in captured.err
    assert "frames: 12 (12 keyframes)" in captured.out and "map.ply" in captured.out


@pytest.mark.slow
def test_offline_courthouse_bag_npy_keyframe_interval(tmp_path, capsys, shared_dir, fixture_dir):
    out = run_offline(tmp_path, fixture_dir, shared_dir / "data" / "courthouse_bag",
                      "--depth-format", "npy", "--keyframe-interval", "2")
    check_outputs(out, [1_700_000_000 * 10**9 + k * 10**8 for k in range(12)], depth_suffix=".npy")
    # 3 scale frames, then streamed frames 3..11 with every 2nd a keyframe: 3, 5, 7, 9, 11.
    assert "frames: 12 (8 keyframes)" in capsys.readouterr().out


def test_offline_refuses_without_checkpoint(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--input", "synthetic:64x48:2", "--output", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--random-weights" in capsys.readouterr().err


def test_offline_random_weights_warns(tmp_path, capsys, fixture_dir):
    code = main(["--model-config", str(fixture_dir / "config.json"), "--random-weights",
                 "--input", "synthetic:112x84:3", "--output", str(tmp_path), "--device", "cpu",
                 "--num-scale-frames", "2", "--image-width", "112", "--min-confidence", "1.0"])
    assert code == 0
    assert "UNTRAINED" in capsys.readouterr().err
    assert len((tmp_path / "trajectory.tum").read_text().splitlines()) == 3


def test_offline_reports_bad_input(tmp_path, capsys):
    code = main(["--model-config", "tiny", "--random-weights",
                 "--input", str(tmp_path / "missing"), "--output", str(tmp_path / "o")])
    assert code == 1
    assert "does not exist" in capsys.readouterr().err


def test_offline_endless_source_needs_max_frames(tmp_path, capsys):
    code = main(["--random-weights", "--input", "synthetic", "--output", str(tmp_path)])
    assert code == 1
    assert "pass --max-frames" in capsys.readouterr().err


def test_offline_short_sequence_closes_scale_phase(tmp_path, fixture_dir):
    """Fewer frames than --num-scale-frames: phase 1 runs on what arrived (spec 13)."""
    code = main(["--model-config", str(fixture_dir / "config.json"),
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


@pytest.mark.parametrize("flag,value", [("--map-voxel-size-m", "0"), ("--map-points-stride", "0"),
                                        ("--max-frames", "0"), ("--sliding-window", "0")])
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
    assert "lingbot-ros-offline: 3/3 frame (100%)" in capsys.readouterr().err   # not a terminal: a line


@pytest.mark.slow
def test_offline_windowed_writes_every_frame_and_the_window_transforms(tmp_path, capsys, shared_dir, fixture_dir):
    out = run_offline(tmp_path, fixture_dir, shared_dir / "data" / "loop_jpg", "--max-frames", "24",
                      "--mode", "windowed", "--window-size", "10", "--overlap-size", "4")
    assert len(read_tum(out / "trajectory.tum")) == 24
    assert len((out / "frames.csv").read_text().splitlines()) == 25
    rows = (out / "windows.csv").read_text().splitlines()
    # S = 24, L = 10, ov = 4, step 6: windows start at frames 0, 6, 12 and 18.
    assert rows[0].startswith("window,first_index,scale,r00")
    assert [row.split(",")[:2] for row in rows[1:]] == [["0", "0"], ["1", "6"], ["2", "12"], ["3", "18"]]
    scales = [float(row.split(",")[2]) for row in rows[1:]]
    assert scales[0] == 1.0 and all(s > 0 for s in scales)


def _damaged_copy(source: Path, dest: Path, damage: dict[int, str]) -> None:
    """The first 8 JPEGs of ``source`` into ``dest``; ``damage``: frame -> "bytes before EOI"
    (libjpeg warns, the pixels are exact) or "cut" (a stream cut inside its scan, closed by EOI)."""
    dest.mkdir()
    for i, path in enumerate(sorted(needs(source).glob("*.jpg"))[:8]):
        jpeg = path.read_bytes()
        if damage.get(i) == "bytes before EOI":
            jpeg = jpeg[:-2] + bytes(16) + b"\xff\xd9"
        elif damage.get(i) == "cut":
            jpeg = jpeg[:len(jpeg) // 2] + b"\xff\xd9"
        (dest / path.name).write_bytes(jpeg)


def test_offline_skips_an_undecodable_frame_and_says_so(tmp_path, capsys, shared_dir, fixture_dir):
    # Regression: one damaged JPEG ended the whole run with nothing saved; the node skips it.
    folder = tmp_path / "frames"
    _damaged_copy(shared_dir / "data" / "courthouse_jpg", folder, {5: "cut"})
    out = run_offline(tmp_path, fixture_dir, folder, "--max-frames", "8")
    captured = capsys.readouterr()
    assert "frames: 7 (7 keyframes)" in captured.out and "1 did not decode and were skipped" in captured.out
    assert "rejected: frame skipped: image" in captured.err and "000005" in captured.err
    stamps = read_tum(out / "trajectory.tum").stamps_ns().tolist()
    assert stamps == [k * 10**8 for k in (0, 1, 2, 3, 4, 6, 7)]


def test_no_strict_jpeg_takes_frames_libjpeg_only_warns_about(tmp_path, capsys, shared_dir, fixture_dir):
    folder = tmp_path / "frames"
    _damaged_copy(shared_dir / "data" / "courthouse_jpg", folder, {i: "bytes before EOI" for i in range(8)})
    argv = ["--model-config", str(fixture_dir / "config.json"), "--checkpoint", str(fixture_dir / "ckpt.pt"),
            "--input", str(folder), "--output", str(tmp_path / "strict"), "--device", "cpu", "--image-width", "112"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "no frame of the input decoded (8 tried)" in err and "--no-strict-jpeg offline) accepts them" in err
    out = run_offline(tmp_path, fixture_dir, folder, "--max-frames", "8", "--no-strict-jpeg")
    assert "frames: 8 (8 keyframes)" in capsys.readouterr().out
    assert len(read_tum(out / "trajectory.tum")) == 8


def test_offline_warms_up_on_its_inputs_first_image_that_decodes(tmp_path, capsys, shared_dir, fixture_dir):
    """Issue 26, item 6: the warm-up on the input's own size (518x294, not the 640x480 default), so
    the first frame builds nothing again; a damaged first image is passed over for it and
    reported once, by the run."""
    folder = tmp_path / "frames"
    _damaged_copy(shared_dir / "data" / "courthouse_jpg", folder, {0: "cut"})
    run_offline(tmp_path, fixture_dir, folder, "--max-frames", "5")
    err = capsys.readouterr().err
    assert (f"warming up on 518x294 images (from the first image of folder {folder} (8 images at 10 Hz); "
            "model input 112x70)") in err
    assert err.count("rejected: frame skipped: image") == 1 and "000000" in err


def test_offline_resume_says_what_it_continues_or_why_a_new_map_starts(tmp_path, capsys, fixture_dir):
    """--resume prints the Mapper's resume text, as the node logs it: the run it continues, or
    (nothing stored, a damaged run) why a new map starts."""
    database = tmp_path / "map.db"

    def run(out: str) -> str:
        code = main(["--model-config", str(fixture_dir / "config.json"), "--checkpoint", str(fixture_dir / "ckpt.pt"),
                     "--input", "synthetic:112x84:5", "--output", str(tmp_path / out), "--device", "cpu",
                     "--num-scale-frames", "2", "--image-width", "112", "--min-confidence", "1.0",
                     "--map-database", str(database), "--resume"])
        assert code == 0
        return capsys.readouterr().err

    first = run("first")
    assert "lingbot-ros-offline: resume:" in first and "new map" in first, first
    second = run("second")
    assert "lingbot-ros-offline: resume" in second and "run 1" in second, second
