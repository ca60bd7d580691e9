"""`FrameGraph`: the device work of one phase-2 frame step, captured once as CUDA graphs.

Eager, one frame launches a few thousand kernels and the host cannot keep up with the GPU. The
step's shapes are fixed once phase 1 is over (one frame of P tokens); what changes from frame to
frame is data the graphs read from fixed addresses: the image, the 3D-RoPE time index, the KV
cache's index tensors and FlashInfer's plan (both re-planned on the host before every replay),
and the camera cache's write row and visible length.

The step is two graphs: the patch embedding, which reads no cache, and the rest. The caller
launches the first, does the caches' bookkeeping and FlashInfer's plan on the host while the
device runs it, then launches the second (released model on the H200: the host's ~1.4 ms now
hide behind the embedding's kernels, and the frame took ~0.9 ms less). The second is captured
again only when one of the buffers it reads is reallocated, which the caller reports through
`key` (the global cache's pool or special stream grew, the camera cache doubled; a session reset
reallocates nothing); the first never is.
"""
from __future__ import annotations

import logging
import time
import weakref
from typing import Callable

import torch

log = logging.getLogger(__name__)

# embed(images [1, 3, H, W]) -> patch tokens
EmbedFn = Callable[[torch.Tensor], torch.Tensor]
# rest(patch tokens, time_index float64 [1]) -> output tensors
RestFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]


class FrameGraph:
    def __init__(self, embed: EmbedFn, rest: RestFn, image_shape: tuple[int, int, int, int],
                 device: torch.device):
        # Bound methods of the session that owns this graph: held weakly, so that dropping the
        # session frees its GPU memory at once instead of at the next cycle collection.
        self._embed_ref = weakref.WeakMethod(embed)
        self._rest_ref = weakref.WeakMethod(rest)
        self._image = torch.zeros(image_shape, device=device)
        self._time_index = torch.zeros(1, dtype=torch.float64, device=device)
        self._embed_graph: torch.cuda.CUDAGraph | None = None
        self._patches: torch.Tensor | None = None
        self._graph: torch.cuda.CUDAGraph | None = None
        self._outputs: tuple[torch.Tensor, ...] = ()
        self._key = None
        self.captures = 0
        self.capture_seconds = 0.0

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Launch the patch embedding of images [1, 3, H, W]. Returns its output buffer, which
        the next call rewrites (for an eager rest of the step when `run` does not apply)."""
        self._image.copy_(images)
        if self._embed_graph is None:
            self._embed_graph, self._patches = self._capture(lambda: self._embed_ref()(self._image))
        self._embed_graph.replay()
        return self._patches

    def run(self, time_index: int, key) -> tuple[torch.Tensor, ...]:
        """The rest of the step, after `embed` and the caches' begin_step -> fresh copies of the
        outputs."""
        self._time_index.fill_(time_index)
        if self._graph is None or key != self._key:
            self._key = None   # a capture that raises (e.g. out of memory) leaves no stale graph
            self._graph, self._outputs = None, ()   # the old graph's private memory pool is freed
            self._graph, self._outputs = self._capture(
                lambda: self._rest_ref()(self._patches, self._time_index))
            self._key = key
        self._graph.replay()
        # The graph overwrites its outputs at the next replay; results must outlive that.
        return tuple(t.clone() for t in self._outputs)

    def _capture(self, fn):
        start = time.perf_counter()
        # One eager run first, on a side stream as capture requires: it initialises lazily
        # created kernels and handles. It computes this very frame, so every cache write it
        # makes is rewritten with the same values by the replay that follows.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads of the process (the ROS executor) may allocate meanwhile.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            outputs = fn()
        self.captures += 1
        seconds = time.perf_counter() - start
        self.capture_seconds += seconds
        log.info("captured a frame-step CUDA graph in %.2f s (capture %d)", seconds, self.captures)
        return graph, outputs
