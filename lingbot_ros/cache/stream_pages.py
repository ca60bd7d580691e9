"""`StreamPages`: one stream's page bookkeeping in a page pool (spec section 9), host only.

A stream owns a run of `CacheSpec.base_pages` pages starting at `first_page`:

    first_page .. + frame_pages-1    frame pages (PagePool): anchors, window, pending, free
    first_page + frame_pages         scratch page: a non-keyframe's own K/V
    first_page + patch_pages ..      the first chunk of its special stream

and the special pages it grows into later, wherever its cache puts them (`SpecialStream`). A
single-stream cache (`PagedKVCache`) holds one at page 0; `MultiStreamKVCache` holds several in
one pool. A step is checked (`prepare`) before anything changes, so that a batch of streams can
check every stream before changing any.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import CacheError, CacheExhausted
from .page_pool import PagePool
from .patch_stream import Eviction, Frame, PatchStream
from .spec import CacheSpec
from .special_stream import SpecialStream

# A special-token copy: (source page, slot) -> (special page, slot)
Copy = tuple[int, int, int, int]


@dataclass(frozen=True)
class CacheStats:
    """Occupancy of a stream's cache. Pages count once for all layers; bytes cover all layers."""

    frames_stored: int
    anchor_pages: int
    window_pages: int
    pending_pages: int      # evicted, waiting for flush()
    free_pages: int         # frame pages free
    special_tokens: int
    special_pages: int      # allocated for the special stream
    special_pages_in_use: int   # ceil(special_tokens / P)
    bytes_allocated: int    # the pages the stream owns (a single-stream cache: all pools)
    bytes_in_use: int       # stored + pending frames and special tokens


@dataclass(frozen=True)
class PreparedStep:
    """A checked step of one stream, not applied yet."""

    num_frames: int
    store: bool
    eviction: Eviction = Eviction()
    new_specials: int = 0
    grow_pages: int = 0       # special pages the stream needs before it can apply the step


@dataclass(frozen=True)
class StreamRequest:
    """One stream's part of a step's page table: what it writes, copies and sees."""

    num_frames: int
    write_pages: list[int]     # page of each new frame (the scratch page if not stored)
    copies: list[Copy]         # evicted frames' specials into the special stream
    visible: list[int]         # pages attention sees, in order; the last may be partial
    last_page_len: int
    scratch_page: int


class StreamPages:
    """Anchors + sliding window of whole frames and a growing special-token stream, as page ids."""

    def __init__(self, spec: CacheSpec, first_page: int = 0) -> None:
        self.spec = spec
        self.first_page = first_page
        self.defer_evictions = False   # settable between steps; never changes outputs
        self.scratch_page = first_page + spec.scratch_page
        self.pool = PagePool(spec.frame_pages, first_page)
        self.patch = PatchStream(spec.scale_frames, spec.sliding_window, spec.include_scale_frames)
        self.special = SpecialStream(spec.tokens_per_frame, first_page + spec.patch_pages,
                                     spec.special_chunk_pages, spec.max_special_tokens)

    @property
    def num_stored(self) -> int:
        return self.patch.num_stored

    def prepare(self, num_frames: int, store: bool) -> PreparedStep:
        """Check a step of `num_frames` frames (stored or not). Raises ValueError,
        CacheExhausted or SpecialStreamFull; changes nothing."""
        spec, patch = self.spec, self.patch
        if not isinstance(num_frames, int) or isinstance(num_frames, bool) or num_frames < 1:
            raise ValueError(f"num_frames must be a positive int, got {num_frames!r}")
        if not store:
            if num_frames != 1:
                raise ValueError(f"a non-keyframe step (store=False) takes 1 frame, got {num_frames}")
            return PreparedStep(num_frames, store)
        eviction = patch.eviction_for(num_frames)
        leaving = len(eviction.frames)
        new_specials = spec.specials_per_evicted_frame * len(eviction.evicted)   # dropped frames leave none
        self.special.check_room(new_specials)
        defer = self.defer_evictions
        pending = len(patch.pending)
        if defer and pending + leaving > spec.deferred_capacity:
            raise CacheExhausted(
                f"{pending} evicted pages are pending and this step evicts {leaving} more, "
                f"over deferred_capacity={spec.deferred_capacity}; call flush() first or raise "
                "CacheSpec.deferred_capacity")
        reclaimable = 0 if defer else pending
        if num_frames > self.pool.num_free + reclaimable:
            raise CacheExhausted(
                f"this step needs {num_frames} pages but {self.pool.num_free} are free "
                f"({pending} pending); call flush(), append fewer frames at once, or raise "
                "CacheSpec.deferred_capacity")
        return PreparedStep(num_frames, store, eviction, new_specials,
                            self.special.pages_to_grow(new_specials))

    def apply(self, step: PreparedStep) -> StreamRequest:
        """Carry out a prepared step (its `grow_pages` already added to the special stream)."""
        spec, patch = self.spec, self.patch
        if not step.store:
            write_pages, copies = [self.scratch_page], []
        else:
            defer = self.defer_evictions
            if not defer:
                self.pool.free(patch.take_pending())
            write_pages = self.pool.allocate(step.num_frames)
            patch.append(write_pages)
            self.pool.free(patch.evict(step.eviction, step.new_specials, defer))
            destinations = iter(self.special.append(step.new_specials))
            per_frame = spec.specials_per_evicted_frame
            copies = [(frame.page, slot, *next(destinations))
                      for frame in step.eviction.evicted for slot in range(per_frame)]
        visible = patch.visible_pages()
        if not step.store:
            visible.append(self.scratch_page)
        visible += self.special.visible_pages()
        return StreamRequest(step.num_frames, write_pages, copies, visible, self.special.last_page_len,
                             self.scratch_page)

    def rollback(self) -> None:
        """Remove the newest stored frame (the caller checks that one is stored)."""
        page, dropped_specials = self.patch.pop_newest()
        self.special.truncate(dropped_specials)
        self.pool.free([page])

    def flush(self) -> int:
        pages = self.patch.take_pending()
        self.pool.free(pages)
        return len(pages)

    def take_over(self, other: "StreamPages") -> tuple[list[int], list[int]]:
        """Hold what ``other`` holds, as page ids of this stream: (other's pages, this stream's
        pages), in the same order, for the caller to copy. Only between an empty stream and one
        that has evicted nothing (no special tokens, nothing pending) and fits this stream's
        anchors and window; CacheError, having changed nothing, otherwise."""
        mine, theirs = self.spec, other.spec
        why = ("this stream holds frames (reset it first)" if self.num_stored or self.patch.pending
               or self.special.num_tokens else
               "the other stream has evicted frames (special tokens or pending pages)"
               if other.patch.pending or other.special.num_tokens else
               "the caches' pages differ (layers, tokens per frame, heads, head size or dtype)"
               if (mine.num_layers, mine.tokens_per_frame, mine.num_heads, mine.head_dim, mine.storage_dtype)
               != (theirs.num_layers, theirs.tokens_per_frame, theirs.num_heads, theirs.head_dim,
                   theirs.storage_dtype) else
               "the caches keep anchors differently (scale_frames, include_scale_frames)"
               if (mine.scale_frames, mine.include_scale_frames) != (theirs.scale_frames, theirs.include_scale_frames)
               else f"the other stream holds {other.num_stored} frames, more than this one keeps whole "
                    f"({mine.scale_frames + mine.sliding_window})"
               if other.num_stored > mine.scale_frames + mine.sliding_window else "")
        if why:
            raise CacheError(f"cannot take the other stream's frames over: {why}")
        frames = list(other.patch.anchors) + list(other.patch.window)
        pages = self.pool.allocate(len(frames))
        for frame, page in zip(frames, pages):
            anchors = len(self.patch.anchors) < len(other.patch.anchors)
            (self.patch.anchors if anchors else self.patch.window).append(Frame(frame.seq, page))
        self.patch.next_seq = other.patch.next_seq
        return [frame.page for frame in frames], pages

    def reset(self) -> None:
        """Empty; the special pages stay this stream's."""
        self.patch.reset()
        self.pool.reset()
        self.special.num_tokens = 0

    def pages(self) -> list[int]:
        """Every page this stream owns (frame pages, scratch, special pages)."""
        return list(range(self.first_page, self.first_page + self.spec.patch_pages)) + self.special.pages

    def stats(self) -> CacheStats:
        spec, patch, special = self.spec, self.patch, self.special
        return CacheStats(
            frames_stored=patch.num_stored,
            anchor_pages=len(patch.anchors),
            window_pages=len(patch.window),
            pending_pages=len(patch.pending),
            free_pages=self.pool.num_free,
            special_tokens=special.num_tokens,
            special_pages=special.num_pages,
            special_pages_in_use=-(-special.num_tokens // spec.tokens_per_frame),
            bytes_allocated=(spec.patch_pages + special.num_pages) * spec.page_bytes,
            bytes_in_use=(patch.num_stored + len(patch.pending)) * spec.page_bytes
            + special.num_tokens * spec.token_bytes)

    def census(self) -> dict[str, list[int]]:
        """Owner of every page of this stream (each page appears exactly once)."""
        patch = self.patch
        return {
            "free": self.pool.free_pages(),
            "anchor": [f.page for f in patch.anchors],
            "window": [f.page for f in patch.window],
            "pending": list(patch.pending),
            "scratch": [self.scratch_page],
            "special": list(self.special.pages),
        }
