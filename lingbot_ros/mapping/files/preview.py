"""A top-down picture of a map: its points seen from above, coloured by height, the trajectory
drawn over them, axes in the map's unit. Written beside map.ply by every save (Mapper.save: the
node's ~/save_map and lingbot-ros-offline), from arrays only, so any map store can call it.

The map frame is REP 103 (x forward, y left, z up): the picture's right is +x, its top is +y, and
a pixel shows the highest point that falls in it. The extent covers the trajectory and the middle
98% of the points on each axis, so a few stray far points do not shrink the map to a dot.
Needs numpy and Pillow only (the node's own dependencies).
"""
from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image, ImageDraw, ImageFont

SIZE_PX = 900            # the plot area's longer side
MARGIN = (110, 30, 110, 60)   # left (room for the y label), top, right (colour bar), bottom
BACKGROUND = (255, 255, 255)
AXES = (60, 60, 60)
PATH_COLOUR = (220, 30, 30)
START_COLOUR = (20, 160, 60)
# Height colours, low to high: a perceptually ordered ramp (dark blue, teal, green, yellow).
_RAMP = np.array([(48, 18, 120), (40, 100, 170), (30, 160, 150), (110, 200, 80), (250, 230, 40)], dtype=np.float64)


class PreviewError(ValueError):
    """Arrays of the wrong shape."""


def height_colours(heights: np.ndarray, low: float, high: float) -> np.ndarray:
    """``[N]`` heights -> ``[N, 3]`` uint8 colours along the ramp, clipped to [low, high]."""
    t = np.clip((heights - low) / (high - low), 0.0, 1.0) if high > low else np.full(len(heights), 0.5)
    position = t * (len(_RAMP) - 1)
    lower = np.minimum(position.astype(np.int64), len(_RAMP) - 2)
    frac = (position - lower)[:, None]
    return np.round(_RAMP[lower] * (1 - frac) + _RAMP[lower + 1] * frac).astype(np.uint8)


def preview_png(points: np.ndarray, trajectory: np.ndarray, units: str = "m",
                colours: np.ndarray | None = None, title: str = "") -> bytes:
    """The picture as PNG bytes (written through staged_files, as every file).

    ``points`` ``[N, 3]`` map points (x, y, z); ``trajectory`` ``[M, 3]`` positions, oldest
    first; ``units`` labels the axes ("m", or "model units" while the scale is unknown);
    ``colours`` ``[N, 3]`` uint8 to use instead of the height colouring. Non-finite rows are
    left out.
    """
    points = _rows(points, "points")
    trajectory = _rows(trajectory, "trajectory")
    if colours is not None and np.shape(colours) != (len(points), 3):
        raise PreviewError(f"colours must be [N, 3] like points ({len(points)} rows), got {np.shape(colours)}")
    keep = np.isfinite(points).all(axis=1)
    points = points[keep]
    colours = None if colours is None else np.asarray(colours, dtype=np.uint8)[keep]
    trajectory = trajectory[np.isfinite(trajectory).all(axis=1)]
    buffer = io.BytesIO()
    _render(points, trajectory, units, colours, title).save(buffer, format="PNG")
    return buffer.getvalue()


def _rows(array, name: str) -> np.ndarray:
    array = np.asarray(array, dtype=np.float64)
    if array.size == 0:
        return np.zeros((0, 3))
    if array.ndim != 2 or array.shape[1] != 3:
        raise PreviewError(f"{name} must be [N, 3], got {array.shape}")
    return array


def _extent(points: np.ndarray, trajectory: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of x and y: the trajectory and the middle 98% of the points, padded 5%."""
    parts = [trajectory[:, :2]]
    if len(points):
        parts.append(np.percentile(points[:, :2], [1, 99], axis=0))
    both = np.concatenate(parts) if any(len(p) for p in parts) else np.zeros((1, 2))
    low, high = both.min(axis=0), both.max(axis=0)
    span = max(float((high - low).max()), 1e-6)
    middle = (low + high) / 2
    half = np.maximum((high - low) / 2, span * 0.05) * 1.05
    return middle - half, middle + half


def _render(points, trajectory, units, colours, title) -> Image.Image:
    low, high = _extent(points, trajectory)
    span = high - low
    pixels_per_unit = SIZE_PX / float(span.max())
    width, height = (np.ceil(span * pixels_per_unit).astype(int) + 1).tolist()
    left, top, right, bottom = MARGIN
    canvas = np.full((height + top + bottom, width + left + right, 3), BACKGROUND, dtype=np.uint8)

    def to_pixels(xy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        column = np.round((xy[:, 0] - low[0]) * pixels_per_unit).astype(np.int64) + left
        row = np.round((high[1] - xy[:, 1]) * pixels_per_unit).astype(np.int64) + top
        return column, row

    heights = points[:, 2]
    z_low, z_high = (np.percentile(heights, [2, 98]) if len(points) else (0.0, 1.0))
    if len(points):
        shown = colours if colours is not None else height_colours(heights, z_low, z_high)
        order = np.argsort(heights, kind="stable")   # higher points drawn last: seen from above
        column, row = to_pixels(points[order])
        inside = (column >= left) & (column < left + width) & (row >= top) & (row < top + height)
        # Small maps get 2x2 dots so that they can be seen at all.
        offsets = ((0, 0),) if inside.sum() > 200_000 else ((0, 0), (1, 0), (0, 1), (1, 1))
        for dc, dr in offsets:
            c, r = np.minimum(column[inside] + dc, left + width - 1), np.minimum(row[inside] + dr, top + height - 1)
            canvas[r, c] = shown[order][inside]
    image = Image.fromarray(canvas)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    draw.rectangle([left - 1, top - 1, left + width, top + height], outline=AXES)
    _ticks(draw, font, low, high, pixels_per_unit, left, top, width, height, units)
    if len(trajectory):
        column, row = to_pixels(trajectory[:, :2])
        line = list(zip(column.tolist(), row.tolist()))
        if len(line) > 1:
            draw.line(line, fill=(255, 255, 255), width=5)
            draw.line(line, fill=PATH_COLOUR, width=3)
        for (c, r), colour in ((line[0], START_COLOUR), (line[-1], PATH_COLOUR)):
            draw.ellipse([c - 6, r - 6, c + 6, r + 6], fill=colour, outline=(255, 255, 255), width=2)
    if colours is None:
        _colour_bar(draw, font, left + width + 25, top, height, z_low, z_high, units)
    caption = title or f"{len(points)} points, {len(trajectory)} poses, seen from above (+z)"
    draw.text((left, 8), caption, fill=AXES, font=font)
    return image


def _nice_step(span: float, count: int = 6) -> float:
    raw = span / count
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _ticks(draw, font, low, high, pixels_per_unit, left, top, width, height, units) -> None:
    for axis in (0, 1):
        step = _nice_step(float(high[axis] - low[axis]))
        value = math.ceil(low[axis] / step) * step
        while value <= high[axis]:
            text = f"{value:g}"
            if axis == 0:
                c = left + round((value - low[0]) * pixels_per_unit)
                draw.line([c, top + height, c, top + height + 5], fill=AXES)
                draw.text((c - 3 * len(text), top + height + 8), text, fill=AXES, font=font)
            else:
                r = top + round((high[1] - value) * pixels_per_unit)
                draw.line([left - 5, r, left, r], fill=AXES)
                draw.text((left - 10 - 6 * len(text), r - 6), text, fill=AXES, font=font)
            value += step
    draw.text((left + width // 2 - 20, top + height + 28), f"x ({units})", fill=AXES, font=font)
    draw.text((4, top + height // 2), f"y ({units})", fill=AXES, font=font)


def _colour_bar(draw, font, x, top, height, z_low, z_high, units) -> None:
    ramp = height_colours(np.linspace(z_high, z_low, height), z_low, z_high)
    for row, colour in enumerate(ramp.tolist()):
        draw.line([x, top + row, x + 14, top + row], fill=tuple(colour))
    draw.rectangle([x - 1, top - 1, x + 15, top + height], outline=AXES)
    draw.text((x + 20, top - 4), f"{z_high:.3g}", fill=AXES, font=font)
    draw.text((x + 20, top + height - 10), f"{z_low:.3g}", fill=AXES, font=font)
    draw.text((x - 4, top + height + 8), f"z ({units})", fill=AXES, font=font)
