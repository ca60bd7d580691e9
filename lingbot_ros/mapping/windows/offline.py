"""The original's offline windowed run (spec 13.1): all windows with one session, each aligned to
the previous one's warped outputs, stitched; the window list is rule.py's.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

from ...stream.results import FrameResult
from ...stream.session import StreamingSession
from .rule import WindowError, WindowRule
from .similarity import ESTIMATORS, Similarity, align_window, warp_frames

# frame_type (spec 13.1): where a frame sits in its window.
PHASE1, KEYFRAME, NON_KEYFRAME = 0, 1, 2

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
                results = warp_frames(results, sim)
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
