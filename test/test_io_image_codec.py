"""io/image_codec: every raw encoding with padded rows and endianness, rclpy and rosbags messages,
JPEG/PNG against Pillow (spec §3), EXIF orientation, corrupt payloads rejected without a byte on
the process's stderr, and no false rejects over the real JPEG folders."""
import contextlib
import io
import os
import tempfile

import cv2
import numpy as np
import pytest
from PIL import Image as PILImage
from PIL import ImageOps
from sensor_msgs.msg import CompressedImage, Image

from lingbot_ros.io.image_codec import (CorruptImageError, ImageDecodeError,
                                        UnsupportedEncodingError, compressed_to_rgb,
                                        decode_compressed, decode_raw, fill_compressed,
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


@pytest.mark.parametrize("msg, error, text", [
    (Image(height=2, width=2, encoding="weird8", step=6, data=b"\0" * 12),
     UnsupportedEncodingError, "unsupported encoding 'weird8'; publish one of: 16uc1, 8uc1"),
    (Image(height=2, width=4, encoding="rgb8", step=6, data=b"\0" * 24),
     CorruptImageError, "step 6 is smaller"),
    (Image(height=4, width=4, encoding="rgb8", step=12, data=b"\0" * 20),
     CorruptImageError, "needs 48"),
    (Image(height=0, width=0, encoding="rgb8", step=0, data=b""), ImageDecodeError, "empty image"),
    (Image(height=100000, width=100000, encoding="mono8", step=100000, data=b""),
     ImageDecodeError, "exceeds max_image_pixels"),
    (Image(height=2, width=3, encoding="yuv422", step=6, data=b"\0" * 12),
     ImageDecodeError, "even width"),
])
def test_bad_raw_images_raise_a_specific_error(msg, error, text):
    with pytest.raises(error, match=text):
        image_to_rgb(msg)


@pytest.mark.parametrize("fmt, data, error, text", [
    ("jpeg", b"\xff\xd8\xff\xe0 this is not a jpeg", CorruptImageError, "corrupt JPEG header"),
    ("jpeg", b"", CorruptImageError, "empty"),
    ("jpeg", b"GIF89a" + b"\0" * 10, CorruptImageError, "neither JPEG nor PNG"),
    ("16UC1; compressedDepth", b"\0" * 10, UnsupportedEncodingError, "depth map"),
    ("tiff", b"\0" * 10, UnsupportedEncodingError, "unsupported compressed format 'tiff'"),
])
def test_bad_compressed_images_raise_a_specific_error(fmt, data, error, text):
    with pytest.raises(error, match=text):
        compressed_to_rgb(CompressedImage(format=fmt, data=data))


def test_fill_image_writes_bytes_and_step():
    depth = np.arange(12, dtype=np.float32).reshape(3, 4)
    msg = fill_image(Image(), depth, "32FC1")
    assert (msg.height, msg.width, msg.step, msg.encoding) == (3, 4, 16, "32FC1")
    np.testing.assert_array_equal(np.frombuffer(bytes(msg.data), np.float32).reshape(3, 4), depth)


def test_rosbags_messages_decode_as_rclpy_messages_do():
    """Bag readers hand over dataclasses whose data is a uint8 ndarray; same fields, same pixels."""
    from rosbags.typesys import Stores, get_typestore

    types = get_typestore(Stores.ROS2_KILTED).types
    header = types["std_msgs/msg/Header"](
        stamp=types["builtin_interfaces/msg/Time"](sec=1, nanosec=0), frame_id="cam")
    mosaic = RNG.integers(0, 256, (6, 8), dtype=np.uint8)
    rows = np.concatenate([mosaic, np.full((6, 3), 0xAB, np.uint8)], axis=1)   # step 11
    from_bag = types["sensor_msgs/msg/Image"](header=header, height=6, width=8,
                                              encoding="bayer_rggb8", is_bigendian=0, step=11,
                                              data=rows.reshape(-1).copy())
    from_topic = Image(height=6, width=8, encoding="bayer_rggb8", step=11, data=rows.tobytes())
    np.testing.assert_array_equal(image_to_rgb(from_bag), image_to_rgb(from_topic))
    np.testing.assert_array_equal(image_to_rgb(from_bag),
                                  decode_raw("bayer_rggb8", 6, 8, 11, False, rows.tobytes()))
    np.testing.assert_array_equal(image_to_rgb(from_bag),
                                  cv2.cvtColor(mosaic, cv2.COLOR_BayerRGGB2RGB))
    topic_jpeg = fill_compressed(CompressedImage(), RGB)
    bag_jpeg = types["sensor_msgs/msg/CompressedImage"](
        header=header, format="jpeg", data=np.frombuffer(bytes(topic_jpeg.data), np.uint8).copy())
    np.testing.assert_array_equal(compressed_to_rgb(bag_jpeg), compressed_to_rgb(topic_jpeg))


# ------------------------------------------------------------------ JPEG / PNG against Pillow

def pillow_reference(payload: bytes) -> np.ndarray:
    """Spec §3's loader: PIL, EXIF orientation, RGB."""
    return np.array(ImageOps.exif_transpose(PILImage.open(io.BytesIO(payload))).convert("RGB"))


def encoded(array: np.ndarray, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    PILImage.fromarray(array).save(buffer, fmt, **options)
    return buffer.getvalue()


SMOOTH = np.dstack([*np.meshgrid(np.linspace(0, 250, 10), np.linspace(0, 250, 6)),
                    np.full((6, 10), 90.0)]).astype(np.uint8)     # 10x6, no symmetry


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_matches_pillow_exif_transpose(orientation, fmt):
    exif = PILImage.Exif()
    exif[0x0112] = orientation
    payload = encoded(SMOOTH, fmt, exif=exif.tobytes())
    out = decode_compressed(payload)
    assert out.shape == ((10, 6, 3) if orientation >= 5 else (6, 10, 3))
    assert out.flags.c_contiguous and out.flags.writeable
    np.testing.assert_array_equal(out, pillow_reference(payload))


def test_tiff_orientation_reads_both_byte_orders_and_ignores_broken_exif():
    import struct

    from lingbot_ros.io.orientation import tiff_orientation

    def tiff(order: str, value: int, kind: int = 3) -> bytes:
        magic = b"II*\0" if order == "<" else b"MM\0*"
        return (magic + struct.pack(order + "IH", 8, 2)
                + struct.pack(order + "HHIHH", 0x010F, 2, 1, 0, 0)       # Make, before the tag
                + struct.pack(order + "HHIHH", 0x0112, kind, 1, value, 0))
    assert tiff("<", 6) and tiff_orientation(tiff("<", 6)) == 6
    assert tiff_orientation(tiff(">", 8)) == 8
    assert tiff_orientation(tiff(">", 9)) == 1            # out of range
    assert tiff_orientation(tiff(">", 6, kind=4)) == 1    # not a SHORT
    assert tiff_orientation(tiff(">", 6)[:30]) == 1       # cut inside the orientation entry
    assert tiff_orientation(b"junk") == 1


def test_png_modes_become_rgb_as_the_demo_loader_does():
    grey16 = np.array([[0x1234, 0xFF01]], np.uint16)
    np.testing.assert_array_equal(decode_compressed(encoded(grey16, "PNG"))[0],
                                  [[0x12] * 3, [0xFF] * 3])        # top byte, as raw mono16
    rgba = np.zeros((1, 3, 4), np.uint8)
    rgba[0, :, :3] = [200, 10, 50]
    rgba[0, :, 3] = [255, 0, 128]
    np.testing.assert_allclose(decode_compressed(encoded(rgba, "PNG"))[0],
                               [[200, 10, 50], [255, 255, 255], [227, 132, 152]], atol=1)
    np.testing.assert_array_equal(decode_compressed(encoded(SMOOTH, "PNG")), SMOOTH)


@pytest.mark.parametrize("fmt", ["jpeg", "png"])
def test_size_limit_is_the_callers(fmt):
    msg = fill_compressed(CompressedImage(), RGB, fmt)    # 8x6 = 48 pixels
    assert compressed_to_rgb(msg, max_pixels=48).shape == (6, 8, 3)
    with pytest.raises(ImageDecodeError, match="8x6 exceeds max_image_pixels=47"):
        compressed_to_rgb(msg, max_pixels=47)


# ------------------------------------------------------------------ corrupt data, stderr

class Fd2Capture:
    """Everything written to file descriptor 2 while inside, C libraries included (``output``)."""

    def __enter__(self):
        self._sink = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._sink.fileno(), 2)
        return self

    def __exit__(self, *exc):
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._sink.seek(0)
        self.output = self._sink.read()
        self._sink.close()


def accepted(variants: dict[str, bytes]) -> list[str]:
    """Names of the payloads that decode instead of raising CorruptImageError."""
    names = []
    for name, payload in variants.items():
        with contextlib.suppress(CorruptImageError):
            compressed_to_rgb(CompressedImage(format="jpeg", data=payload))
            names.append(name)
    return names


def corrupt_jpegs(jpeg: bytes) -> dict[str, bytes]:
    """Cuts, cuts closed by an EOI, flipped bytes in the scan data, bytes left before EOI."""
    sos = jpeg.index(b"\xff\xda")
    start, end = sos + 2 + int.from_bytes(jpeg[sos + 2:sos + 4], "big"), len(jpeg) - 2
    variants = {"16 bytes left before EOI": jpeg[:-2] + bytes(16) + b"\xff\xd9"}
    for share in (0.1, 0.5, 0.9):
        at = start + int((end - start) * share)
        flipped = bytearray(jpeg)
        flipped[at:at + 16] = bytes(b ^ 0x5A for b in flipped[at:at + 16])
        variants[f"cut at {share:.0%} of the scan"] = jpeg[:at]
        variants[f"cut at {share:.0%}, EOI appended"] = jpeg[:at] + b"\xff\xd9"
        variants[f"16 bytes flipped at {share:.0%}"] = bytes(flipped)
    return variants


@pytest.fixture(scope="module")
def courthouse_jpegs(shared_data):
    return sorted(shared_data("courthouse_jpg").glob("*.jpg"))


@pytest.mark.parametrize("index", [0, 143, 285])
def test_corrupt_jpegs_are_rejected_without_a_byte_on_stderr(courthouse_jpegs, index):
    variants = corrupt_jpegs(courthouse_jpegs[index].read_bytes())
    with Fd2Capture() as stderr:
        names = accepted(variants)
    assert names == [] and stderr.output == b""
    with pytest.raises(CorruptImageError, match=r"corrupt JPEG data \(\d+ bytes, 518x294\): "
                                                r".+; the image was damaged"):
        compressed_to_rgb(CompressedImage(format="jpeg",
                                          data=variants["16 bytes flipped at 50%"]))


def test_control_opencv_takes_a_corrupt_jpeg_and_libjpeg_prints(courthouse_jpegs):
    """What the capture above guards against: OpenCV's decoder (the node's before) returns the
    corrupt image as good while libjpeg writes its warning to fd 2."""
    payload = corrupt_jpegs(courthouse_jpegs[0].read_bytes())["16 bytes flipped at 50%"]
    with Fd2Capture() as stderr:
        image = cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None and b"Corrupt JPEG data" in stderr.output


def test_corrupt_pngs_are_rejected_without_a_byte_on_stderr():
    png = encoded(RNG.integers(0, 256, (40, 50, 3), dtype=np.uint8), "PNG")
    idat = png.index(b"IDAT")
    length = int.from_bytes(png[idat - 4:idat], "big")
    data_bit, crc_bit = bytearray(png), bytearray(png)
    data_bit[idat + 4 + length // 2] ^= 1
    crc_bit[idat + 4 + length] ^= 1
    variants = {"one bit of image data": bytes(data_bit), "one bit of IDAT's CRC": bytes(crc_bit),
                "cut before IEND": png[:-12], "cut inside IDAT": png[:idat + length // 2]}
    PILImage.open(io.BytesIO(bytes(crc_bit))).load()   # Pillow alone takes a bad IDAT CRC
    with Fd2Capture() as stderr:
        names = accepted(variants)
    assert names == [] and stderr.output == b""


@pytest.mark.parametrize("folder", ["courthouse_jpg", "loop_jpg"])
def test_every_real_jpeg_decodes_to_pillows_pixels(shared_data, folder):
    """No false rejects, and the pixels of spec §3's loader, for every frame of the real data."""
    files = sorted(shared_data(folder).glob("*.jpg"))
    assert len(files) > 200
    with Fd2Capture() as stderr:
        for path in files:
            payload = path.read_bytes()
            np.testing.assert_array_equal(decode_compressed(payload, "jpeg"),
                                          pillow_reference(payload), err_msg=str(path))
    assert stderr.output == b""


def test_strict_jpeg_false_takes_a_warning_but_not_a_fatal_error(courthouse_jpegs):
    jpeg = courthouse_jpegs[0].read_bytes()
    variants = corrupt_jpegs(jpeg)
    exact = compressed_to_rgb(CompressedImage(format="jpeg", data=jpeg))
    with Fd2Capture() as stderr:
        relaxed = compressed_to_rgb(CompressedImage(format="jpeg", data=variants["16 bytes left before EOI"]),
                                    strict_jpeg=False)
        damaged = compressed_to_rgb(CompressedImage(format="jpeg", data=variants["16 bytes flipped at 50%"]),
                                    strict_jpeg=False)
    assert stderr.output == b""
    np.testing.assert_array_equal(relaxed, exact)   # bytes before EOI: the pixels are exact
    assert damaged.shape == exact.shape and (damaged != exact).any()   # the trade-off the flag names
    with pytest.raises(CorruptImageError, match="corrupt JPEG header"):
        compressed_to_rgb(CompressedImage(format="jpeg", data=jpeg[:100]), strict_jpeg=False)
    with pytest.raises(CorruptImageError, match="strict_jpeg false"):
        compressed_to_rgb(CompressedImage(format="jpeg", data=variants["16 bytes left before EOI"]))
