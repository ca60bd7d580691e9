"""Everything that belongs to one stream, in one object that a restart replaces whole.

A *stream* runs from a restart (configure, ``reset``, a stamp jump, a size change, a failure, a
cache cap) to the next one; a *session run* from a session reset to the next: a stream without
windows is one run, the windowed policy starts a new run at every window switch.
"""
from __future__ import annotations

import collections
import dataclasses

from .placement.conversion import Placement
from .keyframes import MotionPolicy
from .windows.live import LiveWindows, Pending
from .placement.robot import StreamFrames
from .stamps import StampPolicy


@dataclasses.dataclass
class SessionRun:
    """One session run: what the session holds and what rollback may undo in it."""

    awaiting: collections.deque[Pending]     # given to the session, result not back (phase 1)
    # Indices of the frames given to the session, newest last, and of those among them stored
    # in the cache after phase 1 (kept keyframes): only the newest frame can be rolled back, and
    # only while it is stored, so the newest few are enough.
    given: collections.deque[int]
    stored: collections.deque[int]
    motion: MotionPolicy | None
    has_results: bool = False                # phase 1 is over

    @classmethod
    def new(cls, rollback_depth: int, keyframe_interval: int, motion: MotionPolicy | None) -> "SessionRun":
        return cls(collections.deque(), collections.deque(maxlen=rollback_depth * keyframe_interval + 1),
                   collections.deque(maxlen=rollback_depth), motion)

    def buffered_new(self) -> int:
        """Frames buffered for phase 1 that were never placed (not the ones a window re-runs)."""
        return sum(not p.rerun for p in self.awaiting)


@dataclasses.dataclass
class StreamState:
    placement: Placement                     # the stream's model world in the internal frame
    frames: StreamFrames                     # its metric scale and conversion into map
    stamps: StampPolicy
    windows: LiveWindows | None              # the windowed policy's bookkeeping, provisional outputs
    run: SessionRun
    untrusted_next: bool = True              # the stream's first placed pose is not to be fused
    input_wh: tuple[int, int] | None = None
