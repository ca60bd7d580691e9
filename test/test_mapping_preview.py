"""The pictures: the map preview (mapping/files/preview.py, written by every save) and the benchmark
plots (bench/plots.py), opened and checked as images: their size, that they are not blank, and
that what they must show is there."""
import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lingbot_ros.mapping.files.preview import BACKGROUND, PATH_COLOUR, PreviewError, height_colours, preview_png
from lingbot_ros.mapping.files.staged_files import write_files

from helpers import need_module, need_path

REPO = Path(__file__).resolve().parents[1]


def write_preview(path: Path, *args, **kwargs) -> Path:
    """The preview written as every tool writes it."""
    return write_files({path: preview_png(*args, **kwargs)})[0]


def _pixels(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        assert image.format == "PNG"
        return np.asarray(image.convert("RGB"))


def _not_background(pixels: np.ndarray) -> np.ndarray:
    return (pixels != np.array(BACKGROUND, np.uint8)).any(axis=-1)


def test_preview_shows_points_by_height_and_the_trajectory(tmp_path):
    rng = np.random.default_rng(0)
    low = np.column_stack([rng.uniform(0, 4, 3000), rng.uniform(0, 4, 3000), np.zeros(3000)])   # floor, x < 4
    high = np.column_stack([rng.uniform(6, 10, 3000), rng.uniform(0, 4, 3000), np.full(3000, 2.0)])  # wall
    trajectory = np.column_stack([np.linspace(0, 10, 50), np.full(50, 2.0), np.full(50, 0.5)])
    path = write_preview(tmp_path / "preview.png", np.concatenate([low, high]), trajectory, units="m")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preview.png"]   # no temporary left
    pixels = _pixels(path)
    assert pixels.shape[0] > 300 and pixels.shape[1] > 600
    assert _not_background(pixels).mean() > 0.03
    # The floor's colour (left half of the plot) is the ramp's low end, the wall's its high end.
    floor, wall = height_colours(np.array([0.0, 2.0]), 0.0, 2.0)
    left, right = pixels[:, : pixels.shape[1] // 3], pixels[:, pixels.shape[1] // 2:]
    assert (left == floor).all(axis=-1).sum() > 1000 and not (left == wall).all(axis=-1).any()
    assert (right == wall).all(axis=-1).sum() > 1000
    assert (pixels == np.array(PATH_COLOUR, np.uint8)).all(axis=-1).sum() > 200   # the red trajectory


def test_preview_of_an_empty_map_and_refusals(tmp_path):
    pixels = _pixels(write_preview(tmp_path / "empty.png", np.zeros((0, 3)), np.zeros((0, 3)), units="model units"))
    assert pixels.shape[0] > 100 and _not_background(pixels).any()   # axes and labels at least
    with pytest.raises(PreviewError, match=r"points must be \[N, 3\]"):
        write_preview(tmp_path / "bad.png", np.zeros((5, 2)), np.zeros((0, 3)))
    with pytest.raises(PreviewError, match="colours"):
        write_preview(tmp_path / "bad.png", np.zeros((5, 3)), np.zeros((0, 3)), colours=np.zeros((4, 3)))
    # Non-finite points are left out, not drawn or fatal.
    write_preview(tmp_path / "nan.png", np.array([[np.nan, 0, 0], [1, 1, 1], [2, 2, 2]]), np.zeros((0, 3)))
    assert not (tmp_path / "bad.png").exists()


def test_offline_writes_a_preview_beside_the_map(tmp_path, shared_dir, shared_data, capsys):
    from lingbot_ros.tools.offline import main

    fixture = shared_dir / "fixtures" / "tiny_default"
    need_path(fixture / "ckpt.pt", "tiny fixture")
    out = tmp_path / "out"
    assert main(["--model-config", str(fixture / "config.json"), "--checkpoint", str(fixture / "ckpt.pt"),
                 "--input", str(shared_data("loop_jpg")), "--output", str(out), "--device", "cpu",
                 "--max-frames", "8", "--num-scale-frames", "3", "--scale-frames", "3", "--sliding-window", "4",
                 "--image-width", "112"]) == 0
    assert str(out / "preview.png") in capsys.readouterr().out
    pixels = _pixels(out / "preview.png")
    assert _not_background(pixels).mean() > 0.02
    assert (pixels == np.array(PATH_COLOUR, np.uint8)).all(axis=-1).any()


@pytest.fixture(scope="module")
def plots():
    need_module("matplotlib", "the bench extra: pip install '.[bench]'; scripts/setup.sh installs requirements-dev.txt")
    spec = importlib.util.spec_from_file_location("plots", REPO / "bench" / "plots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_frame_time_plot_marks_the_window_switches(plots, tmp_path):
    rng = np.random.default_rng(1)
    window = np.repeat(np.arange(5), 400)
    frame_ms = rng.normal(36, 1, 2000)
    frame_ms[1:][window[1:] != window[:-1]] = 340.0
    pixels = _pixels(plots.frame_times(frame_ms, window, tmp_path / "frame_times.png", "test"))
    assert pixels.shape[0] > 300 and pixels.shape[1] > 800
    assert pixels.std() > 10
    red = (pixels[..., 0] > 180) & (pixels[..., 1] < 80) & (pixels[..., 2] < 80)   # the switch markers
    assert red.sum() > 20
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frame_times.png"]


def test_the_latency_histogram_and_the_long_run_folder(plots, tmp_path):
    rng = np.random.default_rng(2)
    pixels = _pixels(plots.latency_histogram({"10 Hz": list(rng.normal(60, 5, 200)),
                                              "20 Hz": list(rng.normal(80, 5, 200))}, tmp_path / "latency.png"))
    assert pixels.shape[0] > 300 and pixels.std() > 10
    measured = REPO / "bench" / "results" / "long_run_h200_2026-12-01"
    folder = tmp_path / "long_run"
    folder.mkdir()
    for name in ("frame_ms.npy", "window.npy", "summary.json"):
        shutil.copy(measured / name, folder / name)
    assert plots.main(["long-run", str(folder)]) == 0
    assert _pixels(folder / "frame_times.png").std() > 10
    assert _pixels(measured / "frame_times.png").shape == _pixels(folder / "frame_times.png").shape
