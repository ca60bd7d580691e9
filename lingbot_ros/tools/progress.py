"""Progress of a long tool run (replay, offline) on stderr, drawn by tqdm.

On a terminal: a bar with the position, the rate and the time left, redrawn in place. Anywhere
else (a file, a pipe, a launch log): one plain line every ``period_s`` seconds and one at the
end, with the same numbers, so that a log holds readable lines instead of carriage returns.
The rate is the recent one (tqdm's smoothing; the last ``WINDOW`` updates in plain lines): the
first frames of a run carry one-off work (the scale-frame batch, kernel builds) that an average
over the whole run would spread over its estimate of the time left.
"""
from __future__ import annotations

import collections
import os
import sys
import time

from tqdm import tqdm

PLAIN_PERIOD_S = 5.0
WINDOW = 10
UNSIZED_COLUMNS = 100


class Progress:
    """``update(position)`` with the absolute position (frames done, bag seconds played)."""

    def __init__(self, total: float, desc: str, unit: str, decimals: int = 0, stream=None,
                 period_s: float = PLAIN_PERIOD_S):
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.desc, self.unit, self.period_s = total, desc, unit, period_s
        self._number = f"{{:.{decimals}f}}"
        self.tty = _isatty(self.stream)
        self.postfix = ""
        self._position = 0.0
        self._start = time.monotonic()
        self._last_line = -float("inf")
        self._recent: collections.deque = collections.deque(maxlen=WINDOW + 1)
        self._bar = None
        if self.tty:
            number = f"{{n:.{decimals}f}}/{{total:.{decimals}f}}"
            # A terminal that reports no size (a serial console, a bare pty) would get an empty bar.
            sized = _columns(self.stream) > 0
            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=sized,
                             ncols=None if sized else UNSIZED_COLUMNS,
                             bar_format="{desc}: {percentage:3.0f}%|{bar}| " + number +
                                        " {unit} [{elapsed}<{remaining}, {rate_fmt}]{postfix}")

    def update(self, position: float, postfix: str = "") -> None:
        now = time.monotonic()
        self._position, self.postfix = position, postfix
        self._recent.append((position, now))
        if self._bar is not None:
            self._bar.set_postfix_str(postfix, refresh=False)
            self._bar.update(position - self._bar.n)   # tqdm limits the redraws itself
        elif now - self._last_line >= self.period_s:
            self._last_line = now
            self._print_line(now)

    def close(self) -> None:
        """The final position: the bar's last draw, or a last plain line."""
        if self._bar is not None:
            self._bar.close()
        else:
            self._print_line(time.monotonic())

    def line(self, now: float | None = None) -> str:
        """The plain line for the current position."""
        now = time.monotonic() if now is None else now
        (p0, t0), (p1, t1) = self._recent[0], self._recent[-1]
        rate = (p1 - p0) / (t1 - t0) if t1 > t0 else None
        number = self._number
        return tqdm.format_meter(
            self._position, self.total, now - self._start, prefix=self.desc, unit=self.unit, rate=rate,
            postfix=self.postfix or None,
            bar_format=f"{{desc}}: {number.format(self._position)}/{number.format(self.total)} {{unit}} "
                       "({percentage:.0f}%), {rate_fmt}, elapsed {elapsed}, ETA {remaining}{postfix}")

    def _print_line(self, now: float) -> None:
        if not self._recent:
            self._recent.append((self._position, now))
        print(self.line(now), file=self.stream, flush=True)


def _columns(stream) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 0


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
