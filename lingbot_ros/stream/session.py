"""StreamingSession (spec 13): phase-1 scale batch, then one frame per call, through the caches.

The session owns all state of a stream: the paged global KV cache (lingbot_ros.cache), the camera
head's caches, the 3D-RoPE time index and the frame counters. The model itself stays stateless.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Optional, Union

import torch

from ..cache import (CacheExhausted, CacheSpec, CacheStats, NothingToRollback, PagedKVCache, PartialAttention,
                     StreamCacheView)
from ..model.lingbot_map import LingBotMap
from .frame_compute import FrameCompute, SlicedCall, StepOutputs
from .frame_graph import FrameGraph
from .results import FrameResult
from .settings import StreamSettings

log = logging.getLogger(__name__)

# Initial camera-cache capacity (frames) under CUDA graphs: each doubling makes the captured frame
# step stale, and its recapture costs one frame ~0.1 s on the H200. From 256 (released model, 4
# iterations: 67 MB) the first doubling comes at frame 256 instead of 64 (then 512, 1024, ...).
GRAPH_CAMERA_CAPACITY = 256

# The global cache of one stream: a cache of its own, or one stream of a shared pool.
GlobalCache = Union[PagedKVCache, StreamCacheView]
# Makes a session's global cache once the image size (so the spec) is known.
CacheFactory = Callable[[CacheSpec], GlobalCache]


# Phase-1 frames were computed together: none of them can be undone alone.
NOTHING_STORED = "no stored phase-2 frame to roll back (phase-1 frames need a reset)"


class FrameError(ValueError):
    """A frame the session cannot take (wrong layout, size not a multiple of the patch, size change)."""


@dataclasses.dataclass(frozen=True)
class CacheUsage:
    """What the session's caches hold now (the Mapper's status and its long-run caps read it)."""

    frames_stored: int      # frames appended since the last reset (the 3D-RoPE index)
    pages: int              # KV pages in use: anchor, window, pending evictions, special
    bytes_allocated: int    # KV and camera cache memory allocated
    bytes_in_use: int       # of it, in use (a reset keeps the buffers)


@dataclasses.dataclass(frozen=True)
class SessionStats:
    """Everything the session counts, for diagnostics, benchmarks and tests (``stats``)."""

    frames_seen: int                 # frames with results since the last reset
    frames_stored: int               # frames appended to the caches (the 3D-RoPE index)
    frames_buffered: int             # phase-1 frames waiting for the scale batch
    camera_cache_frames: int
    camera_cache_bytes: int          # allocated
    camera_cache_bytes_in_use: int   # the stored frames' rows
    kv_cache: Optional[CacheStats]   # None until the first step allocates the global cache
    graph_captures: int              # CUDA graphs captured (0 without them)
    graph_capture_seconds: float


class StreamingSession:
    def __init__(self, model: LingBotMap, settings: Optional[StreamSettings] = None,
                 cache_factory: Optional[CacheFactory] = None):
        """cache_factory: where the global cache comes from (default: a `PagedKVCache` of its
        own); `MultiStreamSession` hands each of its streams one stream of a shared pool."""
        self.model = model
        # Not a bound method of this session when none is given: a reference cycle would keep a
        # dropped session's GPU memory until the next cycle collection (as in frame_graph.py).
        self._cache_factory = cache_factory
        self.settings = settings or StreamSettings()
        self.config = model.config
        self.device = model.device
        self._compute = FrameCompute(model, self.settings)   # the device work of every call
        self.compute_dtype = self._compute.dtype
        use_graphs = self.settings.cuda_graphs and self.device.type == "cuda"
        self._camera = model.camera_head.new_cache(
            self.settings.camera_num_iterations, self.device,
            capacity=GRAPH_CAMERA_CAPACITY if use_graphs else 64, static=use_graphs)
        self._cache: Optional[GlobalCache] = None
        self._graph: Optional[FrameGraph] = None   # phase-2 frame step, built with the cache
        self._image_hw: Optional[tuple[int, int]] = None
        # Phase 1 in slices of this many layer pairs, each run by advance_scale_phase() (0: at
        # once, in the step that completes the batch). Settable between streams.
        self.scale_phase_layers = 0
        self.reset()

    # ---- public verbs --------------------------------------------------------------------------

    def step(self, image: torch.Tensor, keyframe: Optional[bool] = None) -> list[FrameResult]:
        """image [3, H, W] in [0, 1] on the model's device -> results ([] while buffering phase 1).

        keyframe: None applies the interval rule; True/False overrides it in phase 2 (a motion
        policy). Phase-1 frames are always stored.
        """
        image = self.check_frame(image)
        if self._sliced is not None:
            raise RuntimeError("phase 1 is running in slices: call advance_scale_phase() until it returns its results")
        if not self._phase1_done:
            self._buffer.append(image)
            if len(self._buffer) < self.settings.num_scale_frames:
                return []
            if self.scale_phase_layers:
                self._begin_sliced_scale_phase()
                return []
            return self.close_scale_phase()
        return self._run(image[None], store=self._keyframe(keyframe), first_frame=False, scale_slot=1)

    def _keyframe(self, keyframe: Optional[bool]) -> bool:
        """Whether the next phase-2 frame is stored: the override, else the interval rule."""
        if keyframe is None:
            K = self.settings.keyframe_interval
            keyframe = K <= 1 or (self._frames_seen - self._phase1_frames) % K == 0
        return bool(keyframe)

    @property
    def scale_phase_running(self) -> bool:
        """Whether phase 1 runs in slices now (``scale_phase_layers``): advance_scale_phase() next."""
        return self._sliced is not None

    def advance_scale_phase(self) -> list[FrameResult]:
        """The next slice of phase 1 (``scale_phase_layers`` layer pairs, or the heads at the end):
        [] until the last, which returns the batch's results, equal to those of phase 1 at once."""
        images, call = self._sliced
        outputs = self._compute.advance(call, self.scale_phase_layers)
        if outputs is None:
            return []
        self._sliced = None
        results = self._results(images, True, outputs)
        self._phase1_done, self._phase1_frames = True, len(results)
        return results

    def close_scale_phase(self) -> list[FrameResult]:
        """Run the buffered frames as the phase-1 batch now (a stream shorter than num_scale_frames;
        phase 1 running in slices runs its remaining slices)."""
        if self._sliced is not None:
            results = []
            while not results:
                results = self.advance_scale_phase()
            return results
        if self._phase1_done or not self._buffer:
            return []
        images = torch.stack(self._buffer)                                    # [n, 3, H, W]
        self._buffer.clear()
        results = self._run(images, store=True, first_frame=True, scale_slot=0)
        self._phase1_done, self._phase1_frames = True, len(results)
        return results

    def rollback_last_frame(self) -> None:
        """Undo the newest stored phase-2 frame everywhere (or drop the newest buffered frame).

        The next frame then gives the outputs it would have given had the rolled-back frame never
        arrived (exactly so with defer_evictions on; without deferral, evictions the frame caused
        are final). The frame counter steps back too, so frame numbers and the keyframe-interval
        rule continue as if the frame never came. Phase-1 frames cannot be rolled back: their
        outputs were computed together; reset() instead.
        """
        why = self.rollback_refusal()
        if why:
            raise NothingToRollback(why)
        if self._buffer:
            self._buffer.pop()
            return
        self._cache.rollback_last_frame()
        self._camera.rollback_last_frame()
        self._stored -= 1
        self._frames_seen -= 1

    def rollback_refusal(self) -> str:
        """Why `rollback_last_frame` would refuse, '' if it would undo a frame (a buffered one, or a
        stored phase-2 one). The one statement of the rule: the mapping layer asks it first."""
        if self._buffer or self._stored > self._phase1_frames:
            return ""
        return NOTHING_STORED

    def flush(self) -> None:
        """Recycle the pages of evictions deferred so far (makes them final for rollback). Phase 1
        running in slices defers nothing (and its cache is mid-step)."""
        if self._cache is not None and self._sliced is None:
            self._cache.flush()

    def reset(self) -> None:
        """Start a new stream: empty caches, time index 0, next frame is the first of phase 1.

        Cheap and bounded: every buffer stays (KV pools with their special pages, the camera
        cache's capacity, the captured CUDA graphs), nothing is allocated. A new stream of the
        same image size replays the same graphs and grows a buffer only where it outgrows every
        earlier stream; another image size builds a new global cache (and graph) at its first
        frame. Outputs equal a fresh session's.
        """
        if self._cache is not None:
            self._cache.reset()
        self._camera.reset()
        self._buffer: list[torch.Tensor] = []
        self._sliced: Optional[tuple[torch.Tensor, SlicedCall]] = None   # phase 1 in slices: images, call
        self._phase1_done = False
        self._phase1_frames = 0
        self._frames_seen = 0      # frames with results since reset
        self._stored = 0           # frames appended to the caches = next 3D-RoPE time index
        self._warned_rope_range = False

    def take_over(self, other: "StreamingSession") -> None:
        """Continue ``other``'s stream (a session of the same model and settings, past phase 1,
        whose cache has evicted nothing): its cached frames, camera cache and counters are copied
        into this session's buffers, which must hold no frames (reset() first). The next frames
        then give the outputs ``other`` would give them; ``other`` is left as it was. The
        windowed policy runs the next window's first frames this way, in a small spare session
        ahead of the switch (mapping/windows/ahead.py). ValueError or CacheError, having changed
        nothing, where it cannot."""
        if other.model is not self.model or other.settings != self.settings:
            raise ValueError("take_over needs a session of the same model and settings")
        if self.holds_frames:
            raise ValueError("this session holds frames; reset() before taking another stream over")
        if not other._phase1_done or other._buffer:
            raise ValueError("the other session has not finished phase 1")
        if other._image_hw != self._image_hw:
            self._image_hw = other._image_hw
            self.drop_global_cache()
        self._global_cache().take_over(other._cache)
        self._camera.take_over(other._camera)
        self._phase1_done, self._phase1_frames = True, other._phase1_frames
        self._frames_seen, self._stored = other._frames_seen, other._stored
        self._warned_rope_range = other._warned_rope_range

    def stats(self) -> SessionStats:
        graph = self._graph
        return SessionStats(
            frames_seen=self._frames_seen, frames_stored=self._stored, frames_buffered=len(self._buffer),
            camera_cache_frames=self._camera.length, camera_cache_bytes=self._camera.nbytes(),
            camera_cache_bytes_in_use=self._camera.nbytes_in_use(),
            kv_cache=self._cache.stats() if self._cache is not None else None,
            graph_captures=graph.captures if graph is not None else 0,
            graph_capture_seconds=graph.capture_seconds if graph is not None else 0.0)

    def usage(self) -> CacheUsage:
        kv = self._cache.stats() if self._cache is not None else None   # None until the first step allocates
        pages = 0 if kv is None else kv.anchor_pages + kv.window_pages + kv.pending_pages + kv.special_pages_in_use
        return CacheUsage(self._stored, pages, (0 if kv is None else kv.bytes_allocated) + self._camera.nbytes(),
                          (0 if kv is None else kv.bytes_in_use) + self._camera.nbytes_in_use())

    @property
    def global_cache(self):
        """The global layers' paged KV cache (None before the first frame): read it, e.g. to time its steps."""
        return self._cache

    @property
    def camera_cache(self):
        """The camera head's cache."""
        return self._camera

    @property
    def time_index(self) -> int:
        """3D-RoPE index the next frame gets: number of frames appended since reset (spec 8.2)."""
        return self._stored

    @property
    def scale_phase_done(self) -> bool:
        """Whether phase 1 is over: the next frame is a single-frame step."""
        return self._phase1_done

    @property
    def holds_frames(self) -> bool:
        """Whether the stream holds frames (run or buffered): its image size is fixed until reset()."""
        return self._phase1_done or bool(self._buffer) or self._sliced is not None

    def check_frame(self, image: torch.Tensor) -> torch.Tensor:
        """The image as `step` takes it ([3, H, W] float32 on the model's device), or FrameError
        saying what is wrong. `step` runs it first; a batch of streams checks every frame before
        running any. A new image size is taken only while the stream holds no frames (its
        global cache is made again at the next model call)."""
        if not isinstance(image, torch.Tensor):
            raise FrameError(f"expected a torch.Tensor [3, H, W], got {type(image).__name__}; "
                             "Preprocessor turns camera images into one")
        if image.dim() == 4 and image.shape[0] == 1:
            image = image[0]
        if image.dim() != 3 or image.shape[0] != 3:
            raise FrameError(f"expected a [3, H, W] image, got shape {tuple(image.shape)}")
        H, W = image.shape[1:]
        p = self.config.patch_size
        if H % p or W % p:
            raise FrameError(f"image size {W}x{H} is not a multiple of the patch size {p}; use Preprocessor")
        if self._image_hw is not None and (H, W) != self._image_hw and self.holds_frames:
            raise FrameError(f"frame size {W}x{H} differs from this stream's {self._image_hw[1]}x"
                             f"{self._image_hw[0]}; reset() before changing size")
        if (H, W) != self._image_hw:
            self._image_hw = (H, W)
            self.drop_global_cache()             # tokens per frame changed: new pages at the next run
        return image.to(self.device, torch.float32)

    def drop_global_cache(self) -> None:
        """Forget the global cache while the stream holds no frames: the next model call makes
        one (through cache_factory). `MultiStreamSession` does so when its streams move to a new
        image size, which takes a new shared pool."""
        self._cache = None

    # ---- one stream's part of a batched step (MultiStreamSession) ------------------------------
    # Several sessions' phase-2 frames run as one model call (FrameCompute) through one shared page
    # pool; each session keeps its rules (keyframes, deferral budget, RoPE range, counters). Per
    # frame, after `check_frame`: `prepare_batched_frame` before the pool's begin_batch,
    # `begin_batched_frame` after it, `batched_frame_results` with the frame's part of the outputs.

    def prepare_batched_frame(self, keyframe: Optional[bool], check: Callable[[bool], None]) -> bool:
        """Whether the frame is stored (keyframe as in `step`), with room made for it. check(store)
        is the shared pool's check of this stream's step, which raises CacheExhausted (changing
        nothing) when the deferral budget is full: then, as in `step`, the oldest deferred
        evictions are made final."""
        if not self._phase1_done:
            raise FrameError("a batched step takes phase-2 frames; this stream is in phase 1 (use step)")
        store = self._keyframe(keyframe)
        self._with_deferral_room(lambda: check(store))
        return store

    def begin_batched_frame(self, store: bool) -> None:
        """After the shared pool's begin_batch: this stream's camera cache step."""
        self._begin_camera_step(1, store)

    def batched_frame_results(self, image: torch.Tensor, store: bool, outputs: StepOutputs) -> list[FrameResult]:
        """The frame's result from its part of the call's outputs (frame_compute.frame_outputs);
        the frame counters move on."""
        return self._results(image[None], store, outputs)

    # ---- internals -------------------------------------------------------------------------------

    def _global_cache(self) -> GlobalCache:
        if self._cache is None:
            H, W = self._image_hw
            cfg, s, p = self.config, self.settings, self.config.patch_size
            spec = CacheSpec(
                num_layers=cfg.depth, num_heads=cfg.num_heads, head_dim=cfg.head_dim,
                tokens_per_frame=cfg.num_special_tokens + (H // p) * (W // p),
                special_tokens=cfg.num_special_tokens, scale_frames=s.scale_frames,
                sliding_window=s.sliding_window, cross_frame_special=s.cross_frame_special,
                include_scale_frames=s.include_scale_frames, camera_only=s.camera_only,
                max_special_tokens=s.max_special_tokens, deferred_capacity=0,
                dtype=self.compute_dtype, device=self.device, kv_dtype=s.kv_storage_dtype(self.device))
            if s.defer_evictions:
                # Pages for deferred evictions only when this session defers: otherwise they
                # would never hold a frame (8 pages = 0.79 GB for the released model at
                # 518x378). At least one step's worth (A + 1 frames without anchors).
                spec = dataclasses.replace(spec, deferred_capacity=max(
                    CacheSpec.deferred_capacity, spec.frames_per_eviction))
            self._cache = (self._cache_factory(spec) if self._cache_factory is not None
                           else PagedKVCache(spec, backend=s.attention_backend))
            self._cache.defer_evictions = s.defer_evictions
            self._graph = (FrameGraph(self._compute.embed, self._forward, (1, 3, H, W), self.device)
                           if self._camera.static and self._cache.supports_graphs else None)
        return self._cache

    def _with_deferral_room(self, attempt: Callable[[], None]) -> None:
        """attempt(): the global cache's begin_step, or a shared pool's check of it. When the
        deferral budget is full, make the oldest deferred evictions final and try again (the
        cache raises before changing any state, so the retry starts clean)."""
        try:
            attempt()
        except CacheExhausted:
            if not self._cache.defer_evictions:
                raise
            log.debug("deferred evictions at capacity; flushing")
            self._cache.flush()
            attempt()

    def _attend_global(self, layer: int, q, k, v):
        return attend_paged(self._cache, layer, q, k, v)

    @torch.no_grad()
    def _run(self, images: torch.Tensor, store: bool, first_frame: bool, scale_slot: int) -> list[FrameResult]:
        F = images.shape[0]
        t0 = self._stored
        cache = self._global_cache()
        # The patch embedding reads no cache: launched first, it keeps the device busy while the
        # host does both caches' begin_step (and FlashInfer's plan) for this frame.
        graph = self._graph if not first_frame else None
        patches = graph.embed(images) if graph is not None else self._compute.embed(images)
        self._with_deferral_room(lambda: cache.begin_step(num_frames=F, store=store))
        self._begin_camera_step(F, store)
        if graph is not None and cache.step_table.static:
            # One graph serves keyframes and non-keyframes alike: they differ only in index data.
            key = (cache.buffers_version, self._camera.generation)
            outputs = graph.run(t0, key)
        else:
            # A non-keyframe shares its time index with the next keyframe (spec 8.2).
            time_index = torch.arange(t0, t0 + F, dtype=torch.float64, device=self.device)
            outputs = self._forward(patches, time_index, first_frame=first_frame, scale_slot=scale_slot)
        return self._results(images, store, outputs)

    def _begin_sliced_scale_phase(self) -> None:
        """Phase 1's batch up to its first slice: the embedding, both caches' step, the first
        layers' inputs (advance_scale_phase runs the rest)."""
        images = torch.stack(self._buffer)
        self._buffer.clear()
        cache, F = self._global_cache(), images.shape[0]
        patches = self._compute.embed(images)
        self._with_deferral_room(lambda: cache.begin_step(num_frames=F, store=True))
        self._begin_camera_step(F, True)
        time_index = torch.arange(0, F, dtype=torch.float64, device=self.device)
        call = self._compute.begin_sliced(patches, self._image_hw, time_index, True, 0, self._attend_global,
                                          self._camera)
        self._sliced = (images, call)

    def _begin_camera_step(self, num_frames: int, store: bool) -> None:
        """The camera cache's begin_step, after the global cache's; warns once past the RoPE range."""
        t0, F = self._stored, num_frames
        self._camera.begin_step(F, store)
        if t0 + F > self.config.max_frame_num and not self._warned_rope_range:
            self._warned_rope_range = True
            log.warning("3D-RoPE time index %d passes the trained range max_frame_num=%d; computing the "
                        "rotations anyway (upstream would stop here)", t0 + F - 1, self.config.max_frame_num)

    def _results(self, images: torch.Tensor, store: bool, outputs: StepOutputs) -> list[FrameResult]:
        """The call's frames' results from its outputs; the frame counters move on."""
        F, _, H, W = images.shape
        t0 = self._stored
        poses, depth, depth_conf, extrinsic, intrinsic, points = outputs
        pose_enc = poses[-1]                                                     # [F, 9]
        results = [FrameResult(index=self._frames_seen + i, is_keyframe=store,
                               time_index=t0 + (i if store else 0), pose_enc=pose_enc[i],
                               pose_enc_list=poses[:, i], extrinsic=extrinsic[i], intrinsic=intrinsic[i],
                               depth=depth[i, ..., 0], depth_conf=depth_conf[i], world_points=points[i],
                               image=images[i], image_size=(W, H))
                   for i in range(F)]
        self._frames_seen += F
        if store:
            self._stored += F
        return results

    def _forward(self, patches: torch.Tensor, time_index: torch.Tensor, first_frame: bool = False,
                 scale_slot: int = 1) -> StepOutputs:
        """The rest of the call's device work (`FrameCompute.forward` through this session's
        caches), after the embedding and both caches' begin_step. patches [F, N, C], time_index
        float64 [F] -> `StepOutputs`."""
        return self._compute.forward(patches, self._image_hw, time_index, first_frame, scale_slot,
                                     self._attend_global, self._camera)


def attend_paged(cache, layer: int, q, k, v):
    """The aggregator's global attention through a paged cache: q, k, v [F, P, H, D] (the
    step's frames, in the cache's request order) -> [F, P, H, D] or its unmerged parts."""
    F, P, H, D = q.shape
    # The blocks hand q, k, v over in the compute dtype already (Attention.heads), and merge
    # split attention themselves (Block.attention_output).
    out = cache.attend(layer, q.reshape(F * P, H, D), k.reshape(F * P, H, D),
                       v.reshape(F * P, H, D), merge=False)           # [F*P, H, D]
    if isinstance(out, PartialAttention):
        return out.view_queries(F, P)
    return out.view(F, P, H, D)
