"""Paged two-stream KV cache for the global attention layers (anchors + sliding window of
whole frames, plus a growing stream of evicted frames' special tokens). See docs/interfaces.md."""

from .errors import CacheError, CacheExhausted, NothingToRollback, SpecialStreamFull
from .paged_cache import CacheStats, PagedKVCache
from .partials import PartialAttention
from .spec import CacheSpec

__all__ = ["CacheError", "CacheExhausted", "CacheSpec", "CacheStats", "NothingToRollback",
           "PagedKVCache", "PartialAttention", "SpecialStreamFull"]
