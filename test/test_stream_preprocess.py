"""Preprocessor (spec 3): output sizes, crop, exact (PIL) vs fast (torch) paths, intrinsics back-mapping."""
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lingbot_ros.model.geometry import pose_to_intrinsic
from lingbot_ros.stream import FrameResult, ImageError, Preprocessor, resize_plan

from helpers import need_path

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def image(w, h, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize("size, out", [((640, 480), (518, 392)), ((1280, 720), (518, 294)),
                                       ((518, 294), (518, 294)), ((480, 640), (518, 518)),
                                       ((1000, 720), (518, 378))])
@pytest.mark.parametrize("exact", [True, False])
def test_output_sizes(size, out, exact):
    x = Preprocessor(exact=exact)(image(*size))
    assert x.shape == (3, out[1], out[0]) and x.dtype == torch.float32
    assert 0 <= x.min() and x.max() <= 1


def test_height_rounds_half_to_even():
    # 518 wide: height/14 = k + 0.5 exactly -> Python's round picks the even k.
    assert resize_plan(518, 21).height == 28      # 1.5 -> 2
    assert resize_plan(518, 35).height == 28      # 2.5 -> 2
    assert resize_plan(518, 49).height == 56      # 3.5 -> 4


def test_portrait_is_centre_cropped():
    plan = resize_plan(480, 640)
    assert (plan.width, plan.resized_height, plan.height, plan.crop_top) == (518, 686, 518, 84)
    src = image(480, 640)
    full = np.asarray(Image.fromarray(src).resize((518, 686), Image.BICUBIC))
    x = Preprocessor(exact=True)(src)
    expected = torch.from_numpy(full[84:84 + 518].copy()).permute(2, 0, 1).float() / 255
    torch.testing.assert_close(x, expected, rtol=0, atol=0)


def test_native_size_is_unchanged_on_both_paths():
    src = image(518, 294)
    expected = torch.from_numpy(src).permute(2, 0, 1).float() / 255
    for exact in (True, False):
        torch.testing.assert_close(Preprocessor(exact=exact)(src), expected, rtol=0, atol=1e-6)


def test_bgr_flag_swaps_channels():
    src = image(100, 60)
    torch.testing.assert_close(Preprocessor(bgr=True)(src[:, :, ::-1]), Preprocessor()(src))


def test_bad_inputs_are_refused():
    with pytest.raises(ImageError, match="uint8 HxWx3"):
        Preprocessor()(np.zeros((10, 10), np.uint8))
    with pytest.raises(ImageError, match="uint8 HxWx3"):
        Preprocessor()(np.zeros((10, 10, 3), np.float32))
    with pytest.raises(ImageError, match="too wide"):
        resize_plan(5000, 20)
    with pytest.raises(ImageError, match="smaller than one patch"):
        resize_plan(1, 1)
    with pytest.raises(ImageError, match="smaller than one patch"):
        resize_plan(4000, 10)


def exact_vs_fast(paths, size):
    worst, means = 0.0, []
    ex, fast = Preprocessor(exact=True), Preprocessor(exact=False)
    for path in paths:
        src = np.asarray(Image.open(path).convert("RGB").resize(size, Image.LANCZOS))
        diff = (ex(src) - fast(src)).abs()
        worst, means = max(worst, diff.max().item()), means + [diff.mean().item()]
    return worst, float(np.mean(means))


@pytest.mark.parametrize("scene", ["courthouse_jpg", "loop_jpg"])
def test_fast_path_is_close_to_pil_on_real_frames(shared_dir, scene):
    folder = need_path(shared_dir / "data" / scene, "real frames (to compare the PIL and torch resizes)")
    paths = sorted(Path(folder).glob("*.jpg"))[::40]
    # The frames are stored at 518x294, the model size; upscale them to camera sizes first so both
    # paths have to resample (measured over every 5th frame: max 5/255, mean 0.14/255).
    for size in ((1280, 720), (640, 480)):
        worst, mean = exact_vs_fast(paths, size)
        assert worst <= 8 / 255 and mean <= 0.3 / 255, (size, worst * 255, mean * 255)


def test_intrinsic_for_undoes_resize_and_crop():
    pose = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1.0, 1.2])
    for orig, (W, H) in (((640, 480), (518, 392)), ((480, 640), (518, 518))):
        K = pose_to_intrinsic(pose, W, H)
        result = FrameResult(index=0, is_keyframe=True, time_index=0, pose_enc=pose, pose_enc_list=pose[None],
                             extrinsic=torch.zeros(3, 4), intrinsic=K, depth=torch.zeros(H, W),
                             depth_conf=torch.ones(H, W), world_points=torch.zeros(H, W, 3),
                             image=torch.zeros(3, H, W), image_size=(W, H))
        plan = resize_plan(*orig)
        Ko = result.intrinsic_for(*orig)
        sx, sy = orig[0] / W, orig[1] / plan.resized_height
        torch.testing.assert_close(Ko[0], K[0] * torch.tensor([sx, 1, sx]))
        torch.testing.assert_close(Ko[1, 1], K[1, 1] * sy)
        torch.testing.assert_close(Ko[1, 2], (K[1, 2] + plan.crop_top) * sy)
        assert Ko[1, 2].item() == pytest.approx(orig[1] / 2, rel=0.01)   # the centre stays the centre
