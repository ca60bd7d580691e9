"""Window switches prepared ahead (``window_switch_ahead``): the next window's first frames run in
a spare session while the current window still runs, one with each frame as it comes.

A switch runs the full window's last ``ov`` frames again from a reset session (live.py): phase 1
on the first ``num_scale_frames`` of them at once, then the rest one by one, all on the frame that
starts the next window (336 ms median on the H200 with the live default window, against a 35 ms
frame: bench/README.md). Those frames are known as they arrive, so the spare session takes each
one right after the live session's step: phase 1 runs with the overlap's ``num_scale_frames``-th
frame, each later overlap frame costs one more single-frame step. At the switch the live session,
reset, takes the spare's stream over (``StreamingSession.take_over`` copies the overlap's pages)
and the held results are placed as the switch's own runs would have placed them. The outputs are
the same: neither the spare nor the switch's runs evict a frame (``ahead_refusal``).

The spare's cache holds the overlap only (``spare_session``). Anything that changes the frames it
took (a rollback of one of them, a new_window request, a restart, a failure of its step) discards
its work: the switch then runs the frames itself, as without the setting.
"""
from __future__ import annotations

import dataclasses
import logging

import torch

from ...cache import CacheError, PagedKVCache
from ...stream import FrameResult, StreamingSession
from ..records import FALLBACK, Notice
from ..warmup_size import run_warmup
from .live import Pending

log = logging.getLogger(__name__)


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
    sliding window ``overlap - scale_frames``, no deferral pages, one special page): ~1.9 GB in
    bf16 for the released model at 518x378, against ~9.3 GB for the live session's."""
    def small_cache(spec):
        window = max(1, overlap - spec.scale_frames)
        return PagedKVCache(dataclasses.replace(spec, sliding_window=min(window, spec.sliding_window),
                                                deferred_capacity=0, special_chunk_pages=1),
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
        self.first_position = layout.window_frames - layout.overlap if on else 0   # the overlap's first: L - ov
        self._taken: list[int] = []              # indices of the frames the spare ran, in order
        self._results: list[list[FrameResult]] = []   # the spare's results for each
        self._off = False                        # discarded: nothing more until the next switch

    def take(self, pending: Pending) -> list[Notice]:
        """After the live session's step of ``pending``: the spare runs it too if it is one of the
        window's last ``ov`` frames. A notice if the spare's work had to be dropped."""
        if self.spare is None or self._off or pending.rerun or pending.position < self.first_position:
            return []
        try:
            with torch.inference_mode():
                results = self.spare.step(pending.image)
        except Exception as error:   # e.g. out of memory: the switch runs the frames itself
            self.discard()
            return [Notice(FALLBACK, f"the next window's first frames could not run ahead ({type(error).__name__}: "
                                     f"{error}); its switch runs them at once")]
        self._taken.append(pending.index)
        self._results.append(results)
        return []

    def start_window(self, rerun: list[Pending], session: StreamingSession) -> list:
        """At a switch: ``session`` reset, and where the spare ran exactly the frames ``rerun``, its
        stream taken over. Per frame of ``rerun``, the results ``session.step`` would return for
        it, or None where the switch runs it itself."""
        with torch.inference_mode():
            session.reset()
            ready = self.spare is not None and [p.index for p in rerun] == self._taken
            if ready:
                try:
                    session.take_over(self.spare)
                except (CacheError, ValueError) as error:   # changed nothing: the switch runs them
                    log.warning("window switch prepared ahead not taken over: %s", error)
                    ready = False
        results = self._results if ready else [None] * len(rerun)
        self.discard(until_switch=False)
        return results

    def forget(self, index: int | None) -> None:
        """Frame ``index`` was rolled back (None: a buffered phase-1 frame): the spare's work is
        void if it ran that frame."""
        if index in self._taken:
            self.discard()

    def discard(self, until_switch: bool = True) -> None:
        """Drop the spare's work; ``until_switch``: it takes no frame until the next switch (a
        restart passes False: the next stream's first window prepares its switch as usual)."""
        if self.spare is not None:
            self.spare.reset()
        self._taken, self._results = [], []
        self._off = until_switch

    def warm_up(self, preprocessor, size) -> None:
        """The spare's kernels and CUDA graph, before the first frame (warmup_size.run_warmup)."""
        if self.spare is not None:
            run_warmup(self.spare, preprocessor, size)
