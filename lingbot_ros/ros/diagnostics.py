"""The node's input counters (callbacks and worker add to them) and the process's memory."""
from __future__ import annotations

import resource
import threading
import time


class Counters:
    """Cumulative input counts since configure (what the Mapper never sees: received, dropped
    before the worker, rejected by the decoder) and the latency of the last frame. Increments
    come from several threads, hence the lock."""

    FIELDS = ("received", "dropped", "rejected", "camera_info_rejected")

    def __init__(self):
        self._lock = threading.Lock()
        self.values = dict.fromkeys(self.FIELDS, 0)
        self.latency_ms = 0.0
        self.last_error = ""
        self._window = (time.monotonic(), {**self.values, "processed": 0})
        self._latency_sum = 0.0
        self._latency_count = 0

    def add(self, name: str, count: int = 1) -> None:
        with self._lock:
            self.values[name] += count

    def error(self, text: str) -> None:
        with self._lock:
            self.last_error = text

    def frame_done(self, latency_ms: float) -> None:
        with self._lock:
            self.latency_ms = latency_ms
            self._latency_sum += latency_ms
            self._latency_count += 1

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self.values)

    def rates(self, processed: int) -> tuple[dict, float]:
        """Per-second rates since the previous call (``processed``: the Mapper's count), and the
        mean latency over that window."""
        with self._lock:
            now, counts = time.monotonic(), {**self.values, "processed": processed}
            then, previous = self._window
            self._window = (now, counts)
            mean_latency = self._latency_sum / self._latency_count if self._latency_count else 0.0
            self._latency_sum, self._latency_count = 0.0, 0
        dt = max(now - then, 1e-6)
        return {k: (counts[k] - previous[k]) / dt for k in counts}, mean_latency


def memory_bytes(device: str) -> tuple[int, int]:
    """(process peak RSS bytes, CUDA bytes allocated or 0)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    cuda = 0
    if device.startswith("cuda"):
        import torch

        cuda = int(torch.cuda.memory_allocated(device))
    return rss, cuda
