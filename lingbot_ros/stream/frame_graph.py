"""`FrameGraph`: the device work of one phase-2 frame step, captured once as a CUDA graph.

Eager, one frame launches a few thousand kernels and the host cannot keep up with the GPU. The
step's shapes are fixed once phase 1 is over (one frame of P tokens); what changes from frame to
frame is data the graph reads from fixed addresses: the image, the 3D-RoPE time index, the KV
cache's index tensors and FlashInfer's plan (both re-planned on the host before every replay),
and the camera cache's write row and visible length. The graph is captured again only when one
of those buffers is reallocated, which the caller reports through `key` (the global cache's pool
or special stream grew, the camera cache doubled).
"""
from __future__ import annotations

import logging
import time
import weakref
from typing import Callable

import torch

log = logging.getLogger(__name__)

# forward(images [1, 3, H, W], time_index float64 [1]) -> output tensors
ForwardFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]


class FrameGraph:
    def __init__(self, forward: ForwardFn, image_shape: tuple[int, int, int, int], device: torch.device):
        # A bound method of the session that owns this graph: held weakly, so that dropping the
        # session frees its GPU memory at once instead of at the next cycle collection.
        self._forward_ref = weakref.WeakMethod(forward)
        self._image = torch.zeros(image_shape, device=device)
        self._time_index = torch.zeros(1, dtype=torch.float64, device=device)
        self._graph: torch.cuda.CUDAGraph | None = None
        self._outputs: tuple[torch.Tensor, ...] = ()
        self._key = None
        self.captures = 0
        self.capture_seconds = 0.0

    def run(self, images: torch.Tensor, time_index: int, key) -> tuple[torch.Tensor, ...]:
        """One frame step (the caches' begin_step already done) -> fresh copies of the outputs."""
        self._image.copy_(images)
        self._time_index.fill_(time_index)
        if self._graph is None or key != self._key:
            self._key = None   # a capture that raises (e.g. out of memory) leaves no stale graph
            self._capture()
            self._key = key
        self._graph.replay()
        # The graph overwrites its outputs at the next replay; results must outlive that.
        return tuple(t.clone() for t in self._outputs)

    def _capture(self) -> None:
        start = time.perf_counter()
        self._graph, self._outputs = None, ()   # the old graph's private memory pool is freed
        # One eager run first, on a side stream as capture requires: it initialises lazily
        # created kernels and handles. It computes this very frame, so every cache write it
        # makes is rewritten with the same values by the replay that follows.
        forward = self._forward_ref()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward(self._image, self._time_index)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads of the process (the ROS executor) may allocate meanwhile.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            outputs = forward(self._image, self._time_index)
        self._graph, self._outputs = graph, outputs
        self.captures += 1
        seconds = time.perf_counter() - start
        self.capture_seconds += seconds
        log.info("captured the frame-step CUDA graph in %.2f s (capture %d)", seconds, self.captures)
