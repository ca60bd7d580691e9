"""Stamp policy: what an image stamp that does not follow the previous one means.

    stamp >= previous, gap <= max_gap_s      accept
    stamp >= previous, gap >  max_gap_s      restart (the scene may have changed completely)
    previous - jitter_s <= stamp < previous  drop the frame (sensor or transport jitter)
    stamp <  previous - jitter_s             restart (a looped bag, a clock jump)

A dropped frame leaves the policy unchanged, so one late frame cannot drag the reference back.

A gap is one in the input: between frames received, not between frames processed (a slow step
makes a newest-frame-wins front end skip frames, and the processed stamps then jump). A front end
that skips frames stamps each with its ``ReceivedGaps`` gap (``InputFrame.gap_ns``, the largest
over the frames it skipped), and the forward rule uses that; without one, the stamps' difference.
"""
from __future__ import annotations

import dataclasses
import threading

ACCEPT, DROP, RESTART = "accept", "drop", "restart"


@dataclasses.dataclass(frozen=True)
class StampVerdict:
    action: str        # ACCEPT, DROP or RESTART
    reason: str = ""


class StampPolicy:
    def __init__(self, max_gap_s: float, max_jitter_s: float):
        self.set_limits(max_gap_s, max_jitter_s)
        self.last_ns: int | None = None

    def set_limits(self, max_gap_s: float, max_jitter_s: float) -> None:
        self.max_gap_ns = int(max_gap_s * 1e9)
        self.max_jitter_ns = int(max_jitter_s * 1e9)

    def check(self, stamp_ns: int, gap_ns: int | None = None) -> StampVerdict:
        """``gap_ns``: the input's own forward gap before this frame (None: from the stamps)."""
        last = self.last_ns
        if last is None:
            return StampVerdict(ACCEPT)
        if stamp_ns < last:
            back_s = (last - stamp_ns) / 1e9
            if last - stamp_ns <= self.max_jitter_ns:
                return StampVerdict(DROP, f"stamp {back_s:.3f} s before the previous frame's "
                                          f"(within max_stamp_jitter_s={self.max_jitter_ns / 1e9:g}): dropped")
            return StampVerdict(RESTART, f"image stamp went back by {back_s:.3f} s (bag looped?)")
        gap = stamp_ns - last if gap_ns is None else gap_ns
        if self.max_gap_ns > 0 and gap > self.max_gap_ns:
            return StampVerdict(RESTART, f"gap of {gap / 1e9:.3f} s between image stamps "
                                         f"(max_stamp_gap_s={self.max_gap_ns / 1e9:g})")
        return StampVerdict(ACCEPT)

    def accept(self, stamp_ns: int) -> None:
        self.last_ns = stamp_ns

    def reset(self) -> None:
        self.last_ns = None


class ReceivedGaps:
    """A front end's received frames: each one's forward stamp gap from the frame received just
    before it (None for the first: the Mapper then compares with its previous frame). Any thread."""

    def __init__(self):
        self._last_ns: int | None = None
        self._lock = threading.Lock()

    def gap_ns(self, stamp_ns: int) -> int | None:
        with self._lock:
            last, self._last_ns = self._last_ns, stamp_ns
        return None if last is None else max(stamp_ns - last, 0)
