"""Windowed inference (spec 13.1, fixed-interval keyframes): which frames each window runs, which
window's output of a frame is final. The live policy (live.py) and the offline run (offline.py)
both follow it.

Windows are independent streaming passes from a fresh session over overlapping frame ranges;
each one's first ``ov`` frames are the previous one's last ``ov``, run again::

    frames     0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 ...     L = 10, ov = 4, step = 6
    window 0   [0 ............. 9]
    window 1               [6 ................ 15]              6..9 pair window 1 with window 0
    window 2                           [12 ...  ...
    output     0 0 0 0 0 0 1 1 1 1 1  1  2  2  ...              frame f from window f // step

Only the last window's truncation and the clamp ov <= S - 1 depend on the sequence length S, so a
live caller (S unknown) gets the same list by starting window k when the first frame past window
k - 1 arrives (``WindowRule.switch_frame``); see ``WindowRule.check_live``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...stream.settings import StreamSettings


class WindowError(ValueError):
    """Window settings that make no sense, or a run whose frames do not match them."""


@dataclass(frozen=True)
class WindowLayout:
    """The spec's derived sizes for one sequence length (or for an unbounded live stream)."""

    scale_frames: int        # ws = min(n, S): phase-1 frames of a full window
    overlap: int             # ov: frames each window shares with the previous one
    window_frames: int       # L: frames per window (Wk keyframes at interval K)
    frames_per_window: int   # Lw = min(L, S)
    step: int                # max(Lw - ov, 1): distance between window starts

    @property
    def live_overlap_fits(self) -> bool:
        """One frame at a time reproduces the window list only with 0 <= ov < L (check_live)."""
        return self.overlap < self.window_frames


@dataclass(frozen=True)
class WindowRule:
    """Window-list settings (spec 13.1): ``window_size`` keyframes per window (phase-1 frames
    included), the stream's ``num_scale_frames`` and ``keyframe_interval``, and the overlap:
    ``overlap_keyframes`` (takes precedence; at least the phase-1 frames) or ``overlap_size``
    (frames, not raised to the phase-1 count) or, with neither, the phase-1 frames."""

    window_size: int
    num_scale_frames: int
    keyframe_interval: int = 1
    overlap_size: Optional[int] = None
    overlap_keyframes: Optional[int] = None

    def __post_init__(self):
        for key, low in (("window_size", 1), ("num_scale_frames", 1), ("keyframe_interval", 0)):
            value = getattr(self, key)
            if not isinstance(value, int) or value < low:
                raise WindowError(f"{key} must be an int >= {low}, got {value!r}")
        for key in ("overlap_size", "overlap_keyframes"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise WindowError(f"{key} must be None or an int >= 0, got {value!r}")

    @classmethod
    def from_settings(cls, settings: StreamSettings, window_size: int, overlap_size: Optional[int] = None,
                      overlap_keyframes: Optional[int] = None) -> WindowRule:
        """The rule for windows run with these stream settings (phase-1 count, keyframe interval)."""
        return cls(window_size, settings.num_scale_frames, settings.keyframe_interval,
                   overlap_size, overlap_keyframes)

    def layout(self, num_frames: Optional[int] = None) -> WindowLayout:
        """Sizes for a sequence of ``num_frames`` frames; None: a live stream of unknown length."""
        S = num_frames
        if S is not None and (not isinstance(S, int) or S < 1):
            raise WindowError(f"num_frames must be an int >= 1 or None, got {S!r}")
        K = max(self.keyframe_interval, 1)
        ws = self.num_scale_frames if S is None else min(self.num_scale_frames, S)
        if self.overlap_keyframes is not None:
            ov = max(ws, self.overlap_keyframes * K)
        elif self.overlap_size is not None:
            ov = self.overlap_size
        else:
            ov = ws
        if S is not None:
            ov = min(ov, S - 1) if S > 1 else 0
        L = ws + max(self.window_size - ws, 0) * K
        Lw = L if S is None else min(L, S)
        return WindowLayout(ws, ov, L, Lw, max(Lw - ov, 1))

    def windows(self, num_frames: int) -> list[tuple[int, int]]:
        """The (start, end) frame ranges run for a sequence of ``num_frames`` frames, in order."""
        lay = self.layout(num_frames)
        S, Lw, ov = num_frames, lay.frames_per_window, lay.overlap
        if Lw >= S:
            return [(0, S)]
        out = []
        for start in range(0, S, lay.step):
            end = min(start + Lw, S)
            # A truncated window shorter than the overlap is dropped unless it reaches the end.
            if end - start >= ov or end == S:
                out.append((start, end))
            if end == S:
                break
        return out

    # ---- live: the same list one frame at a time, without knowing S ---------------------------

    @property
    def window_frames(self) -> int:
        """L: frames per window of a live stream (the stream's end may cut the last one short)."""
        return self.layout().window_frames

    @property
    def overlap(self) -> int:
        """ov before the clamp to S - 1: frames re-run at the start of every window after the first."""
        return self.layout().overlap

    @property
    def step(self) -> int:
        """Frames between window starts: window k runs frames k*step .. k*step + L - 1."""
        return self.layout().step

    def window_start(self, k: int) -> int:
        """First frame of window k."""
        return k * self.step

    def switch_frame(self, k: int) -> int:
        """For k >= 1, the frame whose arrival starts window k (the first frame past window k-1).
        Window k first re-runs frames window_start(k) .. switch_frame(k) - 1 (``overlap`` of
        them, buffered), then takes this one."""
        if k < 1:
            raise WindowError(f"window 0 starts with the stream; switch_frame needs k >= 1, got {k}")
        return self.window_start(k - 1) + self.window_frames

    def final_window(self, frame: int, num_windows: Optional[int] = None) -> int:
        """The window whose outputs of ``frame`` are final (those of an earlier window that ran it
        are provisional): frame // step, capped at the last window when their count is known."""
        k = frame // self.step
        return k if num_windows is None else min(k, num_windows - 1)

    def check_live(self) -> None:
        """Raise WindowError unless one frame at a time reproduces the list: 0 <= ov < L. (With
        ov >= L the original keeps only the windows that end the sequence, which needs S.)"""
        lay = self.layout()
        if not lay.live_overlap_fits:
            raise WindowError(
                f"overlap of {lay.overlap} frames is not shorter than the window of {lay.window_frames} "
                f"frames (window_size {self.window_size} keyframes at interval "
                f"{max(self.keyframe_interval, 1)}): lower the overlap or raise window_size")
