"""Image conversion: every encoding with padded rows, endianness, compressed input, bad input."""
import cv2
import numpy as np
import pytest
from sensor_msgs.msg import CompressedImage, Image

from lingbot_ros.ros.image_codec import (ImageDecodeError, compressed_to_rgb, fill_compressed,
                                         fill_image, image_to_rgb)

RNG = np.random.default_rng(0)
RGB = RNG.integers(0, 256, (6, 8, 3), dtype=np.uint8)   # H=6, W=8 (even: YUV needs it)


def padded_msg(array: np.ndarray, encoding: str, pad: int = 5, big_endian: bool = False) -> Image:
    """Image whose rows carry ``pad`` junk bytes: a decoder that ignores step gets it wrong."""
    h = array.shape[0]
    if array.dtype.itemsize > 1:
        array = array.astype(array.dtype.newbyteorder(">" if big_endian else "<"))
    rows = array.reshape(h, -1).view(np.uint8).reshape(h, -1)
    junk = np.full((h, pad), 0xAB, np.uint8)
    data = np.concatenate([rows, junk], axis=1)
    return Image(height=h, width=array.shape[1], encoding=encoding, is_bigendian=int(big_endian),
                 step=data.shape[1], data=data.tobytes())


RAW_CASES = [
    ("rgb8", RGB, RGB),
    ("bgr8", RGB[:, :, ::-1], RGB),
    ("rgba8", np.dstack([RGB, np.full((6, 8), 7, np.uint8)]), RGB),
    ("bgra8", np.dstack([RGB[:, :, ::-1], np.full((6, 8), 7, np.uint8)]), RGB),
    ("mono8", RGB[:, :, 0], np.repeat(RGB[:, :, :1], 3, axis=2)),
    ("mono16", RGB[:, :, 0].astype(np.uint16) * 256 + 17, np.repeat(RGB[:, :, :1], 3, axis=2)),
    ("rgb16", RGB.astype(np.uint16) * 256, RGB),
]


# Byte order only exists for multi-byte samples, so 8-bit encodings are tested little-endian only.
@pytest.mark.parametrize("encoding, array, expected, big_endian", [
    (*case, big_endian) for case in RAW_CASES for big_endian in (False, True)
    if big_endian is False or case[1].dtype.itemsize > 1])
@pytest.mark.parametrize("pad", [0, 5])
def test_raw_encodings_honour_step_and_endianness(encoding, array, expected, pad, big_endian):
    out = image_to_rgb(padded_msg(array, encoding, pad, big_endian))
    assert out.dtype == np.uint8 and out.shape == (6, 8, 3) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("pattern, offsets", [
    ("rggb", {"r": (0, 0), "b": (1, 1)}), ("bggr", {"r": (1, 1), "b": (0, 0)}),
    ("gbrg", {"r": (1, 0), "b": (0, 1)}), ("grbg", {"r": (0, 1), "b": (1, 0)}),
])
@pytest.mark.parametrize("bits", [8, 16])
def test_bayer_patterns_demosaic_to_the_right_colour(pattern, offsets, bits):
    colour = {"r": 200, "g": 120, "b": 40}
    mosaic = np.full((8, 10), colour["g"], np.uint16)
    for name, (row, col) in offsets.items():
        mosaic[row::2, col::2] = colour[name]
    if bits == 16:
        mosaic = mosaic * 256
    else:
        mosaic = mosaic.astype(np.uint8)
    out = image_to_rgb(padded_msg(mosaic, f"bayer_{pattern}{bits}", pad=4))
    centre = out[2:-2, 2:-2].reshape(-1, 3)
    np.testing.assert_allclose(centre.mean(axis=0), [200, 120, 40], atol=2)


@pytest.mark.parametrize("encoding", ["yuv422", "yuyv"])
def test_yuv422_variants(encoding):
    grey = np.full((6, 8, 3), 90, np.uint8)
    # Build packed 4:2:2 for a flat grey image by hand: Y=luma, U=V=128.
    y = cv2.cvtColor(grey, cv2.COLOR_RGB2GRAY)
    packed = np.empty((6, 8, 2), np.uint8)
    if encoding == "yuv422":       # UYVY
        packed[:, :, 0], packed[:, :, 1] = 128, y
    else:                          # YUYV
        packed[:, :, 0], packed[:, :, 1] = y, 128
    out = image_to_rgb(padded_msg(packed, encoding, pad=3))
    # Video-range BT.601 maps 90 to about 86; a swapped byte order would read Y=128 instead.
    np.testing.assert_allclose(out.astype(int), 90, atol=6)


@pytest.mark.parametrize("fmt", ["jpeg", "png", "rgb8; jpeg compressed bgr8"])
def test_compressed_roundtrip(fmt):
    xs, ys = np.meshgrid(np.linspace(0, 255, 32), np.linspace(0, 255, 24))
    smooth = np.dstack([xs, ys, np.full((24, 32), 100.0)]).astype(np.uint8)
    msg = fill_compressed(CompressedImage(), smooth, "png" if fmt == "png" else "jpeg")
    msg.format = fmt
    out = compressed_to_rgb(msg)
    tolerance = 0 if fmt == "png" else 12
    assert out.shape == smooth.shape
    assert np.abs(out.astype(int) - smooth).max() <= tolerance


@pytest.mark.parametrize("msg, text", [
    (Image(height=2, width=2, encoding="weird8", step=6, data=b"\0" * 12), "unsupported encoding"),
    (Image(height=2, width=4, encoding="rgb8", step=6, data=b"\0" * 24), "step 6 is smaller"),
    (Image(height=4, width=4, encoding="rgb8", step=12, data=b"\0" * 20), "needs"),
    (Image(height=0, width=0, encoding="rgb8", step=0, data=b""), "empty image"),
    (Image(height=100000, width=100000, encoding="mono8", step=100000, data=b""), "exceeds"),
    (Image(height=2, width=3, encoding="yuv422", step=6, data=b"\0" * 12), "even width"),
])
def test_bad_raw_images_raise_a_specific_error(msg, text):
    with pytest.raises(ImageDecodeError, match=text):
        image_to_rgb(msg)


@pytest.mark.parametrize("fmt, data, text", [
    ("jpeg", b"\xff\xd8\xff\xe0 this is not a jpeg", "corrupt"),
    ("jpeg", b"", "empty"),
    ("16UC1; compressedDepth", b"\0" * 10, "depth map"),
    ("tiff", b"\0" * 10, "unsupported compressed format"),
])
def test_bad_compressed_images_raise_a_specific_error(fmt, data, text):
    with pytest.raises(ImageDecodeError, match=text):
        compressed_to_rgb(CompressedImage(format=fmt, data=data))


def test_fill_image_writes_bytes_and_step():
    depth = np.arange(12, dtype=np.float32).reshape(3, 4)
    msg = fill_image(Image(), depth, "32FC1")
    assert (msg.height, msg.width, msg.step, msg.encoding) == (3, 4, 16, "32FC1")
    np.testing.assert_array_equal(np.frombuffer(bytes(msg.data), np.float32).reshape(3, 4), depth)
