"""The windowed long-run policy, one frame at a time (spec 13.1, the [improve] note).

A window is a stream of ``L`` frames from a fresh session. When the first frame past a full
window arrives, the next window starts: the session is reset and the window's last ``ov`` input
frames run again (phase 1, then streamed), their raw results are aligned to the previous window's
warped results of the same frames (``similarity.align_window``), and from then on every result
of the window is warped into window 0's frame (``similarity.warp_frame``). That reproduces the
original's offline window list and stitching for ``1 <= ov < L`` (``WindowRule.check_live``).

A frame at position ``i`` of its window is final at once when ``i < L - ov``; the window's last
``ov`` frames are provisional: they are published as they come, and their final value is the
next window's re-run (or their own, when the stream ends). This class keeps the bookkeeping of
one stream (a restart makes a new one), the provisional outputs included; the Mapper runs the
session and places the outputs.
"""
from __future__ import annotations

import collections
from collections.abc import Callable
import dataclasses

import torch

from ...stream import FrameResult
from ..records import InputFrame, MapperOutput
from .similarity import Similarity, align_window, overlap_agreement, warp_frames
from .rule import WindowRule

# Frames a window keeps beyond the overlap, so that rolling back this many newest frames still
# leaves the overlap's inputs and results for the next switch (the cache's exact-rollback budget).
ROLLBACK_MARGIN = 8


@dataclasses.dataclass(frozen=True)
class WindowRecord:
    """One window's placement in window 0's model frame (what offline runs write out)."""

    window: int
    first_index: int          # Mapper frame index of the window's first frame
    similarity: Similarity
    overlap_error: float      # mean camera-centre distance over the overlap / motion over it (nan: none)


@dataclasses.dataclass
class Pending:
    """A frame given to the session whose result has not come back yet (phase-1 buffering)."""

    frame: InputFrame
    index: int
    position: int             # position in its window
    rerun: bool               # run again at a switch (its first value came from the last window)
    image: torch.Tensor


class LiveWindows:
    def __init__(self, rule: WindowRule, estimator: str):
        rule.check_live()
        self.estimator = estimator
        self.length, self.overlap = rule.window_frames, rule.overlap
        self.records: list[WindowRecord] = []    # this stream's windows, placed ones only
        self.number = 0
        self.count = 0                           # frames given to this window's session
        keep = self.overlap + ROLLBACK_MARGIN
        self.inputs: collections.deque[Pending] = collections.deque(maxlen=keep)
        self.tail: collections.deque[FrameResult] = collections.deque(maxlen=keep)   # warped results
        self.similarity: Similarity | None = Similarity.identity()
        self.head: list[tuple[Pending, FrameResult]] = []   # raw results waiting for the alignment
        self.previous_tail: list[FrameResult] = []
        # Outputs published but not final yet (the window's last ``ov`` frames), by frame index.
        self._provisional: collections.OrderedDict[int, MapperOutput] = collections.OrderedDict()
        self.last_scale = 1.0
        self.last_overlap_error = float("nan")
        self.switch_asked = False                # the next window starts at the next frame (new_window)
        # A resumed window's provisional frames (database/resume.py): index -> (stamp_ns, stored points or
        # None for a non-keyframe), final once the next window has run them again.
        self.resumed: dict[int, tuple] = {}

    # -- provisional outputs ---------------------------------------------------------------------

    def hold(self, output: MapperOutput) -> None:
        self._provisional[output.index] = output

    def finalised(self, index: int) -> None:
        """The next window ran frame ``index`` again: its provisional output is superseded."""
        self._provisional.pop(index, None)
        self.resumed.pop(index, None)

    def is_provisional(self, index: int) -> bool:
        """Whether frame ``index`` still waits for its final value (a re-run of a frame that is
        final already, after ``new_window`` ended its window early, only aligns)."""
        return index in self._provisional or index in self.resumed

    def provisional(self) -> list[MapperOutput]:
        return list(self._provisional.values())

    def provisional_points(self, min_confidence: float, stride: int) -> list[tuple]:
        """The provisional keyframes' points (in I) with their current values, (xyz, rgb) each: a
        resumed window's stored ones first, then this window's."""
        return self.provisional_points_later(min_confidence, stride)()

    def provisional_points_later(self, min_confidence: float, stride: int) -> Callable[[], list[tuple]]:
        """``provisional_points`` picked now (the frame loop owns this bookkeeping) and made when
        called, on any thread: making them reads model outputs on the device (on CUDA a wait for
        it), which the live view leaves to the map builder's thread."""
        stored = [points for _, points in self.resumed.values() if points is not None]
        keyframes = [o for o in self.provisional() if o.is_keyframe]
        return lambda: stored + [o.internal_points(min_confidence, stride) for o in keyframes]

    def end(self) -> tuple[dict, list[MapperOutput]]:
        """The stream ends here: the resumed window's provisional frames that no re-run reached
        (their stored values are final now) and the provisional outputs (now final), oldest first."""
        resumed, self.resumed = self.resumed, {}
        outputs, self._provisional = list(self._provisional.values()), collections.OrderedDict()
        return resumed, outputs

    @property
    def switch_due(self) -> bool:
        return self.count >= self.length or self.switch_asked

    def resume(self, number: int, inputs: list[Pending], tail: list, provisional: dict) -> None:
        """Continue a stored window (database/resume.py): its number, last frames and their results,
        its provisional frames; the next frame starts the next window, aligned to them."""
        self.resumed = dict(provisional)
        self.number = number
        self.inputs.extend(inputs)
        self.tail.extend(tail)
        self.count = len(inputs)
        self.switch_asked = True

    def switch_refusal(self) -> str:
        """Why the next window cannot start at the next frame ('' if it can): the switch aligns on
        the last ``ov`` frames, so they must have been placed in this window."""
        if self.similarity is None or len(self.tail) < self.overlap or len(self.inputs) != len(self.tail):
            return (f"the current window has not placed its last {self.overlap} frames yet (overlap_size); "
                    "try again after more frames")
        return ""

    def ask_switch(self) -> str:
        """The next window starts at the next frame (``new_window``); ValueError, having changed
        nothing, where it cannot (``switch_refusal``)."""
        refusal = self.switch_refusal()
        if refusal:
            raise ValueError(refusal)
        self.switch_asked = True
        return f"window {self.number + 1} starts at the next frame"

    def is_final(self, position: int) -> bool:
        return position < self.length - self.overlap

    def next_window(self) -> list[Pending]:
        """Start the next window; returns the frames to run again (the last ``ov``), which the
        caller gives to the reset session in order."""
        rerun = list(self.inputs)[-self.overlap:]
        self.previous_tail = list(self.tail)[-self.overlap:]
        self.number += 1
        self.count = 0
        self.switch_asked = False
        self.inputs.clear()
        self.tail.clear()
        self.similarity = None
        self.head = []
        return [dataclasses.replace(p, rerun=True) for p in rerun]

    def enter(self, pending: Pending) -> Pending:
        """A frame given to the session: take its position."""
        pending.position = self.count
        self.count += 1
        self.inputs.append(pending)
        return pending

    def place(self, pending: Pending, raw: FrameResult) -> list[tuple[Pending, FrameResult]]:
        """One raw result -> the (frame, warped result) pairs that can be placed now, in order:
        nothing while the window waits for its overlap, then the whole overlap at once."""
        if self.similarity is None:
            self.head.append((pending, raw))
            if len(self.head) < self.overlap:
                return []
            self._align()
            ready, self.head = self.head, []
        else:
            if self.similarity.scale.device != raw.pose_enc.device:   # window 0's identity, made before
                self.similarity = Similarity.identity(raw.pose_enc.device)   # any result told the device
            ready = [(pending, raw)]
            if not self.records:   # window 0's first placed frame: the identity
                self.records.append(WindowRecord(0, pending.index, self.similarity, float("nan")))
        placed = list(zip([p for p, _ in ready], warp_frames([r for _, r in ready], self.similarity)))
        self.tail.extend(result for _, result in placed)
        return placed

    def refuses_rollback(self, had_result: bool) -> str:
        """Why the newest frame cannot be forgotten ('' if it can): the window keeps the inputs
        of its newest ``ov + ROLLBACK_MARGIN`` frames only (and rerun frames stay)."""
        if not self.inputs or (had_result and not self.tail):
            return (f"the window keeps the inputs of its newest {self.inputs.maxlen} frames only, and "
                    "that many were rolled back")
        if self.inputs[-1].rerun:
            return "the newest frame was run again to align two windows; it cannot be rolled back"
        return ""

    def forget_newest(self, had_result: bool) -> MapperOutput | None:
        """The newest frame was rolled back (``had_result``: it was placed, not still buffered);
        returns its provisional output if it had one. Call ``refuses_rollback`` first."""
        self.count -= 1
        pending = self.inputs.pop()
        if had_result:
            self.tail.pop()
        return self._provisional.pop(pending.index, None)

    def _align(self) -> None:
        current = [raw for _, raw in self.head]
        self.similarity = align_window(self.previous_tail, current, self.overlap, self.estimator)
        distance, path = overlap_agreement(self.previous_tail, current, self.overlap, self.similarity)
        self.last_scale = float(self.similarity.scale)
        self.last_overlap_error = distance / path if path > 0 else float("nan")
        self.records.append(WindowRecord(self.number, self.head[0][0].index, self.similarity,
                                         self.last_overlap_error))
