"""Image preprocessing (spec 3): width 518, height rounded half-to-even to a multiple of 14,
centre crop when taller than wide enough, float in [0, 1] on the model's device.

``exact=True`` reproduces the demo's PIL bicubic resize on the CPU; the default fast path resizes
on the device with antialiased bicubic (measured difference: see the README's Preprocessing section).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image


class ImageError(ValueError):
    """An input image this preprocessor cannot handle."""


@dataclass(frozen=True)
class ResizePlan:
    width: int            # model input width
    height: int           # model input height (after the crop)
    resized_height: int   # height of the resized image before the crop
    crop_top: int         # first kept row of the resized image


def resize_plan(orig_w: int, orig_h: int, target_width: int = 518, patch_size: int = 14) -> ResizePlan:
    if orig_w < patch_size or orig_h < patch_size:
        raise ImageError(f"image {orig_w}x{orig_h} is smaller than one patch ({patch_size} px) on a side")
    # Python's round is half-to-even, as in the demo [quirk].
    new_h = round(orig_h * target_width / orig_w / patch_size) * patch_size
    if new_h < patch_size:
        raise ImageError(f"{orig_w}x{orig_h} is too wide: resized height {new_h} < one patch ({patch_size})")
    height = min(new_h, target_width)
    return ResizePlan(target_width, height, new_h, (new_h - height) // 2)


class Preprocessor:
    """uint8 HxWx3 (RGB, or BGR with bgr=True) of any size -> [3, H, W] float32 in [0, 1] on device."""

    def __init__(self, target_width: int = 518, device="cpu", exact: bool = False, bgr: bool = False,
                 patch_size: int = 14):
        if target_width % patch_size:
            raise ImageError(f"target_width {target_width} is not a multiple of patch_size {patch_size}")
        self.target_width, self.patch_size = target_width, patch_size
        self.device, self.exact, self.bgr = torch.device(device), exact, bgr

    def plan(self, orig_w: int, orig_h: int) -> ResizePlan:
        return resize_plan(orig_w, orig_h, self.target_width, self.patch_size)

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            desc = f"{image.dtype} {image.shape}" if isinstance(image, np.ndarray) else type(image).__name__
            raise ImageError(f"expected a uint8 HxWx3 array, got {desc}")
        if self.bgr:
            image = image[:, :, ::-1]
        plan = self.plan(image.shape[1], image.shape[0])
        out = self._resize_exact(image, plan) if self.exact else self._resize_fast(image, plan)
        return out[:, plan.crop_top:plan.crop_top + plan.height]             # [3, H, W]

    def _upload(self, host: torch.Tensor) -> torch.Tensor:
        """To the device. On CUDA through pinned memory, without blocking: an upload from pageable
        memory waits for every step queued before it (a frame's step queued behind the one
        running, mapping/flights.py, would wait for it)."""
        if self.device.type != "cuda":
            return host.to(self.device)
        return host.pin_memory().to(self.device, non_blocking=True)

    def _resize_exact(self, image: np.ndarray, plan: ResizePlan) -> torch.Tensor:
        pil = Image.fromarray(np.ascontiguousarray(image)).resize((plan.width, plan.resized_height),
                                                                   Image.BICUBIC)
        chw = self._upload(torch.from_numpy(np.asarray(pil).copy())).permute(2, 0, 1)
        return chw.float() / 255.0

    def _resize_fast(self, image: np.ndarray, plan: ResizePlan) -> torch.Tensor:
        # Upload uint8 (4x less traffic than float); copy only if the array is a view or read-only.
        hwc = torch.from_numpy(np.require(image, requirements=["C", "W"]))
        chw = self._upload(hwc).permute(2, 0, 1)
        x = F.interpolate(chw[None].float(), size=(plan.resized_height, plan.width), mode="bicubic",
                          antialias=True, align_corners=False)[0]
        # PIL rounds and clamps to uint8; doing the same keeps the two paths one quantisation apart.
        return x.round_().clamp_(0, 255) / 255.0
