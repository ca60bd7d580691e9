"""Long-run policies that restart the stream: when a stream has grown too big for the model.

``reset``: restart when the keyframes stored since the stream began reach ``max_keyframes`` (the
3D RoPE's trained range is 1024) or the cache memory reaches ``max_cache_mb``; the map continues
from the last pose. ``none``: never (the cost per frame grows with the special tokens kept).
The windowed policy does not restart a stream (a window switch is not a restart); it lives in
windows/live.py.
"""
from __future__ import annotations

from ..stream.session import CacheUsage
from .settings import MapperSettings


class NoRestarts:
    def restart_reason(self, usage: CacheUsage) -> str | None:
        return None


class CacheCaps(NoRestarts):
    def __init__(self, max_keyframes: int, max_cache_mb: float):
        self.max_keyframes, self.max_cache_mb = max_keyframes, max_cache_mb

    def restart_reason(self, usage: CacheUsage) -> str | None:
        stored = usage.frames_stored
        if self.max_keyframes and stored >= self.max_keyframes:
            return f"cache cap: {stored} keyframes stored (max_keyframes={self.max_keyframes})"
        # Memory in use, not allocated: a restart keeps the buffers for the next stream.
        nbytes = usage.bytes_in_use
        if self.max_cache_mb and nbytes >= self.max_cache_mb * 2**20:
            return f"cache cap: {nbytes / 2**20:.1f} MB in use (max_cache_mb={self.max_cache_mb:g})"
        return None


def make_long_run_policy(settings: MapperSettings) -> NoRestarts:
    if settings.long_run_policy == "reset":
        return CacheCaps(settings.max_keyframes, settings.max_cache_mb)
    return NoRestarts()
