"""Window switches prepared ahead (``window_switch_ahead``): the next window's first frames run in
a spare session while the current window still runs, one with each frame as it comes.

A switch runs the full window's last ``ov`` frames again from a reset session (live.py): phase 1
on the first ``num_scale_frames`` of them at once, then the rest one by one, all on the frame that
starts the next window (336 ms median on the H200 with the live default window, against a 35 ms
frame: bench/README.md). Those frames are known as they arrive, so the spare session takes each
one right after the live session's step and its pose. The work is phase 1 once the overlap's
first ``num_scale_frames`` are in (cut into slices of PHASE1_LAYERS_PER_SLICE layer pairs, then
the camera head, then the depth head a frame at a time: ``StreamingSession.scale_phase_layers``),
then a single-frame step for each later overlap frame. It is spread by cost over the frames from there to the overlap's last, so that
the switch frame, which places the overlap's results, carries none of it. At the switch the live
session, reset, takes the spare's stream over (``StreamingSession.take_over`` copies the
overlap's pages) and the held results are placed as the switch's own runs would have placed
them. The outputs are the same: phase 1 in slices equals phase 1 at once, neither the spare nor
the switch's runs evict a frame (``ahead_refusal``), and the spare's attention is split as the
live cache's (``CacheSpec.split_window_pages``).

The spare's cache holds the overlap only (``spare_session``). Anything that changes the frames it
took (a rollback of one of them, a new_window request, a restart, a failure of its step) discards
its work: the switch then runs the frames itself, as without the setting.
"""
from __future__ import annotations

import dataclasses
import logging
import math

import torch

from ...cache import CacheError, PagedKVCache
from ...stream import FrameResult, StreamingSession
from ...stream.frame_compute import DEPTH_HEAD_FRAMES
from ..records import FALLBACK, Notice
from ..warmup_size import run_warmup
from .live import Pending

log = logging.getLogger(__name__)

# Layer pairs of phase 1 in one slice (the released model's 24 in 12 slices, then the heads): a
# piece of work small enough to even out the frames that carry it.
PHASE1_LAYERS_PER_SLICE = 2

# What the pieces cost, in ms on the H100 with the released model at 518x378 (bench/switch_cost.py,
# bench/README.md 2026-12-07; only their ratios matter): per phase-1 frame, its share of the batch
# begun (embedding, plan), of one layer pair, of the camera head and its depth head; a later
# overlap frame's own step. The heads took 30.4 and 49.0 ms for 8 frames in two sessions; how
# they split between the two heads is assumed (the depth head's fp32 maps at the image's size
# dominate) until bench/switch_cost.py measures each slice.
BEGIN_MS_PER_FRAME = 18.1 / 8
LAYER_PAIR_MS_PER_FRAME = 7.6 / 2 / 8
CAMERA_HEAD_MS_PER_FRAME = 3.0 / 8
DEPTH_HEAD_MS_PER_FRAME = 46.0 / 8
LATER_FRAME_MS = 17.4


def work_costs(num_scale_frames: int, depth: int, overlap: int, layers_per_slice: int) -> list[float]:
    """The cost of each call the spare gets before a switch, in order: a step per overlap frame
    until phase 1's batch is complete (buffering costs nothing; the last begins the batch), phase
    1's slices (its layers, the camera head, the depth head's chunks: FrameCompute.advance), then
    a step per later overlap frame."""
    n, chunk = num_scale_frames, DEPTH_HEAD_FRAMES
    slices = [min(layers_per_slice, depth - first) * n * LAYER_PAIR_MS_PER_FRAME
              for first in range(0, depth, layers_per_slice)]
    depth_chunks = [min(chunk, n - first) * DEPTH_HEAD_MS_PER_FRAME for first in range(0, n, chunk)]
    return ([0.0] * (n - 1) + [n * BEGIN_MS_PER_FRAME] + slices + [n * CAMERA_HEAD_MS_PER_FRAME] + depth_chunks
            + [LATER_FRAME_MS] * (overlap - n))


def ahead_refusal(settings) -> str:
    """Why ``settings`` (MapperSettings) cannot prepare window switches ahead, '' if they can."""
    s = settings
    if s.long_run_policy != "windowed":
        return "it prepares the windowed policy's switches: set long_run_policy windowed"
    if s.keyframe_policy != "interval":
        return ("the motion keyframe policy decides a frame's fate after its step, which a run ahead "
                "cannot know: set keyframe_policy interval")
    layout = s.window_rule().layout()
    ov, L = layout.overlap, layout.window_frames
    if ov < s.num_scale_frames:
        return (f"the overlap ({ov} frames) is shorter than phase 1 ({s.num_scale_frames}), so the next "
                "window's phase 1 waits for frames after the switch: raise overlap_size")
    if ov > s.scale_frames + s.sliding_window:
        return (f"the overlap ({ov} frames) does not fit the cache's scale_frames + sliding_window "
                f"({s.scale_frames} + {s.sliding_window}): lower overlap_size")
    if 2 * ov > L:
        return (f"the overlap ({ov} frames) is over half a window ({L} frames): a window's first frames "
                "would be the next one's too; lower overlap_size or raise window_size")
    return ""


def spare_session(session: StreamingSession, overlap: int) -> StreamingSession:
    """A session of ``session``'s model and settings whose cache holds ``overlap`` frames (its
    sliding window ``overlap - scale_frames``, no deferral pages, one special page): 2.5 GiB
    more at the peak in bf16 for the released model at 518x378 (the H100, bench/README.md)."""
    def small_cache(spec):
        # Split as the live cache does (FlashInfer), so that its steps round as the switch's would.
        window = max(1, overlap - spec.scale_frames)
        return PagedKVCache(dataclasses.replace(spec, sliding_window=min(window, spec.sliding_window),
                                                deferred_capacity=0, special_chunk_pages=1,
                                                split_window_pages=spec.full_window_pages),
                            backend=session.settings.attention_backend)
    return StreamingSession(session.model, session.settings, cache_factory=small_cache)


class SwitchAhead:
    """The Mapper's: with ``window_switch_ahead`` off (or for a rig camera's session view, whose
    steps are batched with the other cameras'), every verb does nothing and the switch runs the
    frames itself."""

    def __init__(self, settings, session):
        on = settings.window_switch_ahead and isinstance(session, StreamingSession)
        layout = settings.window_rule().layout() if on else None
        self.spare = spare_session(session, layout.overlap) if on else None
        self.window_frames = layout.window_frames if on else 0
        self.first_position = layout.window_frames - layout.overlap if on else 0   # the overlap's first: L - ov
        self.scale_frames = settings.num_scale_frames
        self.costs: list[float] = []             # each call's cost, in order (work_costs)
        if on:
            self.spare.scale_phase_layers = PHASE1_LAYERS_PER_SLICE
            self.costs = work_costs(settings.num_scale_frames, len(session.model.aggregator.frame_blocks),
                                    layout.overlap, PHASE1_LAYERS_PER_SLICE)
        self._clear()
        self._off = False                        # discarded: nothing more until the next switch

    def take(self, pending: Pending) -> list[Notice]:
        """After the live session's step of ``pending`` (its pose placed): the spare takes it if it
        is one of the window's last ``ov`` frames, and does this frame's share of the work left (its
        cost spread evenly over the frames up to the window's last). A notice if its work was dropped."""
        if self.spare is None or self._off or pending.rerun or pending.position < self.first_position:
            return []
        self._taken.append(pending.index)
        self._queue.append(pending.image)
        frames_left = max(1, self.window_frames - pending.position)   # this one to the window's last
        try:
            with torch.inference_mode():
                self._work(sum(self.costs[self._done:]) / frames_left)
        except Exception as error:   # e.g. out of memory: the switch runs the frames itself
            self.discard()
            return [Notice(FALLBACK, f"the next window's first frames could not run ahead ({type(error).__name__}: "
                                     f"{error}); its switch runs them at once")]
        return []

    def start_window(self, rerun: list[Pending], session: StreamingSession) -> list:
        """At a switch: ``session`` reset, and where the spare took exactly the frames ``rerun``, its
        work finished and its stream taken over. Per frame of ``rerun``, the results ``session.step``
        would return for it, or None where the switch runs it itself."""
        with torch.inference_mode():
            session.reset()
            ready = self.spare is not None and [p.index for p in rerun] == self._taken
            if ready:
                try:
                    self._work(math.inf)
                    session.take_over(self.spare)
                except (CacheError, ValueError, RuntimeError) as error:   # the switch runs them
                    log.warning("window switch prepared ahead not taken over: %s", error)
                    session.reset()
                    ready = False
        # As session.step returns them: nothing while phase 1 buffers, its batch with its last frame.
        nsf, results = self.scale_frames, self._results
        per_frame = [[] for _ in range(nsf - 1)] + [results[:nsf]] + [[r] for r in results[nsf:]]
        self.discard(until_switch=False)
        return per_frame if ready else [None] * len(rerun)

    def forget(self, index: int | None) -> None:
        """Frame ``index`` was rolled back (None: a buffered phase-1 frame): the spare's work is
        void if it took that frame."""
        if index in self._taken:
            self.discard()

    def discard(self, until_switch: bool = True) -> None:
        """Drop the spare's work; ``until_switch``: it takes no frame until the next switch (a
        restart passes False: the next stream's first window prepares its switch as usual)."""
        if self.spare is not None:
            self.spare.reset()
        self._clear()
        self._off = until_switch

    def warm_up(self, preprocessor, size) -> None:
        """The spare's kernels and CUDA graph, before the first frame (warmup_size.run_warmup)."""
        if self.spare is not None:
            run_warmup(self.spare, preprocessor, size)

    def _work(self, budget: float) -> None:
        """The spare's next calls in order (phase 1's next slice, or the next queued frame's step)
        while ``budget`` (ms, as ``costs``) lasts: a call is made when at least half of it fits."""
        spare, spent = self.spare, 0.0
        while self._queue or spare.scale_phase_running:
            cost = self.costs[self._done] if self._done < len(self.costs) else LATER_FRAME_MS
            if spent + cost / 2 > budget:
                return
            if spare.scale_phase_running:
                self._results += spare.advance_scale_phase()
            else:
                self._results += spare.step(self._queue.pop(0))
            self._done += 1
            spent += cost

    def _clear(self) -> None:
        self._taken: list[int] = []                 # indices of the frames the spare took, in order
        self._queue: list[torch.Tensor] = []        # their images not given to the spare yet
        self._results: list[FrameResult] = []       # the spare's results so far, in frame order
        self._done = 0                              # the spare's calls made (index into costs)
