"""The continuation: what a resumed run needs to start the next window, one typed record.

The Mapper builds one (``continuation_of``) while mapping and at a clean end; the recorder hands it
to the writer thread, which stores it field by field (``continuations`` and ``overlap_frames``,
database/schema.py); a resume reads it back (database/resume.py) as ``ResumedFrame``s.

    window        the window number the next one follows
    next_index    the next input frame's index
    placement     the stream's Placement (model world -> internal frame)
    overlap       the window's last ov frames as they ran (image, pose encoding, depth), oldest first
    provisional   its provisional frames, (index, points stored) in the order of their points
    carried       the stream's scale state and, with an estimated scale, the odometry its next
                  keyframe look-ups read (StreamFrames.stored; name -> array)
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from ..placement.conversion import Placement
from ..store.points import to_numpy
from .blobs import array_blob, arrays_blob


@dataclasses.dataclass(frozen=True)
class OverlapFrame:
    """One of the window's last ov frames, for the next window to align to."""

    index: int
    stamp_ns: int
    rgb: np.ndarray        # HxWx3 uint8, as the frame came in
    pose_enc: np.ndarray   # the model's outputs for it
    depth: np.ndarray
    is_keyframe: bool

    @property
    def nbytes(self) -> int:
        return self.rgb.nbytes + self.pose_enc.nbytes + self.depth.nbytes


@dataclasses.dataclass(frozen=True)
class ResumedFrame:
    """An overlap frame read back: its image and its stored result (a FrameResult's fields)."""

    index: int
    stamp_ns: int
    rgb: np.ndarray
    result: object


@dataclasses.dataclass(frozen=True)
class Continuation:
    window: int
    next_index: int
    placement: Placement
    overlap: tuple[OverlapFrame, ...]
    provisional: tuple[tuple[int, bool], ...]
    carried: dict

    @property
    def nbytes(self) -> int:
        """The overlap frames' array bytes (the writer's backlog bound counts them)."""
        return sum(frame.nbytes for frame in self.overlap)


def continuation_of(stream, next_index: int, robot, with_points: bool) -> Continuation:
    """The continuation of ``stream`` (a StreamState). Without points (one stored while mapping)
    no provisional frame has stored points: the resumed window runs them again anyway, as they
    are among its last ov frames."""
    windows, overlap = stream.windows, []
    if windows is not None and not windows.switch_refusal():
        frames = list(windows.inputs)[-windows.overlap:]
        for pending, result in zip(frames, list(windows.tail)[-windows.overlap:]):
            overlap.append(OverlapFrame(pending.index, pending.frame.stamp_ns, pending.frame.rgb,
                                        to_numpy(result.pose_enc), to_numpy(result.depth), bool(result.is_keyframe)))
    provisional = [] if windows is None else (
        [(index, with_points and points is not None) for index, (_, points) in windows.resumed.items()]
        + [(o.index, with_points and o.is_keyframe) for o in windows.provisional()])
    carried = stream.frames.stored()
    if overlap and not robot.constant_scale:
        carried["odometry_stamps_ns"], carried["odometry_poses"] = robot.odometry.samples_since(overlap[0].stamp_ns)
    return Continuation(windows.number if windows is not None else 0, next_index, stream.placement, tuple(overlap),
                        tuple(provisional), carried)


class ContinuationSchedule:
    """When the Mapper's continuation goes to the map database (the recorder): while mapping at
    most every map_database_continuation_s (what a resume after a crash aligns to; its bytes:
    README, The map database), at once where the Mapper asks, dropped when the stream ends."""

    def __init__(self, recorder, robot, period_s: float):
        self.recorder, self.robot, self.period_s = recorder, robot, period_s
        self._due = 0.0   # monotonic time of the next one stored while mapping

    def store(self, stream, next_index: int, points=None) -> None:
        """Now; with ``points`` (the provisional keyframes') the stored frames' points too."""
        continuation = continuation_of(stream, next_index, self.robot, with_points=points is not None)
        self.recorder.continuation(continuation, points or ())

    def due(self, stream) -> bool:
        """Whether ``while_mapping`` would store one of ``stream`` now (if its window allows)."""
        return (bool(self.period_s) and time.monotonic() >= self._due and stream.windows is not None
                and self.recorder.active)

    def while_mapping(self, stream, next_index: int) -> None:
        """At most every period, while the window can be continued from (no switch due)."""
        windows, now = stream.windows, time.monotonic()
        if (not self.period_s or now < self._due or windows is None or not self.recorder.active
                or windows.switch_refusal()):
            return
        self._due = now + self.period_s
        self.store(stream, next_index)

    def soon(self) -> None:
        """The stored one may hold a frame that was rolled back: store the next one soon."""
        self._due = 0.0

    def ended(self) -> None:
        """The stream ended: its continuation goes; the next stream stores its own soon."""
        self.recorder.continuation(None)
        self._due = 0.0


def write_continuation(conn, run: int, continuation: Continuation | None, points, insert_points) -> None:
    """Replace ``run``'s stored continuation whole (on the writer thread): its row, its overlap
    frames and the provisional keyframes' ``points`` (``insert_points(xyz_blob, rgb_blob,
    provisional=True)``); None: the stream it was of ended, nothing is stored."""
    for table in ("continuations", "overlap_frames"):
        conn.execute(f"DELETE FROM {table} WHERE run = ?", (run,))
    conn.execute("DELETE FROM map_inserts WHERE run = ? AND provisional = 1", (run,))
    if continuation is None:
        return
    for xyz, rgb in points:
        insert_points(array_blob(xyz), array_blob(rgb), provisional=True)
    c = continuation
    conn.execute("INSERT INTO continuations VALUES (?, ?, ?, ?)", (run, c.window, c.next_index, arrays_blob(
        {"rotation": c.placement.rotation, "translation": c.placement.translation,
         "provisional": np.array(c.provisional, np.int64).reshape(-1, 2), **c.carried})))
    for seq, f in enumerate(c.overlap):
        conn.execute("INSERT INTO overlap_frames VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (
            run, seq, f.index, f.stamp_ns, array_blob(f.rgb), array_blob(f.pose_enc), array_blob(f.depth),
            int(f.is_keyframe)))
