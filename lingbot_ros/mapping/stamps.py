"""Stamp policy: what an image stamp that does not follow the previous one means.

    stamp >  previous, gap <= max_gap_s      accept
    stamp >  previous, gap >  max_gap_s      hold: the next frame decides
    stamp == previous                        drop the frame (a duplicate: two frames of one instant
                                             would be two poses at one stamp in the trajectory)
    previous - jitter_s <= stamp < previous  drop the frame (sensor or transport jitter)
    stamp <  previous - jitter_s             restart (a looped bag, a clock jump)

A dropped frame leaves the policy unchanged, so one late frame cannot drag the reference back.
A duplicate of the held frame is dropped and the held one stays held.

A forward jump is held, not taken: one frame stamped an hour ahead (a clock glitch in a driver)
would otherwise cost two restarts, the jump and the jump back, and clear the map twice. The next
frame decides. If it continues from the held one (stamp >= held, the gap between them within
max_gap_s), the jump was real: the stream restarts at the held frame and both are taken, in
order. Otherwise the held frame was an outlier: it is refused, and the next frame is judged
against the previous reference as if the outlier had never come (no restart). A frame held when
the input ends or the stream is reset is refused too (``unconfirmed``): nothing confirmed it,
and taking it would clear the map built so far for one frame. At most one frame is held.

A gap is one in the input: between frames received, not between frames processed (a slow step
makes a newest-frame-wins front end skip frames, and the processed stamps then jump). A front end
that skips frames stamps each with its ``ReceivedGaps`` gap (``InputFrame.gap_ns``, the largest
over the frames it skipped), and the forward rule uses that, but never more than the stamps'
difference (an outlier among the skipped frames made a large received gap that the stamps the
policy sees do not have); without one, the stamps' difference.

Stamps are integer nanoseconds from the message to the trajectory (io.Frame, InputFrame,
Trajectory, the map database): exact, so equal stamps compare equal. Seconds only where a file or
a person reads them: ``ns_from_seconds`` (a setting), ``seconds_text`` and ``ns_from_text`` (files).
"""
from __future__ import annotations

import dataclasses
import decimal
import threading

NS_PER_S = 1_000_000_000

# What to do with a frame. REFUSE: a held frame that the next one did not follow (an outlier).
ACCEPT, DROP, RESTART, REFUSE = "accept", "drop", "restart", "refuse"


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


_DUPLICATE = "stamp equal to the previous frame's (a duplicate): dropped"


@dataclasses.dataclass(frozen=True)
class StampVerdict:
    action: str        # ACCEPT, DROP, RESTART or REFUSE
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class _Held:
    stamp_ns: int
    jump_ns: int       # how far ahead of the reference it came
    item: object       # the caller's frame


class StampPolicy:
    """The rule above for one stream (a restart replaces it with the stream). ``decide`` says
    what to do with each frame; the caller reports a frame it took with ``accept``."""

    def __init__(self, max_gap_s: float, max_jitter_s: float):
        self.set_limits(max_gap_s, max_jitter_s)
        self.last_ns: int | None = None    # the newest frame taken
        self._held: _Held | None = None

    def set_limits(self, max_gap_s: float, max_jitter_s: float) -> None:
        self.max_gap_ns = ns_from_seconds(max_gap_s)
        self.max_jitter_ns = ns_from_seconds(max_jitter_s)

    @property
    def held(self) -> int:
        """Frames held past a forward jump, waiting for the next one (0 or 1)."""
        return int(self._held is not None)

    def decide(self, stamp_ns: int, gap_ns: int | None, item) -> list[tuple[StampVerdict, object]]:
        """What to do, in order, with the held item and ``item`` (``gap_ns``: the input's own
        forward gap before it, None: from the stamps). ACCEPT: take it; RESTART: restart the
        stream, then take it; DROP, REFUSE: do not take it (the reason says why). An item held
        is in no step: the next call decides it."""
        held, self._held = self._held, None
        if held is None:
            return self._decide(stamp_ns, gap_ns, item)
        if stamp_ns == held.stamp_ns:
            self._held = held
            return [(StampVerdict(DROP, _DUPLICATE), item)]
        if stamp_ns > held.stamp_ns and not self._too_far(self._gap(stamp_ns, held.stamp_ns, gap_ns)):
            return [(StampVerdict(RESTART, self._gap_text(held.jump_ns)), held.item), (StampVerdict(ACCEPT), item)]
        outlier = (self._outlier(held, "the next frame did not follow"), held.item)
        return [outlier] + self._decide(stamp_ns, gap_ns, item)

    def unconfirmed(self) -> tuple[StampVerdict, object] | None:
        """The held item, refused (the input ended or the stream is reset before a frame
        followed it), or None."""
        held, self._held = self._held, None
        return None if held is None else (self._outlier(held, "no frame followed"), held.item)

    def accept(self, stamp_ns: int) -> None:
        self.last_ns = stamp_ns

    def _decide(self, stamp_ns: int, gap_ns: int | None, item) -> list[tuple[StampVerdict, object]]:
        last = self.last_ns
        if last is None:
            return [(StampVerdict(ACCEPT), item)]
        if stamp_ns == last:
            return [(StampVerdict(DROP, _DUPLICATE), item)]
        if stamp_ns < last:
            back_s = (last - stamp_ns) / NS_PER_S
            if last - stamp_ns <= self.max_jitter_ns:
                return [(StampVerdict(DROP, f"stamp {back_s:.3f} s before the previous frame's (within "
                                            f"max_stamp_jitter_s={self.max_jitter_ns / NS_PER_S:g}): dropped"), item)]
            return [(StampVerdict(RESTART, f"image stamp went back by {back_s:.3f} s (bag looped?)"), item)]
        gap = self._gap(stamp_ns, last, gap_ns)
        if self._too_far(gap):
            self._held = _Held(stamp_ns, gap, item)
            return []
        return [(StampVerdict(ACCEPT), item)]

    @staticmethod
    def _gap(stamp_ns: int, reference_ns: int, gap_ns: int | None) -> int:
        return stamp_ns - reference_ns if gap_ns is None else min(gap_ns, stamp_ns - reference_ns)

    def _too_far(self, gap_ns: int) -> bool:
        return self.max_gap_ns > 0 and gap_ns > self.max_gap_ns

    def _gap_text(self, gap_ns: int) -> str:
        return f"gap of {gap_ns / NS_PER_S:.3f} s between image stamps (max_stamp_gap_s={self.max_gap_ns / NS_PER_S:g})"

    def _outlier(self, held: _Held, why: str) -> StampVerdict:
        return StampVerdict(REFUSE, f"image stamp jumped {held.jump_ns / NS_PER_S:.3f} s ahead (max_stamp_gap_s="
                                    f"{self.max_gap_ns / NS_PER_S:g}) and {why}: refused as an outlier")


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
