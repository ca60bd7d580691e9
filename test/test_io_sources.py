"""io/sources.py on tiny generated folders, videos and bags, and on ../shared/data. Bags and
folders decode through the node's own decoder (io/image_codec.py)."""
import contextlib
import io

import cv2
import numpy as np
import pytest
from PIL import Image
from sensor_msgs.msg import Image as RosImage

from lingbot_ros.io.image_codec import CorruptImageError, UnsupportedEncodingError, image_to_rgb
from lingbot_ros.io.sources import (BagSource, CameraSource, EmptySourceError, FolderSource,
                                    FrameDecodeError, NoImageTopicError, SourceNotFoundError,
                                    SyntheticSource, UnknownSourceFormatError, VideoSource,
                                    open_source, rate_stamp_ns)


def pattern(i, height=24, width=32):
    """Distinct, lossless-checkable RGB frame."""
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([(x * 7 + i * 20) % 256, (y * 9) % 256, np.full_like(x, 40 + i)],
                    -1).astype(np.uint8)


# ------------------------------------------------------------------------ folder

def test_folder_sorted_with_rate_stamps(tmp_path):
    for i in (2, 0, 1):
        Image.fromarray(pattern(i)).save(tmp_path / f"{i:06d}.png")
    (tmp_path / "notes.txt").write_text("not an image")
    source = open_source(str(tmp_path), rate_hz=4.0)
    assert isinstance(source, FolderSource) and source.num_frames == 3
    frames = list(source)
    assert [f.stamp_ns for f in frames] == [0, 250_000_000, 500_000_000]
    for i, frame in enumerate(frames):
        assert frame.rgb.dtype == np.uint8 and frame.rgb.shape == (24, 32, 3)
        np.testing.assert_array_equal(frame.rgb, pattern(i))


def test_folder_alpha_composited_on_white_and_grey_to_rgb(tmp_path):
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[:2, :, 3] = 255                     # top half opaque red-ish, bottom fully transparent
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    Image.fromarray(np.full((4, 4), 77, np.uint8), "L").save(tmp_path / "b.png")
    first, second = [f.rgb for f in FolderSource(tmp_path)]
    np.testing.assert_array_equal(first[0, 0], [200, 0, 0])
    np.testing.assert_array_equal(first[3, 0], [255, 255, 255])
    np.testing.assert_array_equal(second[0, 0], [77, 77, 77])


def test_folder_applies_exif_orientation(tmp_path):
    """EXIF orientation 6 (rotate 90 clockwise to display): a 32x24 JPEG comes out 24x32."""
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(pattern(0)).save(tmp_path / "r.jpg", exif=exif.tobytes())
    (frame,) = FolderSource(tmp_path)
    assert frame.rgb.shape == (32, 24, 3)


def test_missing_and_empty_and_unknown(tmp_path):
    with pytest.raises(SourceNotFoundError, match="does not exist"):
        open_source(str(tmp_path / "nope"))
    with pytest.raises(EmptySourceError, match="no .jpg/.jpeg/.png"):
        open_source(str(tmp_path))
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(UnknownSourceFormatError, match="cannot tell what"):
        open_source(str(tmp_path / "x.txt"))
    with pytest.raises(UnknownSourceFormatError, match="synthetic:640x480"):
        open_source("synthetic:big")


# ------------------------------------------------------------------------- video

def test_video_frames_and_stamps(tmp_path):
    path = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 5.0, (32, 24))
    assert writer.isOpened(), "OpenCV build cannot write MJPG avi"
    for i in range(4):
        writer.write(cv2.cvtColor(pattern(i), cv2.COLOR_RGB2BGR))
    writer.release()
    source = open_source(str(path))
    assert isinstance(source, VideoSource) and source.num_frames == 4
    frames = list(source)
    assert [f.stamp_ns for f in frames] == [0, 200_000_000, 400_000_000, 600_000_000]
    for i, frame in enumerate(frames):
        assert frame.rgb.shape == (24, 32, 3)
        # MJPG is lossy: compare loosely, but the colour order must be RGB (blue = 40 + i).
        assert abs(float(frame.rgb[..., 2].mean()) - (40 + i)) < 6
        assert np.abs(frame.rgb.astype(int) - pattern(i)).mean() < 8
    assert [f.stamp_ns for f in VideoSource(path, rate_hz=2.0)][1] == 500_000_000



def test_rate_stamps_are_whole_nanoseconds_from_the_frame_number():
    """Each stamp from i and the rate: no float period summed, so frame 30000 of an NTSC video is
    at exactly 1001 s."""
    assert [rate_stamp_ns(i, 3.0) for i in range(4)] == [0, 333_333_333, 666_666_667, 1_000_000_000]
    assert rate_stamp_ns(30_000, 30_000 / 1001) == 1001 * 10**9

def test_corrupt_video_is_reported(tmp_path):
    path = tmp_path / "broken.mp4"
    path.write_bytes(b"not a video at all")
    with pytest.raises(UnknownSourceFormatError, match="OpenCV cannot open"):
        open_source(str(path))


# --------------------------------------------------------------------------- bags

def write_bag(path, messages, storage="mcap"):
    """messages: list of (topic, msgtype, kwargs for the message without header, stamp_ns)."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    typestore = get_typestore(Stores.ROS2_KILTED)
    header_type = typestore.types["std_msgs/msg/Header"]
    time_type = typestore.types["builtin_interfaces/msg/Time"]
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        connections = {}
        for topic, msgtype, fields, stamp_ns in messages:
            if topic not in connections:
                connections[topic] = writer.add_connection(topic, msgtype, typestore=typestore)
            header = header_type(stamp=time_type(sec=stamp_ns // 10**9,
                                                 nanosec=stamp_ns % 10**9), frame_id="cam")
            msg = typestore.types[msgtype](header=header, **fields)
            writer.write(connections[topic], stamp_ns, typestore.serialize_cdr(msg, msgtype))


def raw_fields(rgb, encoding, pad=0):
    """sensor_msgs/Image fields for an RGB frame, with `pad` junk bytes at the end of each row."""
    pixels = {"rgb8": rgb, "bgr8": rgb[..., ::-1], "mono8": rgb[..., :1],
              "bgra8": np.concatenate([rgb[..., ::-1], np.full_like(rgb[..., :1], 9)], -1)}
    rows = pixels[encoding].reshape(rgb.shape[0], -1)
    rows = np.concatenate([rows, np.full((rows.shape[0], pad), 123, np.uint8)], 1)
    return dict(height=rgb.shape[0], width=rgb.shape[1], encoding=encoding, is_bigendian=0,
                step=rows.shape[1], data=rows.reshape(-1).copy())


def jpeg_fields(rgb, fmt="jpeg"):
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG" if fmt == "png" else "JPEG", quality=95)
    return dict(format=fmt, data=np.frombuffer(buffer.getvalue(), np.uint8).copy())


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
@pytest.mark.parametrize("encoding,pad", [("rgb8", 0), ("bgr8", 4), ("bgra8", 0), ("mono8", 3)])
def test_bag_raw_images(tmp_path, storage, encoding, pad):
    stamps = [1_700_000_000_000_000_000 + i * 50_000_000 for i in range(3)]
    write_bag(tmp_path / "bag", [("/cam/image_raw", "sensor_msgs/msg/Image",
                                  raw_fields(pattern(i), encoding, pad), s)
                                 for i, s in enumerate(stamps)], storage)
    source = open_source(str(tmp_path / "bag"))
    assert isinstance(source, BagSource) and source.num_frames == 3
    frames = list(source)
    assert [f.stamp_ns for f in frames] == stamps   # exact: no float in between
    for i, frame in enumerate(frames):
        expected = pattern(i)
        if encoding == "mono8":
            expected = np.repeat(expected[..., :1], 3, -1)
        np.testing.assert_array_equal(frame.rgb, expected)


def test_bag_compressed_png_exact_and_first_image_topic_picked(tmp_path):
    """Without a topic, the first image topic of the bag is used (not the alphabetical first)."""
    stamp = 1_700_000_001_250_000_000
    write_bag(tmp_path / "bag", [
        ("/zzz/compressed", "sensor_msgs/msg/CompressedImage", jpeg_fields(pattern(5), "png"),
         stamp),
        ("/cam/compressed", "sensor_msgs/msg/CompressedImage", jpeg_fields(pattern(1), "png"),
         stamp + 1),
    ])
    source = open_source(str(tmp_path / "bag"))
    assert source.topic == "/zzz/compressed"
    (frame,) = list(source)
    np.testing.assert_array_equal(frame.rgb, pattern(5))
    assert frame.stamp_ns == stamp
    (frame,) = list(open_source(str(tmp_path / "bag"), topic="/cam/compressed"))
    np.testing.assert_array_equal(frame.rgb, pattern(1))
    with pytest.raises(NoImageTopicError, match="image topics: /cam/compressed, /zzz"):
        open_source(str(tmp_path / "bag"), topic="/missing")


def test_bag_compressed_jpeg_close_to_original(tmp_path):
    write_bag(tmp_path / "bag", [("/cam", "sensor_msgs/msg/CompressedImage",
                                  jpeg_fields(pattern(2)), 5)])
    (frame,) = list(open_source(str(tmp_path / "bag")))
    assert np.abs(frame.rgb.astype(int) - pattern(2)).mean() < 6


def test_bag_without_image_topics(tmp_path):
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    typestore = get_typestore(Stores.ROS2_KILTED)
    string_type = typestore.types["std_msgs/msg/String"]
    with Writer(tmp_path / "bag", version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        connection = writer.add_connection("/chatter", "std_msgs/msg/String", typestore=typestore)
        writer.write(connection, 1, typestore.serialize_cdr(string_type(data="hi"),
                                                            "std_msgs/msg/String"))
    with pytest.raises(NoImageTopicError, match=r"/chatter \[std_msgs/msg/String\]"):
        open_source(str(tmp_path / "bag"))


def test_bag_storage_file_directly(tmp_path):
    write_bag(tmp_path / "bag", [("/cam", "sensor_msgs/msg/Image", raw_fields(pattern(0), "rgb8"),
                                  10**9)])
    (mcap,) = (tmp_path / "bag").glob("*.mcap")
    (frame,) = list(open_source(str(mcap)))
    np.testing.assert_array_equal(frame.rgb, pattern(0))


def mosaic_of(rgb, pattern="rggb"):
    """Bayer mosaic of an RGB frame: each pixel keeps the channel its 2x2 cell position names."""
    channel = {"r": 0, "g": 1, "b": 2}
    mosaic = np.empty(rgb.shape[:2], rgb.dtype)
    for k, (row, col) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        mosaic[row::2, col::2] = rgb[row::2, col::2, channel[pattern[k]]]
    return mosaic


def padded_fields(array, encoding, pad=6, big_endian=False):
    """Image fields for [H, W] or [H, W, C] samples (8 or 16 bit), with junk at each row's end."""
    if array.dtype.itemsize == 2:
        array = array.astype(">u2" if big_endian else "<u2")
    rows = array.reshape(array.shape[0], -1).view(np.uint8)
    rows = np.concatenate([rows, np.full((rows.shape[0], pad), 0xAB, np.uint8)], 1)
    return dict(height=array.shape[0], width=array.shape[1], encoding=encoding,
                is_bigendian=int(big_endian), step=rows.shape[1], data=rows.reshape(-1).copy())


@pytest.mark.parametrize("encoding, samples, big_endian", [
    ("bayer_rggb8", mosaic_of(pattern(3)), False),
    ("bayer_gbrg16", mosaic_of(pattern(3), "gbrg").astype(np.uint16) * 257, True),
    ("yuv422", np.dstack([np.full((24, 32), 128, np.uint8), pattern(3)[..., 1]]), False),
    ("mono16", pattern(3)[..., 0].astype(np.uint16) * 256 + 99, True),
])
def test_bag_decodes_every_raw_encoding_as_the_node_does(tmp_path, encoding, samples, big_endian):
    """Bayer, YUV 4:2:2 and 16-bit bags (failed offline before): the same pixels the node's
    decoder gives for the same fields in an rclpy message."""
    fields = padded_fields(samples, encoding, big_endian=big_endian)
    write_bag(tmp_path / "bag", [("/cam/image_raw", "sensor_msgs/msg/Image", fields, 10**9)])
    (frame,) = list(open_source(str(tmp_path / "bag")))
    node_rgb = image_to_rgb(RosImage(**{**fields, "data": fields["data"].tobytes()}))
    np.testing.assert_array_equal(frame.rgb, node_rgb)
    assert frame.rgb.shape == (24, 32, 3)


def test_bag_bayer_frame_has_the_scene_colours(tmp_path):
    """Demosaicing a flat colour gives that colour back (the pattern name is honoured)."""
    flat = np.empty((8, 10, 3), np.uint8)
    flat[:] = [200, 120, 40]
    write_bag(tmp_path / "bag", [("/cam", "sensor_msgs/msg/Image",
                                  padded_fields(mosaic_of(flat, "grbg"), "bayer_grbg8"), 5)])
    (frame,) = list(open_source(str(tmp_path / "bag")))
    np.testing.assert_allclose(frame.rgb[2:-2, 2:-2].reshape(-1, 3).mean(0), [200, 120, 40],
                               atol=2)


def test_bag_message_that_does_not_decode_is_named(tmp_path):
    good = raw_fields(pattern(0), "rgb8")
    write_bag(tmp_path / "bag", [
        ("/cam", "sensor_msgs/msg/Image", good, 1),
        ("/cam", "sensor_msgs/msg/Image", {**good, "encoding": "32FC1"}, 2),
    ])
    frames = iter(open_source(str(tmp_path / "bag")))
    np.testing.assert_array_equal(next(frames).rgb, pattern(0))
    with pytest.raises(FrameDecodeError, match=r"topic /cam message 1: unsupported encoding "
                                               r"'32FC1'; publish one of") as caught:
        next(frames)
    assert isinstance(caught.value.__cause__, UnsupportedEncodingError)


def test_bag_and_folder_reject_a_corrupt_jpeg(tmp_path):
    jpeg = jpeg_fields(pattern(1, 96, 128))["data"].tobytes()
    sos = jpeg.index(b"\xff\xda")
    scan = sos + 2 + int.from_bytes(jpeg[sos + 2:sos + 4], "big")     # first byte of scan data
    cut = jpeg[:(scan + len(jpeg)) // 2] + b"\xff\xd9"     # cut inside the scan, closed by an EOI
    write_bag(tmp_path / "bag", [("/cam", "sensor_msgs/msg/CompressedImage",
                                  dict(format="jpeg", data=np.frombuffer(cut, np.uint8).copy()),
                                  1)])
    with pytest.raises(FrameDecodeError, match="message 0: corrupt JPEG data") as caught:
        list(open_source(str(tmp_path / "bag")))
    assert isinstance(caught.value.__cause__, CorruptImageError)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "000000.jpg").write_bytes(cut)
    with pytest.raises(FrameDecodeError, match="000000.jpg: corrupt JPEG data"):
        list(open_source(str(tmp_path / "folder")))


def test_with_on_undecodable_a_bag_hands_over_the_bad_message_and_goes_on(tmp_path):
    good = [jpeg_fields(pattern(i, 96, 128))["data"] for i in range(3)]
    bad = np.frombuffer(good[1].tobytes()[:200] + b"\xff\xd9", np.uint8).copy()
    write_bag(tmp_path / "bag", [("/cam", "sensor_msgs/msg/CompressedImage", dict(format="jpeg", data=data), i)
                                 for i, data in enumerate([good[0], bad, good[2]])])
    skipped: list = []
    frames = list(open_source(str(tmp_path / "bag"), on_undecodable=skipped.append))
    assert len(frames) == 2 and len(skipped) == 1
    assert isinstance(skipped[0], FrameDecodeError) and "message 1" in str(skipped[0])
    assert isinstance(skipped[0].__cause__, CorruptImageError)


# ------------------------------------------------------------------ synthetic, camera

def test_synthetic_deterministic_moving_never_zero():
    source = open_source("synthetic:40x30:5", rate_hz=20.0)
    assert isinstance(source, SyntheticSource) and source.num_frames == 5
    frames = list(source)
    again = list(open_source("synthetic:40x30:5", rate_hz=20.0))
    assert [f.stamp_ns for f in frames] == [k * 50_000_000 for k in range(5)]
    for a, b in zip(frames, again):
        np.testing.assert_array_equal(a.rgb, b.rgb)
        assert a.rgb.shape == (30, 40, 3) and a.rgb.min() > 0 and a.rgb.std() > 20
    steps = [np.abs(frames[i + 1].rgb.astype(int) - frames[i].rgb).mean() for i in range(4)]
    assert all(0 < s < 20 for s in steps)      # moves, but smoothly


def test_camera_index_spec_and_missing_device():
    source = open_source("97")
    assert isinstance(source, CameraSource) and source.num_frames is None
    with pytest.raises(SourceNotFoundError, match="camera device 97"):
        with contextlib.closing(iter(source)) as frames:
            next(frames)


# ------------------------------------------------------------------- shared data

def test_shared_loop_jpg_folder(shared_data):
    source = open_source(str(shared_data("loop_jpg")))
    assert source.num_frames == 237
    with contextlib.closing(iter(source)) as frames:
        first = next(frames)
    assert first.rgb.shape == (294, 518, 3) and first.stamp_ns == 0


def test_shared_courthouse_bag_matches_jpg_folder(shared_data):
    """Every message of the real bag decodes (no false rejects), same size as the folder's."""
    bag = open_source(str(shared_data("courthouse_bag")))
    folder = open_source(str(shared_data("courthouse_jpg")))
    assert bag.topic == "/camera/image_raw/compressed" and bag.num_frames == 286
    frames = 0
    for i, (from_bag, from_folder) in enumerate(zip(bag, folder)):
        assert from_bag.stamp_ns == 1_700_000_000 * 10**9 + i * 10**8
        # Same scene, same size; the README does not promise byte-identical JPEGs.
        assert from_bag.rgb.shape == from_folder.rgb.shape == (294, 518, 3)
        frames += 1
    assert frames == 286
