"""A frame whose model step is queued on the device but not placed yet (``Mapper.process_queued``).

Placing a frame (its pose to the host, the window's warp, keyframe points into the map) is host
work that leaves the device idle. When the next frame is already waiting, the Mapper queues that
frame's step first and places the earlier frame while the device runs it: the device then runs
the steps back to back, and the host's share of a frame hides behind the next frame's step.

On CUDA the earlier frame is placed on a stream of its own (``PlacingStream``): on the stream of
the steps, its first copy to the host would wait for the step queued behind it.
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch

from .records import StepOutcome
from .windows.live import Pending


@dataclasses.dataclass
class Flight:
    outcome: StepOutcome           # the frame's own outcome: its placing adds to it
    pending: Pending
    results: list                  # the session's results (device tensors, still being computed)
    decision: str                  # the keyframe policy's (keyframes.py)
    began: torch.cuda.Event | None  # recorded before its step, ``done`` after (None off CUDA)
    done: torch.cuda.Event | None
    host_ms: float                 # the step call's time on the host (off CUDA: the whole step)

    @property
    def finished(self) -> bool:
        """Whether the device has finished its step (never blocks)."""
        return self.done is None or self.done.query()

    @property
    def model_ms(self) -> float:
        """The step's time: on CUDA the device's, from its start to its end (not the wait behind
        the step before it), once ``done`` has passed."""
        return self.began.elapsed_time(self.done) if self.done is not None else self.host_ms


def device_mark(image: torch.Tensor) -> torch.cuda.Event | None:
    """A timing event behind the work queued so far on ``image``'s device (None off CUDA)."""
    if not image.is_cuda:
        return None
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(image.device))
    return event


class PlacingStream:
    """Where flights are placed on CUDA: a second stream that waits for the flight's own step,
    not for the steps queued after it. When the placing is done, the steps' stream waits for its
    work (later steps and copies read what it made); its tensors are not read by the steps'
    stream before that."""

    def __init__(self):
        self._stream: torch.cuda.Stream | None = None

    @contextlib.contextmanager
    def placing(self, flight: Flight):
        if flight.done is None:
            yield
            return
        steps = torch.cuda.current_stream(flight.pending.image.device)
        if self._stream is None or self._stream.device != steps.device:
            self._stream = torch.cuda.Stream(steps.device)
        self._stream.wait_event(flight.done)
        try:
            with torch.cuda.stream(self._stream):
                yield
        finally:
            steps.wait_stream(self._stream)
