"""A top-down picture of a map: its points seen from above, coloured by height, the trajectory
drawn over them, axes in the map's unit. From arrays only (numpy and Pillow), so any map store
can call it.

The map frame is REP 103 (x forward, y left, z up): the picture's right is +x, its top is +y, and
a pixel shows the highest point that falls in it. The extent covers the trajectory and the middle
98% of the points on each axis, so a few stray far points do not shrink the map to a dot.
"""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

SIZE_PX = 900                  # the plot area's longer side
MARGIN = (70, 44, 30, 60)      # left, top, right, bottom
# Height colours, low to high (dark blue, teal, green, yellow).
_RAMP = np.array([(48, 18, 120), (40, 100, 170), (30, 160, 150), (110, 200, 80), (250, 230, 40)], np.float64)


def height_colours(heights: np.ndarray, low: float, high: float) -> np.ndarray:
    """``[N]`` heights -> ``[N, 3]`` uint8 colours along the ramp, clipped to [low, high]."""
    t = np.clip((heights - low) / (high - low), 0.0, 1.0) if high > low else np.full(len(heights), 0.5)
    position = t * (len(_RAMP) - 1)
    lower = np.minimum(position.astype(np.int64), len(_RAMP) - 2)
    frac = (position - lower)[:, None]
    return np.round(_RAMP[lower] * (1 - frac) + _RAMP[lower + 1] * frac).astype(np.uint8)


def write_preview(path: str | Path, points: np.ndarray, trajectory: np.ndarray, units: str = "m",
                  title: str = "") -> Path:
    """Write the PNG atomically (a temporary file in the target directory, then renamed).

    ``points`` ``[N, 3]`` map points; ``trajectory`` ``[M, 3]`` positions, oldest first; ``units``
    labels the axes ("m", or "model units" while the scale is unknown). Non-finite rows are left out.
    """
    points = _rows(points)
    trajectory = _rows(trajectory)
    image = _render(points[np.isfinite(points).all(axis=1)], trajectory[np.isfinite(trajectory).all(axis=1)],
                    units, title)
    path = Path(path)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            image.save(f, format="PNG")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def _rows(array) -> np.ndarray:
    array = np.asarray(array, dtype=np.float64)
    if array.size == 0:
        return np.zeros((0, 3))
    if array.ndim != 2 or array.shape[1] != 3:
        raise ValueError(f"expected [N, 3] positions, got {array.shape}")
    return array


def _extent(points: np.ndarray, trajectory: np.ndarray) -> tuple[float, float, float, float]:
    parts = [trajectory[:, :2]]
    if len(points):
        parts.append(np.percentile(points[:, :2], [1, 99], axis=0))
    xy = np.concatenate(parts) if any(len(p) for p in parts) else np.zeros((1, 2))
    (x0, y0), (x1, y1) = xy.min(axis=0), xy.max(axis=0)
    pad = max(x1 - x0, y1 - y0, 1e-6) * 0.05
    return x0 - pad, y0 - pad, x1 + pad, y1 + pad


def _step(span: float) -> float:
    """A 1-2-5 tick step giving about six ticks over ``span``."""
    raw = span / 6
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _render(points: np.ndarray, trajectory: np.ndarray, units: str, title: str) -> Image.Image:
    x0, y0, x1, y1 = _extent(points, trajectory)
    scale = SIZE_PX / max(x1 - x0, y1 - y0)
    width, height = math.ceil((x1 - x0) * scale), math.ceil((y1 - y0) * scale)
    left, top, right, bottom = MARGIN
    canvas = np.full((height + top + bottom, width + left + right, 3), 255, np.uint8)
    if len(points):
        order = np.argsort(points[:, 2], kind="stable")   # drawn low to high: the highest point wins
        z = points[order, 2]
        colours = height_colours(z, *np.percentile(z, [2, 98]))
        cols = ((points[order, 0] - x0) * scale).astype(np.int64)
        rows = ((y1 - points[order, 1]) * scale).astype(np.int64)
        inside = (cols >= 0) & (cols < width) & (rows >= 0) & (rows < height)
        canvas[top + rows[inside], left + cols[inside]] = colours[inside]
    image = Image.fromarray(canvas)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()

    def pixel(x: float, y: float) -> tuple[float, float]:
        return left + (x - x0) * scale, top + (y1 - y) * scale

    if len(trajectory) > 1:
        draw.line([pixel(x, y) for x, y in trajectory[:, :2]], fill=(220, 30, 30), width=2)
    if len(trajectory):
        for (x, y), colour in ((trajectory[0, :2], (20, 160, 60)), (trajectory[-1, :2], (220, 30, 30))):
            cx, cy = pixel(x, y)
            draw.ellipse((cx - 5, cy - 5, cx + 5, cy + 5), outline=colour, width=2)
    draw.rectangle((left, top, left + width, top + height), outline=(60, 60, 60))
    step = _step(max(x1 - x0, y1 - y0))
    for value in np.arange(math.ceil(x0 / step) * step, x1, step):
        px = pixel(value, y0)[0]
        draw.line((px, top + height, px, top + height + 5), fill=(60, 60, 60))
        draw.text((px, top + height + 8), f"{value:g}", fill=(60, 60, 60), font=font, anchor="mt")
    for value in np.arange(math.ceil(y0 / step) * step, y1, step):
        py = pixel(x0, value)[1]
        draw.line((left - 5, py, left, py), fill=(60, 60, 60))
        draw.text((left - 8, py), f"{value:g}", fill=(60, 60, 60), font=font, anchor="rm")
    draw.text((left + width / 2, top + height + 30), f"x ({units})", fill=(0, 0, 0), font=font, anchor="mt")
    draw.text((left - 8, top - 6), f"y ({units})", fill=(0, 0, 0), font=font, anchor="rb")
    draw.text((left, 6), title or "top-down view, coloured by height (z)", fill=(0, 0, 0), font=font)
    return image
