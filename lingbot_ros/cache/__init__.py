"""Paged two-stream KV cache for the global attention layers (anchors + sliding window of
whole frames, plus a growing stream of evicted frames' special tokens), for one stream or for
several streams in one pool. See docs/interfaces.md."""

from .errors import CacheError, CacheExhausted, NothingToRollback, SpecialStreamFull
from .multi_stream_cache import BatchPart, MultiStreamKVCache, StreamCacheView
from .paged_cache import CacheStats, PagedKVCache
from .partials import PartialAttention
from .spec import CacheSpec

__all__ = ["BatchPart", "CacheError", "CacheExhausted", "CacheSpec", "CacheStats", "MultiStreamKVCache",
           "NothingToRollback", "PagedKVCache", "PartialAttention", "SpecialStreamFull", "StreamCacheView"]
