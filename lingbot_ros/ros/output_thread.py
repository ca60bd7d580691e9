"""The images' publisher thread: depth, confidence and point messages are built beside the frame
loop, not on it.

The worker publishes a frame's poses and TF at once (host values), queues device-to-host copies
of the image-sized outputs that someone subscribes to (non-blocking, behind the frame's own
device work, with an event), and hands the frame over here; this thread waits for that event
only, builds the messages and publishes them while the worker already runs the next frame.
"""
from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Callable

import torch

# Frames waiting here at most: past it the oldest waiting frame's images are skipped (a
# subscriber slower than the camera gets the newest images, and the frame loop never waits).
MAX_WAITING = 2


def to_host(output, fields: tuple[str, ...]):
    """``output`` with its result's ``fields`` copied to the host, asynchronously on CUDA (pinned
    memory, behind the work that made them), and the event that marks the copies' end (None
    when nothing runs on a device)."""
    result = output.result
    host = {name: getattr(result, name).to("cpu", non_blocking=True) for name in fields}
    event = None
    if result.depth.is_cuda:
        event = torch.cuda.Event()
        event.record()
    return dataclasses.replace(output, result=dataclasses.replace(result, **host)), event


class OutputThread:
    """Runs queued publication jobs in order on one daemon thread; never blocks the submitter."""

    def __init__(self, on_error: Callable[[BaseException], None], name: str = "lingbot_outputs"):
        self._jobs: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._stop = False
        self._on_error = on_error
        self.skipped = 0   # frames whose images were skipped because the thread fell behind
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        with self._cond:
            if self._stop:
                return
            if len(self._jobs) >= MAX_WAITING:
                self._jobs.popleft()
                self.skipped += 1
            self._jobs.append(job)
            self._cond.notify()

    def stop(self, timeout: float = 10.0) -> bool:
        """Finish the jobs queued so far, then end; True if the thread ended in time."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._stop:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self._jobs.popleft()
            try:
                job()
            except BaseException as error:   # one bad message must not end the thread
                self._on_error(error)
