"""Errors raised by the paged KV cache. Every one is raised before any state changes."""


class CacheError(RuntimeError):
    """Base class of the cache's errors."""


class CacheExhausted(CacheError):
    """A step needs more patch pages (or pending evictions) than the cache was sized for."""


class SpecialStreamFull(CacheError):
    """A step would push the special-token stream past `CacheSpec.max_special_tokens`."""


class NothingToRollback(CacheError):
    """`rollback_last_frame()` was called while no frame is stored."""
