"""sensor_msgs Image / CompressedImage <-> numpy, without cv_bridge.

Input images become uint8 RGB ``[H, W, 3]`` (what the model's preprocessor takes). Raw images are
read through ``np.ndarray(buffer=..., strides=(step, ...))`` so padded rows (``step`` larger than
``width * bytes_per_pixel``) and big-endian 16-bit data decode correctly; OpenCV is used only for
demosaicing, YUV and (de)compression. Anything that cannot be decoded raises ImageDecodeError with
the reason, so the node can count and skip it.
"""
from __future__ import annotations

import cv2
import numpy as np

# Camera-sized limit: anything larger is almost certainly a corrupt header, and decoding it would
# stall the subscription thread.
DEFAULT_MAX_PIXELS = 8192 * 8192


class ImageDecodeError(ValueError):
    """The message cannot be turned into an RGB image; the text says why."""


# encoding -> (channels, dtype, conversion to RGB). Conversion names are handled in _to_rgb.
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


def raw_view(msg, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[np.ndarray, str]:
    """Zero-copy ``[H, W, C]`` view of a sensor_msgs/Image honouring step and endianness.

    Returns the view and the name of the conversion to RGB.
    """
    encoding = msg.encoding.strip().lower()
    if encoding not in _RAW:
        raise ImageDecodeError(f"unsupported encoding '{msg.encoding}' (supported: "
                               f"{', '.join(SUPPORTED_ENCODINGS)})")
    channels, dtype, conversion = _RAW[encoding]
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    if height <= 0 or width <= 0:
        raise ImageDecodeError(f"empty image ({width}x{height})")
    if height * width > max_pixels:
        raise ImageDecodeError(f"image {width}x{height} exceeds max_image_pixels={max_pixels}")
    itemsize = np.dtype(dtype).itemsize
    row_bytes = width * channels * itemsize
    if step < row_bytes:
        raise ImageDecodeError(f"step {step} is smaller than width*bytes_per_pixel {row_bytes} "
                               f"({width} px of {encoding})")
    needed = step * (height - 1) + row_bytes
    buffer = np.frombuffer(msg.data, np.uint8)
    if buffer.size < needed:
        raise ImageDecodeError(f"data has {buffer.size} bytes, {width}x{height} {encoding} with "
                               f"step {step} needs {needed}")
    byte_order = ">" if msg.is_bigendian else "<"
    view = np.ndarray((height, width, channels), np.dtype(dtype).newbyteorder(byte_order),
                      buffer=buffer, strides=(step, channels * itemsize, itemsize))
    return view, conversion


def _to_uint8(array: np.ndarray) -> np.ndarray:
    # 16-bit camera data fills the full range (mono16, bayer16): keep the top byte.
    if array.dtype.itemsize == 2:
        return (array.astype(np.uint16) >> 8).astype(np.uint8)
    return np.ascontiguousarray(array)


def image_to_rgb(msg, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """sensor_msgs/Image -> contiguous uint8 RGB ``[H, W, 3]`` (a copy; the message can go)."""
    view, conversion = raw_view(msg, max_pixels)
    if conversion in ("uyvy", "yuyv"):
        if view.shape[1] % 2:
            raise ImageDecodeError(f"{msg.encoding} needs an even width, got {view.shape[1]}")
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


def compressed_to_rgb(msg, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """sensor_msgs/CompressedImage (jpeg or png) -> uint8 RGB ``[H, W, 3]``.

    ``format`` may be plain ("jpeg", "png") or image_transport's "rgb8; jpeg compressed bgr8";
    compressedDepth is refused (it is a depth map, not a camera image).
    """
    fmt = msg.format.strip().lower()
    if "compresseddepth" in fmt:
        raise ImageDecodeError(f"format '{msg.format}' is a depth map, not a camera image")
    if fmt and not any(name in fmt for name in ("jpeg", "jpg", "png")):
        raise ImageDecodeError(f"unsupported compressed format '{msg.format}' (jpeg or png)")
    data = np.frombuffer(msg.data, np.uint8)
    if data.size == 0:
        raise ImageDecodeError("empty compressed image")
    bgr = cv2.imdecode(data, cv2.IMREAD_COLOR)
    if bgr is None or bgr.size == 0:
        raise ImageDecodeError(f"corrupt or undecodable {fmt or 'compressed'} data "
                               f"({data.size} bytes)")
    # OpenCV caps decoded size itself (CV_IO_MAX_IMAGE_PIXELS); ours is the node's parameter.
    if bgr.shape[0] * bgr.shape[1] > max_pixels:
        raise ImageDecodeError(f"image {bgr.shape[1]}x{bgr.shape[0]} exceeds "
                               f"max_image_pixels={max_pixels}")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def fill_image(msg, array: np.ndarray, encoding: str):
    """Fill a sensor_msgs/Image from a ``[H, W]`` or ``[H, W, C]`` array (rgb8, mono8, 32FC1...).

    Data is assigned as bytes: assigning an ndarray to ``msg.data`` is about 100x slower.
    """
    array = np.ascontiguousarray(array)
    msg.height, msg.width = int(array.shape[0]), int(array.shape[1])
    msg.encoding = encoding
    msg.is_bigendian = int(array.dtype.byteorder == ">")
    msg.step = int(array.strides[0])
    msg.data = array.tobytes()
    return msg


def fill_compressed(msg, rgb: np.ndarray, fmt: str = "jpeg", quality: int = 90):
    """Fill a sensor_msgs/CompressedImage from uint8 RGB (jpeg or png)."""
    ext = {"jpeg": ".jpg", "jpg": ".jpg", "png": ".png"}.get(fmt)
    if ext is None:
        raise ValueError(f"compression format must be jpeg or png, got '{fmt}'")
    params = [cv2.IMWRITE_JPEG_QUALITY, quality] if ext == ".jpg" else []
    ok, encoded = cv2.imencode(ext, cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), params)
    if not ok:
        raise ValueError(f"OpenCV could not encode a {rgb.shape} image as {fmt}")
    msg.format = "jpeg" if ext == ".jpg" else "png"
    msg.data = encoded.tobytes()
    return msg
