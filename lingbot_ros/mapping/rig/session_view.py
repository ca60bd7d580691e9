"""One stream of a rig's MultiStreamSession, as a Mapper's session.

The verbs the Mapper and run_warmup call on ``bundle.session`` (step, close_scale_phase,
rollback_refusal, rollback_last_frame, flush, reset, usage), each on this view's stream only;
``step`` goes through the rig's baton, which batches it with the other cameras' steps of the round.
"""
from __future__ import annotations

from typing import Optional

import torch

from ...stream import FrameResult, StreamFrame
from ...stream.session import CacheUsage, SessionStats
from .baton import Baton


class StreamView:
    def __init__(self, baton: Baton, stream: int):
        self.stream = stream
        self._baton = baton
        self._session = baton.session

    def step(self, image: torch.Tensor, keyframe: Optional[bool] = None) -> list[FrameResult]:
        return self._baton.step(StreamFrame(self.stream, image, keyframe))

    def close_scale_phase(self) -> list[FrameResult]:
        return self._session.close_scale_phase(self.stream)

    def rollback_refusal(self) -> str:
        return self._session.rollback_refusal(self.stream)

    def rollback_last_frame(self) -> None:
        self._session.rollback_last_frame(self.stream)

    def flush(self) -> None:
        self._session.flush(self.stream)

    def reset(self) -> None:
        self._session.reset(self.stream)

    def usage(self) -> CacheUsage:
        return self._session.usage(self.stream)

    def stats(self) -> SessionStats:
        return self._session.stream_stats(self.stream)

    @property
    def time_index(self) -> int:
        return self._session.time_index(self.stream)
