"""The image size the warm-up runs on: the one rule the node, the offline tool, the demo and
lingbot-ros-prebuild call.

The warm-up (Mapper.warm_up) runs dummy frames of a camera image size through the model so that
the cache built, the kernels compiled and the CUDA graph captured serve the live frames. A live
frame of another model input size builds its cache and captures its graph again: a stall at the
first frame. So the warm-up takes the images' own size wherever a front end can know it:

- ``warmup_image_size: WxH``: that size (the user said so); the front ends look for nothing else.
- ``warmup_image_size: auto`` (the default): the size the front end found before the first frame
  (the node: the camera_info beside its image topic; the tools: their source's first image),
  checked as the node checks an image; else FALLBACK, and the front end says why.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..io.decode_errors import DEFAULT_MAX_PIXELS
from ..io.sources import SourceError
from ..stream import ImageError
from ..stream.preprocess import resize_plan
from .settings import parse_image_size

AUTO = "auto"
FALLBACK = (640, 480)   # a common camera's, where nothing says otherwise


@dataclasses.dataclass(frozen=True)
class FoundSize:
    """What a front end learnt of its images' size before the first frame: ``size``, or why not
    (``absent``: nothing to read in time; ``refused``: what came was bad)."""

    where: str                              # "camera_info on /cam/camera_info", "the first image of ..."
    size: tuple[int, int] | None = None     # (width, height)
    absent: str = ""
    refused: str = ""


@dataclasses.dataclass(frozen=True)
class WarmupSize:
    width: int
    height: int
    model_input: tuple[int, int]   # (width, height) the preprocessor makes of it
    source: str                    # where the size came from, for the log
    warning: str = ""              # a size found but refused: the front end warns

    @property
    def text(self) -> str:
        return f"{self.width}x{self.height}"

    def describe(self) -> str:
        """'518x294 images (from ...; model input 518x294)'."""
        return f"{self.text} images ({self.source}; model input {self.model_input[0]}x{self.model_input[1]})"

    def mismatch(self, image_wh: tuple[int, int], model_wh: tuple[int, int]) -> str:
        """Why the first real image does not use what was warmed up ('' where its model input is this one's)."""
        if model_wh == self.model_input:
            return ""
        return (f"the first image ({image_wh[0]}x{image_wh[1]}, model input {model_wh[0]}x{model_wh[1]}) is not the "
                f"size the warm-up ran on, {self.describe()}: its cache is built again (on CUDA its graph captured "
                "again); set warmup_image_size to the camera's WxH")


def run_warmup(session, preprocessor, size: WarmupSize) -> None:
    """Dummy frames of ``size`` through both phases of ``session`` (kernel builds, the CUDA graph
    capture, which survives the reset), then the session left empty."""
    image = preprocessor(np.full((size.height, size.width, 3), 128, np.uint8))
    with torch.inference_mode():
        # With num_scale_frames > 1 step() only buffers; closing phase 1 runs it.
        session.step(image)
        session.close_scale_phase()
        session.step(image)
    session.reset()


def found_in_source(source) -> FoundSize:
    """The size of an io/sources.py source's first image that decodes (the tools' ``auto``)."""
    where = f"the first image of {source.description}"
    try:
        size = source.first_size()
    except SourceError as error:
        return FoundSize(where, refused=str(error))
    return FoundSize(where, size) if size is not None else FoundSize(where, absent="no frame decodes")


def image_size_error(width: int, height: int, image_width: int, max_pixels: int = DEFAULT_MAX_PIXELS) -> str | None:
    """Why an image of ``width`` x ``height`` cannot be warmed up on (None: it can): the bounds
    the node puts on an image, and the preprocessor's at ``image_width``."""
    if width * height > max_pixels:
        return f"{width}x{height} is more than {max_pixels} pixels (such images are refused as bad input)"
    try:
        resize_plan(width, height, image_width)
    except ImageError as error:
        return str(error)
    return None


def warmup_size(settings, found: FoundSize | None = None, max_pixels: int = DEFAULT_MAX_PIXELS) -> WarmupSize:
    """The size to warm ``settings`` (MapperSettings) up on, given what the front end ``found``
    (None: it had nothing to look at)."""
    explicit = parse_image_size(settings.warmup_image_size)

    def chosen(size, source, warning=""):
        plan = resize_plan(*size, settings.image_width)
        return WarmupSize(size[0], size[1], (plan.width, plan.height), source, warning)

    if explicit is not None:
        return chosen(explicit, "warmup_image_size")
    default = "the default"
    if found is None:
        return chosen(FALLBACK, f"{default}: nothing to read the images' size from")
    if found.size is None:
        if found.refused:
            return chosen(FALLBACK, default, f"{found.where} refused: {found.refused}")
        return chosen(FALLBACK, f"{default}: {found.where}: {found.absent}")
    error = image_size_error(*found.size, settings.image_width, max_pixels)
    if error:
        return chosen(FALLBACK, default, f"{found.where} refused: {error}")
    return chosen(found.size, f"from {found.where}")
