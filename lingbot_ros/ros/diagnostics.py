"""Counters shared by the callbacks and the worker, and the /diagnostics message built from them."""
from __future__ import annotations

import resource
import threading
import time

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue


class Counters:
    """Cumulative counts since configure. Increments come from several threads, hence the lock."""

    FIELDS = ("received", "processed", "dropped", "rejected", "failed", "camera_info_rejected")

    def __init__(self):
        self._lock = threading.Lock()
        self.values = dict.fromkeys(self.FIELDS, 0)
        self.latency_ms = 0.0
        self.model_ms = 0.0
        self.last_error = ""
        self._window = (time.monotonic(), dict(self.values))
        self._latency_sum = 0.0
        self._latency_count = 0

    def add(self, name: str, count: int = 1) -> None:
        with self._lock:
            self.values[name] += count

    def error(self, text: str) -> None:
        with self._lock:
            self.last_error = text

    def frame_done(self, latency_ms: float, model_ms: float) -> None:
        with self._lock:
            self.values["processed"] += 1
            self.latency_ms, self.model_ms = latency_ms, model_ms
            self._latency_sum += latency_ms
            self._latency_count += 1

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self.values)

    def rates(self) -> tuple[dict, float]:
        """Per-second rates since the previous call, and the mean latency over that window."""
        with self._lock:
            now, counts = time.monotonic(), dict(self.values)
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


def diagnostic_array(stamp, name: str, hardware_id: str, counters: Counters, state_text: str,
                     cache, device: str, extra: dict | None = None) -> DiagnosticArray:
    rates, mean_latency = counters.rates()
    values = counters.snapshot()
    rss, cuda = memory_bytes(device)
    level = DiagnosticStatus.OK
    message = state_text
    if counters.last_error:
        level = DiagnosticStatus.WARN
        message = f"{state_text}; last error: {counters.last_error}"
    pairs = {
        "state": state_text,
        "input_rate_hz": f"{rates['received']:.2f}",
        "processed_rate_hz": f"{rates['processed']:.2f}",
        "dropped_rate_hz": f"{rates['dropped']:.2f}",
        "latency_ms_mean": f"{mean_latency:.1f}",
        "latency_ms_last": f"{counters.latency_ms:.1f}",
        "model_ms_last": f"{counters.model_ms:.1f}",
        "cache_keyframes": str(cache.keyframes),
        "cache_pages": str(cache.pages),
        "cache_bytes": str(cache.bytes),
        "process_peak_rss_bytes": str(rss),
        "cuda_allocated_bytes": str(cuda),
        **{f"frames_{k}": str(v) for k, v in values.items()},
        "last_error": counters.last_error,
        **(extra or {}),
    }
    status = DiagnosticStatus(level=level, name=name, message=message, hardware_id=hardware_id,
                              values=[KeyValue(key=k, value=str(v)) for k, v in pairs.items()])
    array = DiagnosticArray()
    array.header.stamp = stamp
    array.status = [status]
    return array
