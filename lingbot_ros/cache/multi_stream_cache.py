"""`MultiStreamKVCache`: the global-attention KV caches of several streams in ONE page pool per
layer, so that one step can attend all of them: one page table, one attention plan with one
request per stream (FlashInfer's batch prefill serves many sequences at once exactly so), one
write of all streams' new frames per layer.

Memory layout (pages of P tokens, in every layer's pool):

    stream s:   s * base_pages .. (s+1) * base_pages - 1
                (its frame pages, its scratch page, the first chunk of its special stream;
                 the layout of a single-stream cache, shifted)
    past N * base_pages:   special pages grown later, each chunk owned by the stream that grew it

Each stream keeps its own bookkeeping (`StreamPages`: anchors, window, pending evictions,
special stream, deferral) and its own verbs (`stream(s)`: begin_step, rollback_last_frame,
flush, reset, stats), so a stream behaves exactly as a `PagedKVCache` of its own; `begin_batch`
is the one step of several streams. All streams share the spec: the same image size (P) and
cache policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .paged_pools import PagedPools, StreamVerbs
from .spec import CacheSpec
from .stream_pages import StreamPages


@dataclass(frozen=True)
class BatchPart:
    """One stream's frame in a batched step."""

    stream: int
    store: bool   # a keyframe (appended, may evict) or not (attends, leaves no trace)


class MultiStreamKVCache(PagedPools):
    """`num_streams` streams' caches in one pool per layer. Call order: `begin_batch(parts)` (or
    one stream's `stream(s).begin_step(...)`), then `attend(layer, q, k, v)` for EVERY layer with
    the parts' queries in the parts' order, before the next step. A stream's rollback, flush or
    reset goes between steps and ends the current one."""

    def __init__(self, spec: CacheSpec, num_streams: int, backend: str = "auto") -> None:
        if not isinstance(num_streams, int) or isinstance(num_streams, bool) or num_streams < 1:
            raise ValueError(f"num_streams must be a positive int, got {num_streams!r}")
        streams = [StreamPages(spec, s * spec.base_pages) for s in range(num_streams)]
        super().__init__(spec, streams, backend)

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    def stream(self, s: int) -> "StreamCacheView":
        """Stream s's cache, with `PagedKVCache`'s verbs. A new view each call (the pool keeps
        none: a view refers to the pool, and a cycle would delay freeing its GPU memory)."""
        self._check_stream(s)
        return StreamCacheView(self, s)

    def begin_batch(self, parts: Sequence[BatchPart]) -> None:
        """One step of one frame per listed stream (each stream at most once), in this order:
        the queries of `attend` are the parts' frames, P tokens each, in the same order. Raises
        ValueError, CacheExhausted or SpecialStreamFull (naming the stream) before changing
        anything for any stream."""
        streams = [part.stream for part in parts]
        if not streams or len(set(streams)) != len(streams):
            raise ValueError(f"a batch takes each stream at most once and at least one, got {streams}")
        for s in streams:
            self._check_stream(s)
        try:
            self._begin([(self._streams[p.stream], 1, p.store) for p in parts])
        except Exception as error:
            error.add_note(f"in a batched step of streams {streams}")
            raise

    def prepare(self, s: int, store: bool) -> None:
        """Raise what a single-frame step of stream s would raise now (CacheExhausted when its
        deferred evictions are at capacity, ...); changes nothing."""
        self._check_stream(s)
        self._streams[s].prepare(1, store)

    def _check_stream(self, s: int) -> None:
        if not isinstance(s, int) or isinstance(s, bool) or not 0 <= s < len(self._streams):
            raise ValueError(f"stream must be an int in [0, {len(self._streams)}), got {s!r}")


def _shared(name: str) -> property:
    return property(lambda view: getattr(view._host, name), doc=f"The shared pool's `{name}`.")


class StreamCacheView(StreamVerbs):
    """One stream of a `MultiStreamKVCache`, with the interface of a `PagedKVCache` (what a
    `StreamingSession` uses): its steps are steps of the shared pool with one request."""

    def __init__(self, owner: MultiStreamKVCache, stream: int) -> None:
        self._host = owner
        self._pages = owner._streams[stream]
        self.stream = stream
        self.spec = owner.spec

    # What a single-stream cache reports about its pools, here the shared pool's.
    backend = _shared("backend")
    supports_graphs = _shared("supports_graphs")
    buffers_version = _shared("buffers_version")
    step_table = _shared("step_table")

    def attend(self, layer: int, q, k, v, merge: bool = True):
        return self._host.attend(layer, q, k, v, merge=merge)
