"""Frame sources for the offline tool, the demo and the camera publisher.

Folder of images, video file, rosbag2, camera device, synthetic pattern. Image files and bag
messages decode through :mod:`lingbot_ros.io.image_codec`, the node's own decoder, so a bag or a
folder gives the pixels the node would get from the same messages.

Every source is an iterable of :class:`Frame` ``(stamp_ns, rgb)`` with ``stamp_ns`` integer
nanoseconds and ``rgb`` a uint8 ``[H, W, 3]`` RGB array. Iterating opens the underlying file or
device and the generator closes it when exhausted or closed (``contextlib.closing`` when breaking
out early). ``num_frames`` is the frame count when known up front, else None (cameras, endless
synthetic, some videos). ``first_size()`` is the size of the first frame that decodes, read through
an iteration of its own (the warm-up's size, mapping/warmup_size.py).

:func:`open_source` picks the source from a spec string; see its docstring for the rules.
"""
from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Iterator, NamedTuple

import cv2
import numpy as np

from lingbot_ros.io.image_codec import (ImageDecodeError, compressed_to_rgb, decode_compressed,
                                        image_to_rgb)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv")
BAG_STORAGE_SUFFIXES = (".mcap", ".db3")
IMAGE_MSGTYPE = "sensor_msgs/msg/Image"
COMPRESSED_MSGTYPE = "sensor_msgs/msg/CompressedImage"
DEFAULT_RATE_HZ = 10.0


class SourceError(Exception):
    """Base of the frame-source errors; the message says what to change."""


class SourceNotFoundError(SourceError, FileNotFoundError):
    """The path or camera device does not exist or cannot be opened."""


class EmptySourceError(SourceError):
    """The source exists but holds no frames."""


class UnknownSourceFormatError(SourceError):
    """The spec names something that is not a folder, video, bag, camera index or 'synthetic'."""


class NoImageTopicError(SourceError):
    """The bag has no sensor_msgs/Image or CompressedImage topic (or not the one asked for)."""


class FrameDecodeError(SourceError):
    """A file or message of the source does not decode; ``__cause__`` is the ImageDecodeError."""


def _undecodable(on_undecodable, error: FrameDecodeError, cause: ImageDecodeError) -> None:
    """Raise ``error``, or hand it to ``on_undecodable`` and let the source go on to the next frame
    (the node skips such a frame too: a long bag is not lost to one damaged message)."""
    if on_undecodable is None:
        raise error from cause
    error.__cause__ = cause
    on_undecodable(error)


class Frame(NamedTuple):
    stamp_ns: int       # integer nanoseconds (header stamp for bags, capture clock for cameras)
    rgb: np.ndarray     # [H, W, 3] uint8 RGB


def _pass_over(error: FrameDecodeError) -> None:
    """A frame that does not decode while only the size is read: the run itself reports it."""


class _Source:
    """What every source shares; each yields its frames from ``_frames(on_undecodable)``."""

    on_undecodable = None   # sources whose frames can fail to decode take it as a parameter

    def first_size(self) -> tuple[int, int] | None:
        """(width, height) of the first frame that decodes, None if none does; the iteration that
        reads it is closed at once (a camera is opened for it and closed again)."""
        with contextlib.closing(self._frames(_pass_over)) as frames:
            frame = next(frames, None)
        return None if frame is None else (frame.rgb.shape[1], frame.rgb.shape[0])

    def __iter__(self) -> Iterator[Frame]:
        return self._frames(self.on_undecodable)


def rate_stamp_ns(i: int, rate_hz: float) -> int:
    """Frame ``i``'s stamp at ``rate_hz`` from 0, in whole nanoseconds (``i`` times a float period
    would add up its rounding)."""
    return round(i * 1_000_000_000 / rate_hz)


class FolderSource(_Source):
    """Image files of a folder in sorted name order, stamped ``i / rate_hz``."""

    def __init__(self, folder: str | Path, rate_hz: float = DEFAULT_RATE_HZ, strict_jpeg: bool = True,
                 on_undecodable=None):
        folder = Path(folder)
        if not folder.is_dir():
            raise SourceNotFoundError(f"image folder {folder} does not exist")
        if not rate_hz > 0:
            raise ValueError(f"rate_hz must be > 0, got {rate_hz}")
        self.files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not self.files:
            raise EmptySourceError(f"folder {folder} holds no {'/'.join(IMAGE_SUFFIXES)} images")
        self.rate_hz = float(rate_hz)
        self.strict_jpeg, self.on_undecodable = strict_jpeg, on_undecodable
        self.num_frames: int | None = len(self.files)
        self.description = f"folder {folder} ({len(self.files)} images at {rate_hz:g} Hz)"

    def _frames(self, on_undecodable) -> Iterator[Frame]:
        for i, path in enumerate(self.files):
            try:
                rgb = decode_compressed(path.read_bytes(), strict_jpeg=self.strict_jpeg)
            except ImageDecodeError as err:
                _undecodable(on_undecodable, FrameDecodeError(f"image {path}: {err}"), err)
                continue
            yield Frame(rate_stamp_ns(i, self.rate_hz), rgb)


class VideoSource(_Source):
    """Frames of a video file (OpenCV), stamped ``i / fps`` (``rate_hz`` overrides the fps)."""

    def __init__(self, path: str | Path, rate_hz: float | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise SourceNotFoundError(f"video file {self.path} does not exist")
        capture = self._open()
        try:
            fps = capture.get(cv2.CAP_PROP_FPS)
            count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
        finally:
            capture.release()
        self.rate_hz = float(rate_hz) if rate_hz else (fps if fps > 0 else DEFAULT_RATE_HZ)
        # Containers may report a wrong or zero count; it only feeds progress output.
        self.num_frames: int | None = count if count > 0 else None
        self.description = f"video {self.path} ({count} frames at {self.rate_hz:g} Hz)"

    def _open(self) -> cv2.VideoCapture:
        capture = cv2.VideoCapture(str(self.path))
        if not capture.isOpened():
            raise UnknownSourceFormatError(
                f"OpenCV cannot open {self.path} as a video; convert it to mp4/avi or pass a "
                "folder of images")
        return capture

    def _frames(self, on_undecodable) -> Iterator[Frame]:
        capture = self._open()
        try:
            i = 0
            while True:
                ok, bgr = capture.read()
                if not ok:
                    return
                yield Frame(rate_stamp_ns(i, self.rate_hz), cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
                i += 1
        finally:
            capture.release()


class CameraSource(_Source):
    """Live frames of an OpenCV camera device, stamped with the wall clock at capture."""

    def __init__(self, index: int):
        self.index = index
        self.num_frames: int | None = None
        self.description = f"camera device {index}"

    def _frames(self, on_undecodable) -> Iterator[Frame]:
        capture = cv2.VideoCapture(self.index)
        if not capture.isOpened():
            raise SourceNotFoundError(f"camera device {self.index} cannot be opened (is it "
                                      "connected and not used by another program?)")
        try:
            while True:
                ok, bgr = capture.read()
                stamp_ns = time.time_ns()
                if not ok:
                    return
                yield Frame(stamp_ns, cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
        finally:
            capture.release()


class SyntheticSource(_Source):
    """A deterministic, smoothly moving colour pattern; never all zeros (values 16..239).

    Three sinusoidal gratings drift at different speeds and directions plus a slowly moving
    bright disc, so consecutive frames differ smoothly and every frame has texture.
    """

    def __init__(self, width: int = 640, height: int = 480, num_frames: int | None = None,
                 rate_hz: float = DEFAULT_RATE_HZ):
        if width < 1 or height < 1:
            raise ValueError(f"synthetic size must be positive, got {width}x{height}")
        if not rate_hz > 0:
            raise ValueError(f"rate_hz must be > 0, got {rate_hz}")
        self.width, self.height, self.rate_hz = width, height, float(rate_hz)
        self.num_frames = num_frames
        count = "endless" if num_frames is None else f"{num_frames} frames"
        self.description = f"synthetic {width}x{height} ({count} at {rate_hz:g} Hz)"

    def frame(self, i: int) -> np.ndarray:
        """Frame ``i`` as ``[height, width, 3]`` uint8 RGB."""
        y, x = np.mgrid[0:self.height, 0:self.width].astype(np.float32)
        y /= max(self.height, self.width)
        x /= max(self.height, self.width)
        t = i / 30.0
        channels = [np.sin(2 * math.pi * (6 * x + 0.5 * t)),
                    np.sin(2 * math.pi * (5 * y - 0.3 * t)),
                    np.sin(2 * math.pi * (4 * (x + y) + 0.2 * t))]
        cx, cy = 0.5 + 0.25 * math.cos(t), 0.35 + 0.15 * math.sin(t)
        disc = np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / 0.005)
        rgb = np.stack([0.8 * c + 0.2 * disc for c in channels], axis=-1)   # in [-0.8, 1.0]
        return (128 + 111 * np.clip(rgb, -1, 1)).astype(np.uint8)

    def first_size(self) -> tuple[int, int] | None:
        return (self.width, self.height) if self.num_frames != 0 else None

    def _frames(self, on_undecodable) -> Iterator[Frame]:
        i = 0
        while self.num_frames is None or i < self.num_frames:
            yield Frame(rate_stamp_ns(i, self.rate_hz), self.frame(i))
            i += 1


class BagSource(_Source):
    """Image messages of one topic of a rosbag2 (mcap or sqlite3), stamped by ``header.stamp``.

    Decodes ``sensor_msgs/msg/Image`` (every encoding of
    :data:`lingbot_ros.io.image_codec.SUPPORTED_ENCODINGS`, as the node does) and
    ``sensor_msgs/msg/CompressedImage`` (JPEG/PNG). A message that does not decode raises
    :class:`FrameDecodeError` naming it. Without ``topic`` the bag's first image topic is used.
    """

    def __init__(self, path: str | Path, topic: str | None = None, strict_jpeg: bool = True,
                 on_undecodable=None):
        self.strict_jpeg, self.on_undecodable = strict_jpeg, on_undecodable
        from rosbags.highlevel import AnyReader, AnyReaderError  # import cost only when used
        from rosbags.typesys import Stores, get_typestore

        self.path = Path(path)
        if not self.path.exists():
            raise SourceNotFoundError(f"bag {self.path} does not exist")
        self._typestore = get_typestore(Stores.LATEST)  # for bags without embedded definitions
        self._reader_type, self._reader_error = AnyReader, AnyReaderError
        with self._reader() as reader:
            images = [c for c in reader.connections
                      if c.msgtype in (IMAGE_MSGTYPE, COMPRESSED_MSGTYPE)]
            available = ", ".join(f"{c.topic} [{c.msgtype}]" for c in reader.connections)
        if not images:
            raise NoImageTopicError(f"bag {self.path} has no {IMAGE_MSGTYPE} or "
                                    f"{COMPRESSED_MSGTYPE} topic (topics: {available or 'none'})")
        if topic is None:
            topic = images[0].topic
        self._connections = [c for c in images if c.topic == topic]
        if not self._connections:
            raise NoImageTopicError(
                f"bag {self.path} has no image topic {topic!r}; image topics: "
                + ", ".join(sorted({c.topic for c in images})))
        self.topic = topic
        self.num_frames: int | None = sum(c.msgcount for c in self._connections)
        if self.num_frames == 0:
            raise EmptySourceError(f"bag {self.path} has no messages on {topic}")
        self.description = f"bag {self.path} topic {topic} ({self.num_frames} messages)"

    def _reader(self):
        try:
            return self._reader_type([self.path], default_typestore=self._typestore)
        except self._reader_error as err:
            raise UnknownSourceFormatError(f"cannot read {self.path} as a rosbag2: {err}") from err

    def _frames(self, on_undecodable) -> Iterator[Frame]:
        with self._reader() as reader:
            connections = [c for c in reader.connections
                           if c.topic == self.topic and c.msgtype in (IMAGE_MSGTYPE,
                                                                      COMPRESSED_MSGTYPE)]
            for index, (connection, _, raw) in enumerate(reader.messages(connections=connections)):
                msg = reader.deserialize(raw, connection.msgtype)
                compressed = connection.msgtype == COMPRESSED_MSGTYPE
                try:
                    rgb = (compressed_to_rgb(msg, strict_jpeg=self.strict_jpeg) if compressed
                           else image_to_rgb(msg))
                except ImageDecodeError as err:
                    _undecodable(on_undecodable, FrameDecodeError(
                        f"bag {self.path} topic {self.topic} message {index}: {err}"), err)
                    continue
                yield Frame(msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec, rgb)


def open_source(spec: str, rate_hz: float | None = None, topic: str | None = None,
                strict_jpeg: bool = True, on_undecodable=None):
    """Open a frame source from a spec string.

    Rules, in order:
      * ``synthetic``, ``synthetic:WxH`` or ``synthetic:WxH:N`` -> :class:`SyntheticSource`
        (640x480, endless by default).
      * a non-negative integer such as ``0`` -> :class:`CameraSource` (OpenCV device index).
      * a directory with ``metadata.yaml``, or a ``.mcap`` / ``.db3`` file -> :class:`BagSource`
        (``topic`` picks the image topic; default: the first one).
      * a directory -> :class:`FolderSource` of its .jpg/.jpeg/.png files.
      * a file with a video suffix (.mp4, .avi, .mov, .mkv, ...) -> :class:`VideoSource`.

    ``rate_hz`` stamps sources without their own clock (folders, synthetic: default 10 Hz) and
    overrides a video's own frame rate; bags keep their header stamps, cameras the wall clock.
    ``strict_jpeg`` False lets JPEGs with libjpeg warnings through (folders, bags; see
    :mod:`lingbot_ros.io.compressed_image`). A frame that does not decode raises
    :class:`FrameDecodeError`, or with ``on_undecodable`` is handed to it and skipped.
    """
    if spec == "synthetic" or spec.startswith("synthetic:"):
        return _synthetic_from_spec(spec, rate_hz or DEFAULT_RATE_HZ)
    if spec.isdigit():
        return CameraSource(int(spec))
    path = Path(spec).expanduser()
    if not path.exists():
        raise SourceNotFoundError(f"input {spec!r} does not exist (expected an image folder, a "
                                  "video file, a rosbag2, a camera index or 'synthetic')")
    if path.is_dir():
        if (path / "metadata.yaml").exists():
            return BagSource(path, topic, strict_jpeg, on_undecodable)
        return FolderSource(path, rate_hz or DEFAULT_RATE_HZ, strict_jpeg=strict_jpeg,
                            on_undecodable=on_undecodable)
    suffix = path.suffix.lower()
    if suffix in BAG_STORAGE_SUFFIXES:
        return BagSource(path, topic, strict_jpeg, on_undecodable)
    if suffix in VIDEO_SUFFIXES:
        return VideoSource(path, rate_hz)
    raise UnknownSourceFormatError(
        f"cannot tell what {spec!r} is: expected a folder of images, a video "
        f"({', '.join(VIDEO_SUFFIXES)}), a rosbag2 directory or {'/'.join(BAG_STORAGE_SUFFIXES)}"
        " file, a camera index or 'synthetic'")


def _synthetic_from_spec(spec: str, rate_hz: float) -> SyntheticSource:
    parts = spec.split(":")
    try:
        if len(parts) > 3:
            raise ValueError
        width, height = (int(v) for v in parts[1].split("x")) if len(parts) > 1 else (640, 480)
        num_frames = int(parts[2]) if len(parts) > 2 else None
    except ValueError:
        raise UnknownSourceFormatError(
            f"bad synthetic spec {spec!r}; use 'synthetic', 'synthetic:640x480' or "
            "'synthetic:640x480:100'") from None
    return SyntheticSource(width, height, num_frames, rate_hz)
