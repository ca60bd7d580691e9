"""The node's input counters (callbacks and worker add to them) and the process's memory."""
from __future__ import annotations

import resource
import threading
import time


class Counters:
    """Cumulative input counts since configure (what the Mapper never sees: received, dropped
    before the worker, rejected by the decoder), the latency of the frames done, and when the
    newest image arrived. Increments come from several threads, hence the lock."""

    # Side inputs: odometry and TF messages received and refused at the boundary (input_checks).
    FIELDS = ("received", "dropped", "rejected", "camera_info_rejected", "odometry_received",
              "odometry_rejected", "tf_rejected", "callback_errors")

    def __init__(self, clock=time.monotonic):
        self._lock = threading.Lock()
        self._clock = clock
        self.values = dict.fromkeys(self.FIELDS, 0)
        self.latency_ms = 0.0
        self.last_error = ""
        self.last_refusal = {}   # counter -> the text of its newest refusal (images, camera_info, odometry, tf)
        self.last_received_s: float | None = None   # clock() at the newest image
        self._latency_ms_total = 0.0
        self._latency_frames = 0

    def add(self, name: str, count: int = 1) -> None:
        with self._lock:
            self.values[name] += count
            if name == "received":
                self.last_received_s = self._clock()

    def error(self, text: str, refusal_of: str = "") -> None:
        """The newest error; ``refusal_of``: the counter whose newest refusal it is (counted elsewhere)."""
        with self._lock:
            self.last_error = text
            if refusal_of:
                self.last_refusal[refusal_of] = text

    def refused(self, counter: str, text: str) -> None:
        """One more message of an input refused at the boundary, and why."""
        with self._lock:
            self.values[counter] += 1
            self.last_error = text
            self.last_refusal[counter] = text

    def frame_done(self, latency_ms: float) -> None:
        with self._lock:
            self.latency_ms = latency_ms
            self._latency_ms_total += latency_ms
            self._latency_frames += 1

    def snapshot(self) -> dict:
        """The counts, plus ``latency_ms_total`` and ``latency_frames`` (frames done), all
        cumulative: a window's mean latency is the ratio of their differences."""
        with self._lock:
            return {**self.values, "latency_ms_total": self._latency_ms_total,
                    "latency_frames": self._latency_frames}


class Fanout:
    """Counts into several Counters at once (a rig camera's inputs: the camera's and the node's)."""

    def __init__(self, *counters: Counters):
        self._all = counters

    def add(self, name: str, count: int = 1) -> None:
        for counters in self._all:
            counters.add(name, count)

    def refused(self, counter: str, text: str) -> None:
        for counters in self._all:
            counters.refused(counter, text)


def memory_bytes(device: str) -> tuple[int, int]:
    """(process peak RSS bytes, CUDA bytes allocated or 0)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    cuda = 0
    if device.startswith("cuda"):
        import torch

        cuda = int(torch.cuda.memory_allocated(device))
    return rss, cuda
