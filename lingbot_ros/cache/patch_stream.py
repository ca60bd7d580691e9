"""`PatchStream`: which frame pages stay whole (anchors + sliding window) and which wait to be freed.

Policy only: it returns page ids to free and never touches tensors or the pool.

Retained frames, oldest first (A = scale_frames, Wn = sliding_window), after appending:

    seq:   0 1 .. A-1 | A  A+1 ...  len-Wn-1 | len-Wn ... len-1
           anchors    | evicted once len > A+Wn | window (newest Wn, current frames included)

With `include_scale_frames=False` eviction starts at position 0 instead of A, so the anchors
leave at the first eviction (and leave no specials, which the cache decides).
"""

from __future__ import annotations

from collections import deque
from itertools import chain, islice
from dataclasses import dataclass


@dataclass(frozen=True)
class Frame:
    """A stored frame: its append number since reset and the page holding its K/V."""

    seq: int
    page: int


@dataclass(frozen=True)
class PendingEvictions:
    """Evictions of one deferred step, kept so that rolling back the step's newest frame can
    undo them while their pages are still allocated."""

    newest_seq: int               # seq of the newest frame appended by the step
    frames: tuple[Frame, ...]     # evicted frames, oldest first
    special_tokens: int           # tokens those frames added to the special stream


class PatchStream:
    """Anchors + sliding window of whole frames, one page per frame, with deferred eviction."""

    def __init__(self, scale_frames: int, sliding_window: int, include_scale_frames: bool) -> None:
        self.scale_frames = scale_frames
        self.sliding_window = sliding_window
        self.include_scale_frames = include_scale_frames
        self.anchors: deque[Frame] = deque()  # frames with seq < scale_frames, oldest first
        self.window: deque[Frame] = deque()  # the other stored frames, oldest first
        self.pending: list[int] = []        # evicted pages not yet freed, in eviction order
        self._undo: list[PendingEvictions] = []  # one entry per deferred step that evicted
        self.next_seq = 0                   # seq the next appended frame gets

    @property
    def num_stored(self) -> int:
        return len(self.anchors) + len(self.window)

    def visible_pages(self) -> list[int]:
        """Pages attention sees for stored frames: anchors, then window, oldest first."""
        return [f.page for f in self.anchors] + [f.page for f in self.window]

    def victims(self, num_new: int) -> list[Frame]:
        """Frames that appending `num_new` frames would evict, oldest first (no state change).

        Raises ValueError if the append would evict frames of the same step (more than
        `sliding_window` new frames while evicting): attention for that step could not see them.
        """
        total = self.num_stored + num_new
        threshold = self.scale_frames + self.sliding_window
        if total <= threshold:
            return []
        if num_new > self.sliding_window:
            raise ValueError(
                f"begin_step(num_frames={num_new}) with {self.num_stored} frames stored would evict "
                f"frames of the same step; append at most sliding_window={self.sliding_window} "
                f"frames at once into a non-empty cache and at most scale_frames + sliding_window="
                f"{threshold} into an empty one")
        start = self.scale_frames if self.include_scale_frames else 0
        count = total - self.sliding_window - start
        if self.include_scale_frames:
            # Positions [A, ...) begin at the window: the A anchors are all stored here.
            assert len(self.anchors) == self.scale_frames, "anchors incomplete while evicting"
            return list(islice(self.window, count))
        return list(islice(chain(self.anchors, self.window), count))

    def append(self, pages: list[int]) -> None:
        """Store new frames (oldest first) behind the retained ones."""
        for page in pages:
            frame = Frame(self.next_seq, page)
            (self.anchors if frame.seq < self.scale_frames else self.window).append(frame)
            self.next_seq += 1

    def evict(self, victims: list[Frame], special_tokens: int, defer: bool) -> list[int]:
        """Drop `victims` (the result of `victims()` before the append) from attention.

        With `defer` their pages wait in `pending` and the step can be undone by rollback;
        otherwise the pages are returned for the caller to free now.
        """
        for frame in victims:
            source = self.anchors if frame.seq < self.scale_frames else self.window
            gone = source.popleft()
            assert gone == frame, "evicting frames out of order"
        pages = [f.page for f in victims]
        if not defer:
            return pages
        if victims:
            self.pending.extend(pages)
            self._undo.append(PendingEvictions(self.next_seq - 1, tuple(victims), special_tokens))
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
            for frame in reversed(undone.frames):
                if frame.seq < self.scale_frames:
                    self.anchors.appendleft(frame)
                else:
                    self.window.appendleft(frame)
            dropped_specials = undone.special_tokens
        return newest.page, dropped_specials

    def reset(self) -> None:
        self.anchors.clear()
        self.window.clear()
        self.pending.clear()
        self._undo.clear()
        self.next_seq = 0
