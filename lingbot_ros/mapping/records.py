"""The Mapper's inputs and outputs: frames in, placed per-frame results, notices and snapshots out."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..stream import FrameResult
from .placement.conversion import MapConversion, Placement
from .store.points import image_to_rgb_uint8, select_points

# MapStatus.STATE_* values (msg/MapStatus.msg); the mapping layer owns their meaning.
WAITING, INITIALISING, TRACKING, RESTARTED = 0, 1, 2, 3
STATE_NAMES = {WAITING: "waiting", INITIALISING: "initialising", TRACKING: "tracking", RESTARTED: "restarted"}


@dataclasses.dataclass(frozen=True)
class InputFrame:
    """One decoded camera image, stamped in integer nanoseconds (a front end converts its own
    stamp type once, on the way in)."""

    rgb: np.ndarray            # [H, W, 3] uint8 RGB
    stamp_ns: int
    frame_id: str = ""
    received_ns: int = 0       # time.monotonic_ns() when the front end got it
    gap_ns: int | None = None  # the input's forward stamp gap before it (stamps.ReceivedGaps)

    def after_dropped(self, older: "InputFrame") -> "InputFrame":
        """This frame in place of ``older``, which was skipped: the gap before it spans both."""
        if self.gap_ns is None or older.gap_ns is None:
            return dataclasses.replace(self, gap_ns=None)   # unknown: the stamps' difference decides
        return dataclasses.replace(self, gap_ns=max(self.gap_ns, older.gap_ns))


@dataclasses.dataclass
class MapperOutput:
    """One frame's result, placed in ``map``.

    ``provisional``: the value may still change (a windowed run's overlap frames get their final
    value from the next window); the Mapper reports the final value again when it is known.
    """

    frame: InputFrame
    index: int                 # frames processed since configure (one number per input frame)
    camera_pose: np.ndarray    # [4, 4] T_map_camera (camera optical frame), metres once scaled
    base_pose: np.ndarray      # [4, 4] T_map_base (the robot's base_frame)
    internal_pose: np.ndarray  # [4, 4] the camera in the Mapper's internal frame (placement/conversion.py)
    trusted: bool              # False for the phase-1 batch and the first pose after a restart
    is_keyframe: bool
    provisional: bool
    placement: Placement       # internal-frame pose of the model world this result came from
    result: FrameResult        # model outputs in that world (tensors on the model's device)
    conversion: MapConversion | None = None   # internal -> map as it was when made (None: identity)

    @property
    def stamp_ns(self) -> int:
        return self.frame.stamp_ns

    @property
    def depth(self) -> torch.Tensor:
        """[H, W] depth along the optical axis in map units (metres once the scale is known)."""
        scale = self.conversion.scale if self.conversion is not None else 1.0
        return self.result.depth * scale if scale != 1.0 else self.result.depth

    def internal_points(self, min_confidence: float, stride: int) -> tuple[np.ndarray, np.ndarray]:
        """Confidence-filtered, strided coloured points of this frame in the internal frame:
        (xyz float32 [N, 3], rgb uint8 [N, 3]). The selection runs where the tensors are; only
        the kept points reach the host."""
        colours = image_to_rgb_uint8(self.result.image)
        xyz, rgb = select_points(self.result.world_points, colours, self.result.depth_conf,
                                 min_confidence, stride)
        return self.placement.points(xyz), rgb

    def points(self, min_confidence: float, stride: int) -> tuple[np.ndarray, np.ndarray]:
        """The same points in ``map``."""
        xyz, rgb = self.internal_points(min_confidence, stride)
        return (self.conversion.points(xyz) if self.conversion is not None else xyz), rgb


@dataclasses.dataclass(frozen=True)
class Notice:
    """Something a front end should tell its user (the Mapper itself never logs to a user)."""

    kind: str                  # RESTART, REJECTED, FAILED, BOUND, WARMUP, FALLBACK
    text: str


RESTART, REJECTED, FAILED, BOUND, WARMUP = "restart", "rejected", "failed", "bound", "warm-up"
FALLBACK = "fallback"   # a faster way of doing something gave up; the plain way does it (same outputs)


@dataclasses.dataclass
class StepOutcome:
    """What one Mapper verb produced.

    ``new``: outputs of frames seen for the first time (publish them); ``final``: outputs whose
    value is now final (a file writer writes these, each frame exactly once over a run; for a
    non-windowed run they are the same objects as ``new``); ``revised``: provisional outputs
    given a new, still provisional value (a frame in the overlap of two windows after its own).
    """

    new: list[MapperOutput] = dataclasses.field(default_factory=list)
    final: list[MapperOutput] = dataclasses.field(default_factory=list)
    revised: list[MapperOutput] = dataclasses.field(default_factory=list)   # provisional, new value
    notices: list[Notice] = dataclasses.field(default_factory=list)
    taken: InputFrame | None = None   # the newest frame the stamp rule let into the stream (the image clock's)


@dataclasses.dataclass(frozen=True)
class MapperSnapshot:
    """The Mapper's state after its last verb, for status and diagnostics (immutable: another
    thread can read it while the next frame runs)."""

    state: int = WAITING
    state_text: str = "waiting for images"
    init_frames: int = 0       # new frames buffered for phase 1 (not yet processed)
    init_frames_needed: int = 0
    held_frames: int = 0       # held past a forward stamp jump until the next frame decides (stamps.py)
    processed: int = 0         # frames placed (a phase-1 frame counts once its pose is out)
    rejected: int = 0
    failed: int = 0            # frames lost to a model failure (the failing one and those buffered)
    restarts: int = 0          # streams ended and begun again (mapper.py: restart), resets included
    rolled_back: int = 0       # placed frames undone by rollback_last_frame
    cleared: int = 0           # placed frames whose poses a map-clearing restart dropped
    keyframes: int = 0         # frames stored in the attention cache now
    cache_pages: int = 0
    cache_bytes: int = 0
    model_ms: float = 0.0
    map_points: int = 0
    trajectory_poses: int = 0
    last_error: str = ""
    window: int = 0                   # windowed policy: the current window's number in its stream
    window_scale: float = 1.0         # its alignment's scale to the previous window
    window_overlap_error: float = float("nan")   # mean centre distance over the overlap / motion
    scale_known: bool = False         # metric scale: metres per model unit known
    scale: float = 1.0
    scale_spread: float = float("inf")   # its relative standard error
    scale_text: str = ""              # why it is not known yet, or how it was found
    camera_mount: str = ""            # where the camera mount came from
    map_database: str = ""            # what the map database is doing ("off", "writing run N to PATH", ...)
    map_database_error: str = ""      # why this run is not (or no longer) stored; '' while it is
    last_stamp_ns: int | None = None

    def with_database(self, text: str, error: str) -> "MapperSnapshot":
        """This snapshot with the map database's text and error as they are now: the writer's
        thread opens the file (and may refuse it) after the last verb's snapshot, and a refusal
        was missing from ~/status and /diagnostics until the next frame came."""
        if (text, error) == (self.map_database, self.map_database_error):
            return self
        return dataclasses.replace(self, map_database=text, map_database_error=error)


@dataclasses.dataclass(frozen=True)
class SavedMap:
    """What ``Mapper.save`` wrote."""

    ply_path: str
    tum_path: str
    num_points: int
    num_poses: int

    @property
    def message(self) -> str:
        return (f"wrote {self.num_points} points to {self.ply_path} and {self.num_poses} poses to "
                f"{self.tum_path} (a top-down picture beside them: preview.png)")
