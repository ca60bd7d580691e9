"""Windowed inference (spec 13.1, fixed-interval keyframes): which frames each window runs, which
window each output frame comes from, and the offline run (all windows with one session, each
aligned to the previous one's warped outputs, stitched).

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

from collections import deque
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import torch

from ..stream.results import FrameResult
from ..stream.session import StreamingSession
from ..stream.settings import StreamSettings
from .similarity import ESTIMATORS, Similarity, align_window, warp_frame

# frame_type (spec 13.1): where a frame sits in its window.
PHASE1, KEYFRAME, NON_KEYFRAME = 0, 1, 2


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
        if lay.overlap >= lay.window_frames:
            raise WindowError(
                f"overlap of {lay.overlap} frames is not shorter than the window of {lay.window_frames} "
                f"frames (window_size {self.window_size} keyframes at interval "
                f"{max(self.keyframe_interval, 1)}): lower the overlap or raise window_size")


def stitch_plan(windows: list[tuple[int, int]], overlap: int) -> list[tuple[int, int, int]]:
    """(frame, window, index in the window) of every output frame, in order: each window but the
    last gives its first len - overlap frames (its tail only aligns the next one), the last all.
    For 0 <= overlap < L that is every frame once, frame f from window min(f // step, n - 1)."""
    plan = []
    for k, (start, end) in enumerate(windows):
        count = end - start if k == len(windows) - 1 else max(end - start - overlap, 0)
        plan += [(start + j, k, j) for j in range(count)]
    return plan


def frame_type(index: int, num_scale_frames: int, is_keyframe: bool) -> int:
    """PHASE1, KEYFRAME or NON_KEYFRAME for frame ``index`` of a window (phase 1 = first
    ``num_scale_frames`` frames, or all of a shorter window)."""
    if index < num_scale_frames:
        return PHASE1
    return KEYFRAME if is_keyframe else NON_KEYFRAME


@dataclass
class WindowedFrame:
    """One stitched output frame."""

    frame: int            # input frame index
    window: int           # window it comes from
    frame_type: int       # PHASE1 / KEYFRAME / NON_KEYFRAME within that window
    result: FrameResult   # in window 0's frame (``index`` counts within the window)


class WindowedRun:
    """The original's offline windowed mode (spec 13.1) over ``num_frames`` frames, one session.

    ``frames(inputs)`` runs window after window (session.reset() before each), aligns each to the
    previous one's warped outputs, warps it and yields its stitched frames as soon as they are
    final, holding at most one window's inputs and outputs. A single window (L >= S) comes back
    untouched (raw quaternions); otherwise every frame is warped, window 0 by the identity.
    ``similarities`` grows by one per window run (cleared when ``frames`` starts again).
    """

    def __init__(self, session: StreamingSession, rule: WindowRule, num_frames: int, estimator: str = "anchor"):
        settings = session.settings
        if (settings.num_scale_frames, max(settings.keyframe_interval, 1)) != \
                (rule.num_scale_frames, max(rule.keyframe_interval, 1)):
            raise WindowError(
                f"the session runs num_scale_frames={settings.num_scale_frames}, keyframe_interval="
                f"{settings.keyframe_interval} but the window rule assumes {rule.num_scale_frames}, "
                f"{rule.keyframe_interval}; build the rule with WindowRule.from_settings")
        if estimator not in ESTIMATORS:
            raise WindowError(f"unknown alignment estimator {estimator!r}; use one of {ESTIMATORS}")
        self.session, self.rule, self.num_frames, self.estimator = session, rule, num_frames, estimator
        self.layout = rule.layout(num_frames)
        self.windows = rule.windows(num_frames)
        self.similarities: list[Similarity] = []

    @property
    def aligned(self) -> bool:
        """Whether outputs are warped (more than one window's worth of frames)."""
        return self.layout.frames_per_window < self.num_frames

    def frames(self, inputs: Iterable[torch.Tensor]) -> Iterator[WindowedFrame]:
        """inputs: the ``num_frames`` preprocessed images [3, H, W] in order (a [S, 3, H, W] tensor
        works). Yields the stitched frames in order (``num_frames`` of them unless ov >= L)."""
        ov = self.layout.overlap
        self.similarities = []
        contributed = {}                                   # window -> output frames it gives
        for _, k, _ in stitch_plan(self.windows, ov):
            contributed[k] = contributed.get(k, 0) + 1
        source = iter(inputs)
        buffered: deque[tuple[int, torch.Tensor]] = deque()  # inputs the next windows still need
        next_frame = 0
        prev_tail: list[FrameResult] = []
        for k, (start, end) in enumerate(self.windows):
            while buffered and buffered[0][0] < start:
                buffered.popleft()
            for f in range(next_frame, end):
                image = next(source, None)
                if image is None:
                    raise WindowError(f"the inputs ended after {f} frames; the run was set up for "
                                      f"{self.num_frames}")
                if f >= start:                       # frames before the first window are never run
                    buffered.append((f, image))
            next_frame = max(next_frame, end)
            results = self._run_window([image for _, image in buffered])
            assert len(results) == end - start, f"window {k}: {len(results)} results for {end - start} frames"
            if self.aligned:
                sim = Similarity.identity(results[0].pose_enc.device) if k == 0 else \
                    align_window(prev_tail, results, ov, self.estimator)
                results = [warp_frame(r, sim) for r in results]
            else:
                sim = Similarity.identity(results[0].pose_enc.device)
            self.similarities.append(sim)
            n_w = min(self.layout.scale_frames, end - start)
            for j in range(contributed.get(k, 0)):
                r = results[j]
                yield WindowedFrame(start + j, k, frame_type(j, n_w, r.is_keyframe), r)
            prev_tail = results[-ov:] if ov > 0 else []
        if next(source, None) is not None:
            raise WindowError(f"more than the {self.num_frames} input frames the run was set up for")

    def chunk_scales(self) -> torch.Tensor:
        """[n_win] float32 s per window run so far (window 0: 1), on the CPU."""
        return torch.stack([s.scale.cpu() for s in self.similarities])

    def chunk_transforms(self) -> torch.Tensor:
        """[n_win, 4, 4] float32 ``[R t; 0 1]`` per window run so far (no scale), on the CPU."""
        return torch.stack([s.rigid_matrix().cpu() for s in self.similarities])

    def _run_window(self, images: list[torch.Tensor]) -> list[FrameResult]:
        self.session.reset()
        results = []
        for image in images:
            results += self.session.step(image)
        return results + self.session.close_scale_phase()     # a window shorter than phase 1
