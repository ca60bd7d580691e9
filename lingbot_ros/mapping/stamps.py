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

Stamps are integer nanoseconds from the message to the trajectory (io.Frame, InputFrame,
Trajectory, the map database): exact, so equal stamps compare equal. Seconds only where a file or
a person reads them: ``ns_from_seconds`` (a setting), ``seconds_text`` and ``ns_from_text`` (files).
"""
from __future__ import annotations

import dataclasses
import decimal
import threading

NS_PER_S = 1_000_000_000

ACCEPT, DROP, RESTART = "accept", "drop", "restart"


def ns_from_seconds(seconds: float) -> int:
    """A duration in seconds (a setting) -> integer nanoseconds, rounded (0.3 s is 300000000 ns)."""
    return round(seconds * NS_PER_S)


def seconds_text(stamp_ns: int, digits: int = 9) -> str:
    """The exact decimal seconds of an integer-nanosecond stamp, rounded half up to ``digits``
    (1 to 9) digits after the point (no float in between: 1700000000.1 s is never 1700000000.099999905)."""
    unit = 10 ** (9 - digits)
    whole, fraction = divmod((abs(stamp_ns) + unit // 2) // unit, 10 ** digits)
    return f"{'-' if stamp_ns < 0 else ''}{whole}.{fraction:0{digits}d}"


def ns_from_text(text: str) -> int:
    """Decimal seconds as a file writes them -> integer nanoseconds (exact up to 9 digits)."""
    try:
        seconds = decimal.Decimal(text)
    except decimal.InvalidOperation:
        raise ValueError(f"not a number of seconds: {text!r}") from None
    if not seconds.is_finite():
        raise ValueError(f"not a finite number of seconds: {text!r}")
    return round(seconds * NS_PER_S)


@dataclasses.dataclass(frozen=True)
class StampVerdict:
    action: str        # ACCEPT, DROP or RESTART
    reason: str = ""


class StampPolicy:
    def __init__(self, max_gap_s: float, max_jitter_s: float):
        self.set_limits(max_gap_s, max_jitter_s)
        self.last_ns: int | None = None

    def set_limits(self, max_gap_s: float, max_jitter_s: float) -> None:
        self.max_gap_ns = ns_from_seconds(max_gap_s)
        self.max_jitter_ns = ns_from_seconds(max_jitter_s)

    def check(self, stamp_ns: int, gap_ns: int | None = None) -> StampVerdict:
        """``gap_ns``: the input's own forward gap before this frame (None: from the stamps)."""
        last = self.last_ns
        if last is None:
            return StampVerdict(ACCEPT)
        if stamp_ns < last:
            back_s = (last - stamp_ns) / NS_PER_S
            if last - stamp_ns <= self.max_jitter_ns:
                return StampVerdict(DROP, f"stamp {back_s:.3f} s before the previous frame's "
                                          f"(within max_stamp_jitter_s={self.max_jitter_ns / NS_PER_S:g}): dropped")
            return StampVerdict(RESTART, f"image stamp went back by {back_s:.3f} s (bag looped?)")
        gap = stamp_ns - last if gap_ns is None else gap_ns
        if self.max_gap_ns > 0 and gap > self.max_gap_ns:
            return StampVerdict(RESTART, f"gap of {gap / NS_PER_S:.3f} s between image stamps "
                                         f"(max_stamp_gap_s={self.max_gap_ns / NS_PER_S:g})")
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
