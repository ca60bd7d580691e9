"""sensor_msgs Image / CompressedImage <-> numpy, without cv_bridge and without ROS imports.

Decoding takes a message (rclpy or ``rosbags``: both carry the same field names) and returns
uint8 RGB ``[H, W, 3]``, what the model's preprocessor takes: :func:`image_to_rgb` for raw images
(:mod:`lingbot_ros.io.raw_image`), :func:`compressed_to_rgb` for JPEG/PNG
(:mod:`lingbot_ros.io.compressed_image`, which says why those decoders). The node's image
callback and the frame sources both decode here, so a payload is read the same way live and
offline. Anything that cannot be decoded raises :class:`ImageDecodeError` (one of its subclasses)
with the reason, so the node can count it as rejected and go on.

Encoding (:func:`fill_image`, :func:`fill_compressed`) is for the node's outputs and the tools
that publish images.
"""
from __future__ import annotations

import cv2
import numpy as np

from lingbot_ros.io.compressed_image import SUPPORTED_FORMATS, decode_compressed
from lingbot_ros.io.decode_errors import (DEFAULT_MAX_PIXELS, CorruptImageError,
                                          ImageDecodeError, UnsupportedEncodingError)
from lingbot_ros.io.raw_image import SUPPORTED_ENCODINGS, decode_raw

__all__ = [
    "DEFAULT_MAX_PIXELS", "SUPPORTED_ENCODINGS", "SUPPORTED_FORMATS",
    "ImageDecodeError", "UnsupportedEncodingError", "CorruptImageError",
    "image_to_rgb", "compressed_to_rgb", "decode_raw", "decode_compressed",
    "fill_image", "fill_compressed",
]


def image_to_rgb(msg, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """sensor_msgs/Image -> contiguous uint8 RGB ``[H, W, 3]`` (a copy; the message can go)."""
    return decode_raw(msg.encoding, msg.height, msg.width, msg.step, bool(msg.is_bigendian),
                      msg.data, max_pixels)


def compressed_to_rgb(msg, max_pixels: int = DEFAULT_MAX_PIXELS, strict_jpeg: bool = True) -> np.ndarray:
    """sensor_msgs/CompressedImage (jpeg or png) -> contiguous uint8 RGB ``[H, W, 3]``."""
    return decode_compressed(msg.data, msg.format, max_pixels, strict_jpeg)


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
