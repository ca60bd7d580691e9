"""MultiStreamSession: several camera streams through one model, one batched step per call.

Each stream is a `StreamingSession` of its own (phase-1 buffer, counters, keyframe rule, camera
head cache, RoPE time index, rollback, reset, flush), except that its global KV cache is one
stream of a `MultiStreamKVCache`: all streams' pages live in one pool per layer. A call to
`step` with one frame for some of the streams runs the frames of the streams past phase 1 as ONE
model call: the patch embedding, the frame blocks and every GEMM over all their tokens, the
global layers through one page table and one attention plan with one request per stream (each
request sees only its stream's anchors, window and special stream), the camera head with each
token attending its own stream's camera cache, the depth head over all frames. A stream with no
frame in the call is not in the batch and nothing of it changes.

What runs per stream: phase 1 (a stream's first `num_scale_frames` frames are buffered and run
as that stream's own multi-frame call, as a single session does), and the verbs between steps
(`reset`, `rollback_last_frame`, `flush`, `close_scale_phase`). A window switch of the mapping
layer is a stream's reset followed by its frames again, so it is per stream too.

The outputs equal those of separate `StreamingSession`s fed the same frames (up to float
rounding of differently shaped matmuls). All streams share one image size (one page size); the
first frame fixes it, and it can change only while every stream is empty.

On CUDA the steps run eagerly (no captured CUDA graph, unlike a single session's phase-2 steps:
`cuda_graphs` is not used here), with the fused block kernels compiled once per stream count.
FlashInfer plans a batch of several streams as one request per stream, without the single
session's KV split (N streams already give FlashInfer N times the work items); a step with one
stream's frame is that stream's single-stream step (split attention included).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Optional, Sequence

import torch

from ..cache import BatchPart, CacheSpec, MultiStreamKVCache, StreamCacheView
from ..model.camera_cache import CameraCacheBatch
from ..model.lingbot_map import LingBotMap
from .frame_compute import FrameCompute, frame_outputs
from .results import FrameResult
from .session import CacheUsage, FrameError, SessionStats, StreamingSession, attend_paged
from .settings import SettingsError, StreamSettings

# More streams than this in one pool is a configuration error, not a rig.
MAX_STREAMS = 64


@dataclass(frozen=True)
class StreamFrame:
    """One stream's frame for a step: image [3, H, W] in [0, 1]; keyframe as in
    `StreamingSession.step` (None: the stream's interval rule)."""

    stream: int
    image: torch.Tensor
    keyframe: Optional[bool] = None


class _SharedPool:
    """The streams' one pool, made at the first stream's first model call (the image size gives
    the spec). The streams' cache factories hold this, not the session: no reference cycle, so
    a dropped session frees its GPU memory at once."""

    def __init__(self, num_streams: int, backend: str):
        self.num_streams, self.backend = num_streams, backend
        self.pool: Optional[MultiStreamKVCache] = None

    def stream_cache(self, stream: int, spec: CacheSpec) -> StreamCacheView:
        """The cache factory of stream `stream`'s session."""
        if self.pool is None:
            self.pool = MultiStreamKVCache(spec, self.num_streams, backend=self.backend)
        assert self.pool.spec == spec, "streams of one pool with different specs"
        return self.pool.stream(stream)


class MultiStreamSession:
    def __init__(self, model: LingBotMap, num_streams: int, settings: Optional[StreamSettings] = None):
        if not isinstance(num_streams, int) or isinstance(num_streams, bool) or not 1 <= num_streams <= MAX_STREAMS:
            raise SettingsError(f"num_streams must be an int in [1, {MAX_STREAMS}], got {num_streams!r}")
        self.model = model
        self.settings = settings or StreamSettings()
        self.num_streams = num_streams
        self._pool = _SharedPool(num_streams, self.settings.attention_backend)
        self._image_hw: Optional[tuple[int, int]] = None
        member = dataclasses.replace(self.settings, cuda_graphs=False)   # see the module docstring
        self._compute = FrameCompute(model, member)   # the batched steps' device work
        self._sessions = [StreamingSession(model, member, cache_factory=partial(self._pool.stream_cache, s))
                          for s in range(num_streams)]

    # ---- public verbs --------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, frames: Sequence[StreamFrame]) -> dict[int, list[FrameResult]]:
        """One frame for each of some streams (each at most once) -> each listed stream's
        results ([] while it buffers phase 1). Every frame is checked before any is run: a bad
        one raises FrameError naming its stream and no stream changes."""
        streams = [f.stream for f in frames]
        for s in streams:
            self._check_stream(s)
        if len(set(streams)) != len(streams):
            raise FrameError(f"a step takes at most one frame per stream, got streams {streams}")
        checked = [StreamFrame(f.stream, self._check_frame(f), f.keyframe) for f in frames]
        results: dict[int, list[FrameResult]] = {}
        batch = []
        for frame in checked:
            session = self._sessions[frame.stream]
            if session.scale_phase_done:
                batch.append(frame)
            else:
                results[frame.stream] = session.step(frame.image, frame.keyframe)   # phase 1: per stream
        if len(batch) == 1:
            # One stream: the single-stream step itself (through its stream of the pool), which
            # on CUDA also splits the attention's pages to fill the GPU.
            frame = batch[0]
            results[frame.stream] = self._sessions[frame.stream].step(frame.image, frame.keyframe)
        elif batch:
            results.update(self._run_batch(batch))
        return {s: results[s] for s in streams}

    def close_scale_phase(self, stream: int) -> list[FrameResult]:
        """`StreamingSession.close_scale_phase` of one stream."""
        return self._session(stream).close_scale_phase()

    def rollback_last_frame(self, stream: int) -> None:
        """`StreamingSession.rollback_last_frame` of one stream; the others are untouched."""
        self._session(stream).rollback_last_frame()

    def rollback_refusal(self, stream: int) -> str:
        """`StreamingSession.rollback_refusal` of one stream."""
        return self._session(stream).rollback_refusal()

    def flush(self, stream: int) -> None:
        self._session(stream).flush()

    def reset(self, stream: int) -> None:
        """A new stream in this slot (`StreamingSession.reset`): its pages are emptied and
        zeroed, the other streams are untouched."""
        self._session(stream).reset()

    def time_index(self, stream: int) -> int:
        return self._session(stream).time_index

    def stream_stats(self, stream: int) -> SessionStats:
        """`StreamingSession.stats` of one stream."""
        return self._session(stream).stats()

    def usage(self, stream: int) -> CacheUsage:
        """`StreamingSession.usage` of one stream (its pages of the shared pool, its camera cache)."""
        return self._session(stream).usage()

    # ---- internals -------------------------------------------------------------------------------

    def _check_stream(self, stream) -> None:
        if not isinstance(stream, int) or isinstance(stream, bool) or not 0 <= stream < self.num_streams:
            raise FrameError(f"stream must be an int in [0, {self.num_streams}), got {stream!r}")

    def _session(self, stream: int) -> StreamingSession:
        self._check_stream(stream)
        return self._sessions[stream]

    def _check_frame(self, frame: StreamFrame) -> torch.Tensor:
        session = self._sessions[frame.stream]
        image = frame.image
        if isinstance(image, torch.Tensor) and image.dim() >= 2:
            hw = tuple(image.shape[-2:])
            if self._image_hw is not None and hw != self._image_hw:
                if any(s.holds_frames for s in self._sessions):
                    raise FrameError(
                        f"stream {frame.stream}: frame size {hw[1]}x{hw[0]} differs from the streams' "
                        f"{self._image_hw[1]}x{self._image_hw[0]}: the streams of one session share "
                        "one image size (one page pool); reset every stream to change it")
                self._drop_pool()
        try:
            image = session.check_frame(image)
        except FrameError as error:
            raise FrameError(f"stream {frame.stream}: {error}") from None
        self._image_hw = tuple(image.shape[-2:])
        return image

    def _drop_pool(self) -> None:
        """Every stream is empty and the image size changes: a new pool at the next frame."""
        self._pool.pool = None
        for session in self._sessions:
            session.drop_global_cache()

    def _run_batch(self, batch: list[StreamFrame]) -> dict[int, list[FrameResult]]:
        """Checked phase-2 frames of several streams, one model call. Each stream's session
        applies its own rules to its part (see StreamingSession's batched-step methods)."""
        sessions = [self._sessions[f.stream] for f in batch]
        shared = self._pool.pool
        images = torch.stack([f.image for f in batch])                        # [N, 3, H, W]
        # Reads no cache: launched first, it keeps the device busy during the host's planning.
        patches = self._compute.embed(images, frame_steps=True)
        stores = [session.prepare_batched_frame(f.keyframe, partial(shared.prepare, f.stream))
                  for f, session in zip(batch, sessions)]
        shared.begin_batch([BatchPart(f.stream, store) for f, store in zip(batch, stores)])
        for session, store in zip(sessions, stores):
            session.begin_batched_frame(store)
        # A non-keyframe shares its time index with the next keyframe (spec 8.2).
        time_index = torch.tensor([session.time_index for session in sessions], dtype=torch.float64,
                                  device=self.model.device)
        outputs = self._compute.forward(patches, self._image_hw, time_index, False, 1,
                                        partial(attend_paged, shared),
                                        CameraCacheBatch([session.camera_cache for session in sessions]),
                                        frame_steps=True)
        return {f.stream: session.batched_frame_results(f.image, store, frame_outputs(outputs, i))
                for i, (f, session, store) in enumerate(zip(batch, sessions, stores))}
