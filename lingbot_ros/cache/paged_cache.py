"""`PagedKVCache`: the global-attention KV cache of all transformer layers (spec section 9), for
one stream.

One pool tensor per layer (`PagedPools`) and ONE page bookkeeping shared by all layers
(`StreamPages` at page 0):

    pages 0 .. frame_pages-1        frame pages (PagePool): anchors, window, pending, free
    page  frame_pages               scratch page: a non-keyframe's own K/V
    pages patch_pages ..            special stream (grows in chunks of special_chunk_pages)

Per step: `begin_step` does all host work once (pages, evictions, special-token copies, page
table, one upload, the backend's plan); `attend(layer, ...)` then only launches device work.
Attention sees, in this page order: anchors, window (current frames included), the scratch page
(non-keyframes only), special pages (only the last page may be partial). Several streams in one
pool, attended in one step: `MultiStreamKVCache`.
"""

from __future__ import annotations

from .paged_pools import PagedPools, StreamVerbs
from .spec import CacheSpec
from .stream_pages import CacheStats, StreamPages

__all__ = ["CacheStats", "PagedKVCache"]


class PagedKVCache(StreamVerbs, PagedPools):
    """Anchors + sliding window of whole frames and a growing special-token stream, paged.

    Call order per forward pass: `begin_step(F, store)`, then `attend(layer, q, k, v)` (or
    `write`) for EVERY layer before the next `begin_step`; the special-token copies and K/V
    writes of the step happen there. `rollback_last_frame`, `flush` and `reset` go between
    steps and end the current one.
    """

    def __init__(self, spec: CacheSpec, backend: str = "auto") -> None:
        self._pages = StreamPages(spec)
        super().__init__(spec, [self._pages], backend)

    @property
    def _host(self) -> PagedPools:
        # A property, not an attribute: a reference to itself would make a cycle, and a dropped
        # cache's GPU memory would wait for the next cycle collection.
        return self
