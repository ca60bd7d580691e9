"""JPEG and PNG payloads -> uint8 RGB ``[H, W, 3]``: the one decoder of each format, used by the
node's CompressedImage callback and by the frame sources (bag messages, image folders).

The format is read from the payload's signature; a ``format`` string (plain "jpeg"/"png" or
image_transport's "rgb8; jpeg compressed bgr8") only refuses what is not a camera image
(compressedDepth) or names another codec. The size in the header is checked against
``max_pixels`` before any pixel is decoded. The EXIF orientation is applied (spec §3).

Why these decoders (measured on this environment's builds: Pillow 13.0 with libjpeg-turbo 3.2,
OpenCV 5.0 with libjpeg-turbo 3.1, simplejpeg 1.9 with the libjpeg-turbo its wheel bundles):

* JPEG: simplejpeg (libjpeg-turbo's TurboJPEG API) with ``strict=True``. libjpeg reports a
  stream corrupted in its entropy-coded data (bytes flipped, a cut stream closed by an EOI,
  bytes left between the scan and EOI) only as *warnings* ("Corrupt JPEG data: premature end of
  data segment", "Corrupt JPEG data: 5 extraneous bytes before marker 0xd9") and goes on to
  return grey or shifted blocks. OpenCV's ``imdecode`` prints those warnings on the process's
  stderr (libjpeg's default message handler, outside any logger) and returns the image; Pillow
  drops them and returns the image; neither tells the caller. TurboJPEG's stop-on-warning turns
  them into a ValueError (raised here as :class:`CorruptImageError`) and writes nothing to
  stderr. Pixels: identical to Pillow's (the spec §3 reference) on every frame of
  ``courthouse_jpg`` and ``loop_jpg``, and to OpenCV's on ``courthouse_jpg`` (same
  libjpeg-turbo, accurate DCT, fancy upsampling). Time per courthouse frame (518x294, 47 KB;
  2 shared CPU cores): this function 0.72-0.75 ms, OpenCV ``imdecode`` + BGR->RGB
  0.78-0.80 ms, Pillow open + ``exif_transpose`` + RGB 1.04-1.19 ms
  (``python bench/image_decode.py``; the table is in bench/README.md).
  ``strict_jpeg=False`` (the node's ``strict_jpeg`` parameter, the tools' ``--no-strict-jpeg``)
  keeps those warnings from rejecting the frame, for a camera whose every JPEG carries a
  harmless one (bytes before EOI: the pixels are exact); damaged scan data then enters the map.
  A fatal error (no header, no scan) is still rejected.
* PNG: Pillow. Its PNG reader is zlib plus Python, not libpng, so it writes nothing to stderr
  (OpenCV's libpng prints "libpng error: IDAT: CRC error"); Pillow does not check the CRCs of
  image data, so every chunk's CRC is checked here first, and a stream without its IEND chunk is
  rejected as cut short. 3.4 ms per courthouse frame as PNG (250 KB), OpenCV 3.0 ms.

Modes other than 8-bit RGB become RGB as the demo's loader does (spec §3): alpha composited
onto white, palette and grey expanded; 16-bit grey keeps its top byte, as raw mono16 does.
"""
from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import simplejpeg
from PIL import Image

from lingbot_ros.io.decode_errors import (DEFAULT_MAX_PIXELS, CorruptImageError,
                                          UnsupportedEncodingError, check_size)
from lingbot_ros.io.orientation import apply_orientation, tiff_orientation

SUPPORTED_FORMATS = ("jpeg", "png")
_JPEG_SIGNATURE = b"\xff\xd8\xff"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_EXIF_HEADER = b"Exif\0\0"
# Pillow reports a corrupt PNG with several unrelated exception types.
_PIL_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error,
               Image.DecompressionBombError)


def decode_compressed(data, fmt: str = "", max_pixels: int = DEFAULT_MAX_PIXELS,
                      strict_jpeg: bool = True) -> np.ndarray:
    """A JPEG or PNG payload -> writable, contiguous uint8 RGB ``[H, W, 3]``, upright.

    ``data`` is anything with the buffer protocol (bytes, ``array.array``, uint8 ndarray).
    Raises :class:`UnsupportedEncodingError` for another format or a depth map,
    :class:`CorruptImageError` for an empty, truncated or corrupt payload (libjpeg warnings
    included unless ``strict_jpeg`` is False), :class:`~lingbot_ros.io.decode_errors.ImageDecodeError`
    for an oversized image.
    """
    name = fmt.strip().lower()
    if "compresseddepth" in name:
        raise UnsupportedEncodingError(f"format '{fmt}' is a depth map, not a camera image; "
                                       "subscribe to the camera's colour image topic")
    if name and not any(word in name for word in ("jpeg", "jpg", "png")):
        raise UnsupportedEncodingError(f"unsupported compressed format '{fmt}'; publish jpeg or "
                                       "png (or a raw sensor_msgs/Image)")
    payload = bytes(data)
    if not payload:
        raise CorruptImageError("empty compressed image (0 bytes)")
    if payload.startswith(_JPEG_SIGNATURE):
        return _decode_jpeg(payload, max_pixels, strict_jpeg)
    if payload.startswith(_PNG_SIGNATURE):
        return _decode_png(payload, max_pixels)
    raise CorruptImageError(f"corrupt or unknown compressed data: {len(payload)} bytes starting "
                            f"{payload[:8].hex(' ')} are neither JPEG nor PNG (format '{fmt}')")


def _decode_jpeg(payload: bytes, max_pixels: int, strict: bool) -> np.ndarray:
    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(payload)
    except ValueError as err:
        raise CorruptImageError(f"corrupt JPEG header ({len(payload)} bytes): {err}") from err
    check_size(width, height, max_pixels)
    try:
        rgb = simplejpeg.decode_jpeg(payload, colorspace="RGB", strict=strict)
    except ValueError as err:
        hint = ("; if every frame of this camera says so, its encoder writes JPEGs libjpeg warns "
                "about: strict_jpeg false (--no-strict-jpeg offline) accepts them" if strict else "")
        raise CorruptImageError(
            f"corrupt JPEG data ({len(payload)} bytes, {width}x{height}): {err}; the image was "
            f"damaged between the camera and here (a lossy link, a cut message){hint}") from err
    return apply_orientation(rgb, _jpeg_orientation(payload))


def _jpeg_orientation(payload: bytes) -> int:
    """EXIF orientation from the APP1 segment among the markers before the first scan."""
    pos = 2                                     # after SOI
    while pos + 4 <= len(payload) and payload[pos] == 0xFF:
        marker = payload[pos + 1]
        if marker == 0xFF:                      # fill byte before a marker
            pos += 1
            continue
        if marker in (0xD9, 0xDA):              # EOI, SOS: no metadata past this point
            break
        (length,) = struct.unpack_from(">H", payload, pos + 2)
        if marker == 0xE1 and payload[pos + 4:pos + 10] == _EXIF_HEADER:
            return tiff_orientation(payload[pos + 10:pos + 2 + length])
        pos += 2 + length
    return 1


def _decode_png(payload: bytes, max_pixels: int) -> np.ndarray:
    width, height, exif = _check_png_chunks(payload)
    check_size(width, height, max_pixels)
    try:
        image = Image.open(io.BytesIO(payload), formats=("PNG",))
        image.load()
    except _PIL_ERRORS as err:
        raise CorruptImageError(f"corrupt PNG ({len(payload)} bytes, {width}x{height}): "
                                f"{err}") from err
    return apply_orientation(_pil_to_rgb(image), tiff_orientation(exif) if exif else 1)


def _check_png_chunks(payload: bytes) -> tuple[int, int, bytes]:
    """Walk the chunks up to IEND checking each CRC; the IHDR size and the eXIf block (or b"")."""
    view = memoryview(payload)
    pos, size, exif = len(_PNG_SIGNATURE), None, b""
    while True:
        if pos + 12 > len(payload):
            raise CorruptImageError(f"truncated PNG: {len(payload)} bytes end before the IEND "
                                    "chunk")
        length, kind = struct.unpack_from(">I4s", payload, pos)
        end = pos + 12 + length
        if end > len(payload):
            raise CorruptImageError(f"truncated PNG: the {kind.decode('latin-1')} chunk at byte "
                                    f"{pos} needs {end} bytes, the payload has {len(payload)}")
        (crc,) = struct.unpack_from(">I", payload, end - 4)
        if zlib.crc32(view[pos + 4:end - 4]) != crc:
            raise CorruptImageError(f"corrupt PNG: CRC mismatch in the {kind.decode('latin-1')} "
                                    f"chunk at byte {pos}")
        if kind == b"IHDR" and length >= 8:
            size = struct.unpack_from(">II", payload, pos + 8)
        elif kind == b"eXIf":
            exif = payload[pos + 8:end - 4]
        elif kind == b"IEND":
            break
        pos = end
    if size is None:
        raise CorruptImageError("corrupt PNG: no IHDR chunk")
    return size[0], size[1], exif


def _pil_to_rgb(image: Image.Image) -> np.ndarray:
    if image.mode.startswith("I"):          # 16-bit grey ("I;16", "I;16B", "I"): the top byte
        grey = (np.asarray(image).astype(np.uint32) >> 8).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2)
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    if image.mode != "RGB":
        image = image.convert("RGB")
    return np.array(image)                  # a writable copy: consumers may wrap it in torch
