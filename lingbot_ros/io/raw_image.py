"""Raw ``sensor_msgs/Image`` payloads -> uint8 RGB ``[H, W, 3]``, from plain fields.

Rows are read through ``np.ndarray(buffer=..., strides=(step, ...))``, so padded rows (``step``
larger than ``width * bytes_per_pixel``) and big-endian 16-bit data decode correctly without a
copy before the conversion. 16-bit data keeps its top byte (mono16, rgb16, bayer_*16 fill the
full range). OpenCV does only the demosaicing and the YUV conversion.
"""
from __future__ import annotations

import cv2
import numpy as np

from lingbot_ros.io.decode_errors import (DEFAULT_MAX_PIXELS, CorruptImageError,
                                          ImageDecodeError, UnsupportedEncodingError, check_size)

# encoding -> (channels, dtype, conversion to RGB). Conversion names are handled in decode_raw.
_RAW = {
    "rgb8": (3, np.uint8, "rgb"), "bgr8": (3, np.uint8, "bgr"),
    "rgba8": (4, np.uint8, "rgba"), "bgra8": (4, np.uint8, "bgra"),
    "rgb16": (3, np.uint16, "rgb"), "bgr16": (3, np.uint16, "bgr"),
    "rgba16": (4, np.uint16, "rgba"), "bgra16": (4, np.uint16, "bgra"),
    "mono8": (1, np.uint8, "mono"), "8uc1": (1, np.uint8, "mono"),
    "mono16": (1, np.uint16, "mono"), "16uc1": (1, np.uint16, "mono"),
    "8uc3": (3, np.uint8, "bgr"), "8uc4": (4, np.uint8, "bgra"),   # OpenCV's channel order
    # Packed 4:2:2, two bytes per pixel. ROS "yuv422" is UYVY; "yuv422_yuy2" and "yuyv" are YUYV.
    "yuv422": (2, np.uint8, "uyvy"), "uyvy": (2, np.uint8, "uyvy"),
    "yuv422_yuy2": (2, np.uint8, "yuyv"), "yuyv": (2, np.uint8, "yuyv"),
}
# ROS names the Bayer pattern by its top-left 2x2 block, as OpenCV's *RGGB*-style aliases do.
_BAYER = {"rggb": cv2.COLOR_BayerRGGB2RGB, "bggr": cv2.COLOR_BayerBGGR2RGB,
          "gbrg": cv2.COLOR_BayerGBRG2RGB, "grbg": cv2.COLOR_BayerGRBG2RGB}
for _pattern in _BAYER:
    _RAW[f"bayer_{_pattern}8"] = (1, np.uint8, "bayer_" + _pattern)
    _RAW[f"bayer_{_pattern}16"] = (1, np.uint16, "bayer_" + _pattern)

SUPPORTED_ENCODINGS = tuple(sorted(_RAW))


def _raw_view(encoding: str, height: int, width: int, step: int, is_bigendian: bool, data,
              max_pixels: int) -> tuple[np.ndarray, str]:
    """Zero-copy ``[H, W, C]`` view honouring step and endianness, and the conversion's name."""
    key = encoding.strip().lower()
    if key not in _RAW:
        raise UnsupportedEncodingError(
            f"unsupported encoding '{encoding}'; publish one of: {', '.join(SUPPORTED_ENCODINGS)} "
            "(or a sensor_msgs/CompressedImage in jpeg or png)")
    channels, dtype, conversion = _RAW[key]
    height, width, step = int(height), int(width), int(step)
    check_size(width, height, max_pixels)
    itemsize = np.dtype(dtype).itemsize
    row_bytes = width * channels * itemsize
    if step < row_bytes:
        raise CorruptImageError(f"step {step} is smaller than width*bytes_per_pixel {row_bytes} "
                                f"({width} px of {encoding})")
    needed = step * (height - 1) + row_bytes
    buffer = np.frombuffer(data, np.uint8)
    if buffer.size < needed:
        raise CorruptImageError(f"data has {buffer.size} bytes, {width}x{height} {encoding} with "
                                f"step {step} needs {needed}")
    byte_order = ">" if is_bigendian else "<"
    view = np.ndarray((height, width, channels), np.dtype(dtype).newbyteorder(byte_order),
                      buffer=buffer, strides=(step, channels * itemsize, itemsize))
    return view, conversion


def _to_uint8(array: np.ndarray) -> np.ndarray:
    if array.dtype.itemsize == 2:
        return (array.astype(np.uint16) >> 8).astype(np.uint8)
    return np.ascontiguousarray(array)


def decode_raw(encoding: str, height: int, width: int, step: int, is_bigendian: bool, data,
               max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """A raw image's fields -> contiguous uint8 RGB ``[height, width, 3]`` (a copy of ``data``).

    ``data`` is anything with the buffer protocol (bytes, ``array.array`` of rclpy messages, the
    uint8 ndarray of ``rosbags`` messages). Raises :class:`UnsupportedEncodingError` for an
    encoding outside :data:`SUPPORTED_ENCODINGS`, :class:`CorruptImageError` when ``step`` or
    the data length do not fit the size, :class:`ImageDecodeError` for empty or oversized images.
    """
    view, conversion = _raw_view(encoding, height, width, step, is_bigendian, data, max_pixels)
    if conversion in ("uyvy", "yuyv"):
        if view.shape[1] % 2:
            raise ImageDecodeError(f"{encoding} needs an even width, got {view.shape[1]}")
        code = cv2.COLOR_YUV2RGB_UYVY if conversion == "uyvy" else cv2.COLOR_YUV2RGB_YUYV
        return cv2.cvtColor(np.ascontiguousarray(view), code)
    if conversion.startswith("bayer_"):
        mosaic = np.ascontiguousarray(view[:, :, 0].astype(view.dtype.newbyteorder("=")))
        return _to_uint8(cv2.cvtColor(mosaic, _BAYER[conversion[6:]]))
    pixels = _to_uint8(view)
    if conversion == "mono":
        return np.repeat(pixels, 3, axis=2)
    if conversion in ("bgr", "bgra"):
        return np.ascontiguousarray(pixels[:, :, 2::-1])
    return np.ascontiguousarray(pixels[:, :, :3])
