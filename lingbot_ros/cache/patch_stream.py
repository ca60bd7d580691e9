"""`PatchStream`: which frame pages stay whole (anchors + sliding window) and which wait to be freed.

Policy only: it returns page ids to free and never touches tensors or the pool.

Retained frames, oldest first (A = scale_frames, Wn = sliding_window), after appending. Once more
than A + Wn are retained, the frames at positions [A, len - Wn) are evicted: they leave their
specials in the special stream (how many is the cache's business) and their pages go.

    include_scale_frames=True:
    pos:   0 .. A-1 | A ... len-Wn-1        | len-Wn ... len-1
           anchors  | evicted               | window (newest Wn, current frames included)

    include_scale_frames=False (no anchors; spec 9 [quirk]):
    pos:   0 .. A-1 | A ... len-Wn-1        | len-Wn ... len-1
           dropped  | evicted               | window
           (leave nothing behind)

Without anchors the split repeats at EVERY eviction: the retained frames fall back to Wn, grow by
one per stored frame and split again once they pass A + Wn, so of every A + 1 frames that leave,
one leaves its specials and A leave nothing. A = 3, Wn = 4: frame 7 evicts frame 3 and drops 0-2;
frames 8-10 evict nothing; frame 11 evicts frame 7 and drops 4-6.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice


@dataclass(frozen=True)
class Frame:
    """A stored frame: its append number since reset and the page holding its K/V."""

    seq: int
    page: int


@dataclass(frozen=True)
class Eviction:
    """The frames one step takes out of attention, each group oldest first. The dropped frames
    are older than the evicted ones."""

    dropped: tuple[Frame, ...] = ()   # leave nothing behind (include_scale_frames=False only)
    evicted: tuple[Frame, ...] = ()   # leave their specials in the special stream

    @property
    def frames(self) -> tuple[Frame, ...]:
        """All leaving frames, oldest first."""
        return self.dropped + self.evicted


@dataclass(frozen=True)
class PendingEvictions:
    """Evictions of one deferred step, kept so that rolling back the step's newest frame can
    undo them while their pages are still allocated."""

    newest_seq: int               # seq of the newest frame appended by the step
    frames: tuple[Frame, ...]     # leaving frames (dropped and evicted), oldest first
    special_tokens: int           # tokens those frames added to the special stream


class PatchStream:
    """Anchors + sliding window of whole frames, one page per frame, with deferred eviction."""

    def __init__(self, scale_frames: int, sliding_window: int, include_scale_frames: bool) -> None:
        self.scale_frames = scale_frames
        self.sliding_window = sliding_window
        self.include_scale_frames = include_scale_frames
        self.anchors: deque[Frame] = deque()  # the first A frames, only with include_scale_frames
        self.window: deque[Frame] = deque()  # the other stored frames, oldest first
        self.pending: list[int] = []        # pages of frames that left, not yet freed, in order
        self._undo: list[PendingEvictions] = []  # one entry per deferred step that evicted
        self.next_seq = 0                   # seq the next appended frame gets

    @property
    def num_stored(self) -> int:
        return len(self.anchors) + len(self.window)

    def visible_pages(self) -> list[int]:
        """Pages attention sees for stored frames: anchors, then window, oldest first."""
        return [f.page for f in self.anchors] + [f.page for f in self.window]

    def eviction_for(self, num_new: int) -> Eviction:
        """The frames that appending `num_new` frames takes out of attention (no state change).

        Raises ValueError if the append would evict frames of the same step (more than
        `sliding_window` new frames while evicting): attention for that step could not see them.
        """
        total = self.num_stored + num_new
        threshold = self.scale_frames + self.sliding_window
        if total <= threshold:
            return Eviction()
        if num_new > self.sliding_window:
            raise ValueError(
                f"begin_step(num_frames={num_new}) with {self.num_stored} frames stored would evict "
                f"frames of the same step; append at most sliding_window={self.sliding_window} "
                f"frames at once into a non-empty cache and at most scale_frames + sliding_window="
                f"{threshold} into an empty one")
        # Leaving: positions [0 or A, total - Wn), all stored already (num_new <= Wn).
        if self.include_scale_frames:
            assert len(self.anchors) == self.scale_frames, "anchors incomplete while evicting"
            return Eviction(evicted=tuple(islice(self.window, total - threshold)))
        leaving = tuple(islice(self.window, total - self.sliding_window))
        return Eviction(dropped=leaving[:self.scale_frames], evicted=leaving[self.scale_frames:])

    def append(self, pages: list[int]) -> None:
        """Store new frames (oldest first) behind the retained ones."""
        for page in pages:
            frame = Frame(self.next_seq, page)
            is_anchor = self.include_scale_frames and frame.seq < self.scale_frames
            (self.anchors if is_anchor else self.window).append(frame)
            self.next_seq += 1

    def evict(self, eviction: Eviction, special_tokens: int, defer: bool) -> list[int]:
        """Take the frames of `eviction` (from `eviction_for()` before the append) out of
        attention. `special_tokens`: what they added to the special stream (undone by rollback).

        With `defer` their pages wait in `pending` and the step can be undone by rollback;
        otherwise the pages are returned for the caller to free now.
        """
        frames = eviction.frames
        for frame in frames:
            gone = self.window.popleft()   # anchors never leave
            assert gone == frame, "evicting frames out of order"
        pages = [f.page for f in frames]
        if not defer:
            return pages
        if frames:
            self.pending.extend(pages)
            self._undo.append(PendingEvictions(self.next_seq - 1, frames, special_tokens))
        return []

    def take_pending(self) -> list[int]:
        """Execute all pending evictions: return their pages to free; they can't be undone."""
        pages, self.pending = self.pending, []
        self._undo.clear()
        return pages

    def pop_newest(self) -> tuple[int, int]:
        """Remove the newest stored frame and undo its step's pending evictions.

        Returns (page to free, special tokens to drop from the end of the special stream).
        The caller checks that a frame is stored.
        """
        newest = self.window.pop() if self.window else self.anchors.pop()
        self.next_seq = newest.seq
        dropped_specials = 0
        if self._undo and self._undo[-1].newest_seq == newest.seq:
            undone = self._undo.pop()
            # Pending pages are in eviction order and later steps were rolled back first,
            # so this step's pages are the tail.
            assert self.pending[-len(undone.frames):] == [f.page for f in undone.frames]
            del self.pending[-len(undone.frames):]
            self.window.extendleft(reversed(undone.frames))
            dropped_specials = undone.special_tokens
        return newest.page, dropped_specials

    def reset(self) -> None:
        self.anchors.clear()
        self.window.clear()
        self.pending.clear()
        self._undo.clear()
        self.next_seq = 0
