"""The error family of image decoding, and the size check every decoder makes before decoding.

Callers that take images from outside (the node's image callback, the frame sources) catch
:class:`ImageDecodeError` alone; the subclasses say which kind of fault it was.
"""
from __future__ import annotations

# Camera-sized limit: anything larger is almost certainly a corrupt header, and decoding it would
# stall the subscription thread.
DEFAULT_MAX_PIXELS = 8192 * 8192


class ImageDecodeError(ValueError):
    """A payload cannot be turned into an RGB image; the text says why and what to change."""


class UnsupportedEncodingError(ImageDecodeError):
    """The raw encoding or the compressed format is not one this package decodes."""


class CorruptImageError(ImageDecodeError):
    """The payload claims a supported kind, but its bytes are inconsistent, cut short or corrupt."""


def check_size(width: int, height: int, max_pixels: int) -> None:
    """Refuse empty images and those above ``max_pixels`` (sizes from the header, not decoded)."""
    if width <= 0 or height <= 0:
        raise ImageDecodeError(f"empty image ({width}x{height})")
    if width * height > max_pixels:
        raise ImageDecodeError(f"image {width}x{height} exceeds max_image_pixels={max_pixels}; "
                               "raise max_image_pixels if the camera really is that large")
