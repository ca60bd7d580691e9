"""`PagedKVCache`: the global-attention KV cache of all transformer layers (spec section 9).

One pool tensor per layer, `[num_pages, 2, P, H, D]` (dim 1: K at 0, V at 1; FlashInfer's NHD
paged layout), and ONE page bookkeeping shared by all layers:

    pages 0 .. frame_pages-1        frame pages (PagePool): anchors, window, pending, free
    page  frame_pages               scratch page: a non-keyframe's own K/V
    pages patch_pages ..            special stream (grows in chunks of special_chunk_pages)

Per step: `begin_step` does all host work once (pages, evictions, special-token copies, page
table, one upload, the backend's plan); `attend(layer, ...)` then only launches device work.
Single-frame steps keep their index tensors at fixed device addresses (special-token copies
padded to a fixed count), so that the device work of all layers can be captured once as a CUDA
graph and replayed while `buffers_version` stays the same.
Attention sees, in this page order: anchors, window (current frames included), the scratch page
(non-keyframes only), special pages (only the last page may be partial).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention_flashinfer import FlashInferAttention, flashinfer_available
from .attention_torch import TorchAttention
from .errors import CacheError, CacheExhausted, NothingToRollback
from .kv_storage import raw, to_storage
from .page_pool import PagePool
from .partials import PartialAttention
from .patch_stream import PatchStream
from .spec import CacheSpec
from .special_stream import SpecialStream
from .step_table import IndexUploader, StepTable


@dataclass(frozen=True)
class CacheStats:
    """Occupancy of the cache. Pages count once for all layers; bytes cover all layers."""

    frames_stored: int
    anchor_pages: int
    window_pages: int
    pending_pages: int      # evicted, waiting for flush()
    free_pages: int         # frame pages free
    special_tokens: int
    special_pages: int      # allocated for the special stream
    special_pages_in_use: int   # ceil(special_tokens / P)
    bytes_allocated: int    # all pools
    bytes_in_use: int       # stored + pending frames and special tokens


def _build_backend(name: str, spec: CacheSpec) -> TorchAttention | FlashInferAttention:
    if name == "auto":
        name = "flashinfer" if flashinfer_available(spec) else "torch"
    if name == "torch":
        return TorchAttention(spec)
    if name == "flashinfer":
        return FlashInferAttention(spec)
    raise ValueError(f"unknown attention backend {name!r}; use 'torch', 'flashinfer' or 'auto'")


class PagedKVCache:
    """Anchors + sliding window of whole frames and a growing special-token stream, paged.

    Call order per forward pass: `begin_step(F, store)`, then `attend(layer, q, k, v)` (or
    `write`) for EVERY layer before the next `begin_step`; the special-token copies and K/V
    writes of the step happen there. `rollback_last_frame`, `flush` and `reset` go between
    steps and end the current one.
    """

    def __init__(self, spec: CacheSpec, backend: str = "auto") -> None:
        self.spec = spec
        self.defer_evictions = False   # settable between steps; never changes outputs
        self._backend = _build_backend(backend, spec)
        self._pool = PagePool(spec.frame_pages)
        self._patch = PatchStream(spec.scale_frames, spec.sliding_window, spec.include_scale_frames)
        self._special = SpecialStream(spec.tokens_per_frame, spec.patch_pages,
                                      spec.special_chunk_pages, spec.max_special_tokens)
        self._pools = [self._new_pool(spec.base_pages) for _ in range(spec.num_layers)]
        self._pools_version = 0
        self._uploader = IndexUploader(spec.device, self._index_capacity())
        self._step: StepTable | None = None

    @property
    def backend(self) -> str:
        """The attention backend in use: 'torch' or 'flashinfer'."""
        return self._backend.name

    @property
    def num_stored_frames(self) -> int:
        return self._patch.num_stored

    @property
    def step_table(self) -> StepTable | None:
        """The current step's page table (None between steps). Its host tensors are reused
        two steps later."""
        return self._step

    @property
    def supports_graphs(self) -> bool:
        """Whether the backend's attention can be captured in a CUDA graph (FlashInfer)."""
        return self._backend.supports_graphs

    @property
    def buffers_version(self) -> tuple[int, int, int]:
        """Changes whenever a tensor that a step's device work reads or writes is reallocated
        (pools, index buffers, the backend's graph buffers): a captured graph is stale then."""
        return self._pools_version, self._uploader.generation, self._backend.generation

    def layer_pool(self, layer: int) -> torch.Tensor:
        """Layer `layer`'s pool `[pages, 2, P, H, D]` (for checks; reallocated on growth)."""
        return self._pools[layer]

    # ---- per step ---------------------------------------------------------------------------

    def begin_step(self, num_frames: int, store: bool = True) -> None:
        """Prepare one forward call of `num_frames` frames (`num_frames * P` query tokens).

        store=True (keyframes; phase 1 may pass several frames): append the frames, evict, and
        move evicted frames' specials to the special stream. store=False (a non-keyframe, exactly
        one frame): attention also sees the frame itself; nothing is stored or evicted.
        Raises ValueError, CacheExhausted or SpecialStreamFull before changing anything.
        """
        spec = self.spec
        if not isinstance(num_frames, int) or isinstance(num_frames, bool) or num_frames < 1:
            raise ValueError(f"num_frames must be a positive int, got {num_frames!r}")
        if store:
            write_pages, copies = self._store_frames(num_frames)
        else:
            if num_frames != 1:
                raise ValueError(f"a non-keyframe step (store=False) takes 1 frame, got {num_frames}")
            write_pages, copies = [spec.scratch_page], []
        self._step = self._plan(num_frames, store, write_pages, copies)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """This layer's device work of the step except attention: copy evicted frames'
        specials into the special stream, then write k, v `[F*P, H, D]` to the step's pages."""
        step = self._require_step(k)
        spec = self.spec
        pool = raw(self._pools[layer])
        if step.copy_src.numel():
            # Before the new frames' writes: a source page may be handed out again later.
            rows = pool.view(-1, spec.num_heads, spec.head_dim)
            rows.index_copy_(0, step.copy_dst, rows.index_select(0, step.copy_src))
        frames = (step.num_frames, spec.tokens_per_frame, spec.num_heads, spec.head_dim)
        pool[:, 0].index_copy_(0, step.write_pages, raw(to_storage(k, spec.storage_dtype)).reshape(frames))
        pool[:, 1].index_copy_(0, step.write_pages, raw(to_storage(v, spec.storage_dtype)).reshape(frames))

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               merge: bool = True) -> torch.Tensor | PartialAttention:
        """q, k, v `[F*P, H, D]` (k already rotated, dtype = spec.dtype) -> out `[F*P, H, D]`:
        `write(layer, k, v)`, then non-causal softmax attention over the visible pages (with a
        float8 `kv_dtype`, over K and V as stored: rounded to e4m3).
        merge=False: the backend may return its results over disjoint page runs unmerged, for
        the caller to merge inside its own fused kernel."""
        self.write(layer, k, v)
        out = self._backend.run(self._pools[layer], q)
        if merge and isinstance(out, PartialAttention):
            return out.merge()
        return out

    # ---- between steps ----------------------------------------------------------------------

    def rollback_last_frame(self) -> None:
        """Remove the newest stored frame. Its step's still-pending evictions are undone (frames
        back at the window's front, their specials off the stream's end); executed ones are not.
        With deferral on, append + rollback of a single-frame step == never appended."""
        if self._patch.num_stored == 0:
            raise NothingToRollback("no frame is stored, so there is nothing to roll back "
                                    "(after reset() or once every stored frame was rolled back)")
        page, dropped_specials = self._patch.pop_newest()
        self._special.truncate(dropped_specials)
        self._pool.free([page])
        self._step = None

    def flush(self) -> int:
        """Free the pages of pending (deferred) evictions; returns how many. No output changes;
        afterwards those evictions can no longer be undone."""
        pages = self._patch.take_pending()
        self._pool.free(pages)
        self._step = None
        return len(pages)

    def reset(self) -> None:
        """Back to empty, keeping every buffer: the pools (with all the special pages the stream
        grew to), the index buffers and the backend's. So `buffers_version` stays the same (a
        CUDA graph captured before stays valid) and a new stream allocates nothing until its
        special stream outgrows every earlier one; a reset never allocates. The pools are zeroed
        in place (one memset), so the new stream reads exactly what a fresh cache's would, even
        after NaN."""
        self._patch.reset()
        self._pool.reset()
        self._special.num_tokens = 0
        # The pools may have been made under the caller's inference_mode (inference tensors,
        # writable only inside it); zeroing under it works for plain tensors too.
        with torch.inference_mode():
            for pool in self._pools:
                pool.zero_()
        self._step = None

    def stats(self) -> CacheStats:
        spec, patch, special = self.spec, self._patch, self._special
        return CacheStats(
            frames_stored=patch.num_stored,
            anchor_pages=len(patch.anchors),
            window_pages=len(patch.window),
            pending_pages=len(patch.pending),
            free_pages=self._pool.num_free,
            special_tokens=special.num_tokens,
            special_pages=special.num_pages,
            special_pages_in_use=-(-special.num_tokens // spec.tokens_per_frame),
            bytes_allocated=sum(p.numel() * p.element_size() for p in self._pools),
            bytes_in_use=(patch.num_stored + len(patch.pending)) * spec.page_bytes
            + special.num_tokens * spec.token_bytes)

    def page_census(self) -> dict[str, list[int]]:
        """Owner of every page (each page appears exactly once), for checks and diagnostics."""
        patch, special = self._patch, self._special
        return {
            "free": self._pool.free_pages(),
            "anchor": [f.page for f in patch.anchors],
            "window": [f.page for f in patch.window],
            "pending": list(patch.pending),
            "scratch": [self.spec.scratch_page],
            "special": list(range(special.first_page, special.first_page + special.num_pages)),
        }

    # ---- internals --------------------------------------------------------------------------

    def _store_frames(self, num_frames: int) -> tuple[list[int], list[tuple[int, int, int, int]]]:
        """Bookkeeping of a stored step. Returns the new frames' pages and the special-token
        copies (source page, slot -> special page, slot). All checks come first."""
        spec, patch = self.spec, self._patch
        eviction = patch.eviction_for(num_frames)
        leaving = len(eviction.frames)
        per_frame = spec.specials_per_evicted_frame   # dropped frames leave none
        new_specials = per_frame * len(eviction.evicted)
        self._special.check_room(new_specials)
        defer = self.defer_evictions
        pending = len(patch.pending)
        if defer and pending + leaving > spec.deferred_capacity:
            raise CacheExhausted(
                f"{pending} evicted pages are pending and this step evicts {leaving} more, "
                f"over deferred_capacity={spec.deferred_capacity}; call flush() first or raise "
                "CacheSpec.deferred_capacity")
        reclaimable = 0 if defer else pending
        if num_frames > self._pool.num_free + reclaimable:
            raise CacheExhausted(
                f"this step needs {num_frames} pages but {self._pool.num_free} are free "
                f"({pending} pending); call flush(), append fewer frames at once, or raise "
                "CacheSpec.deferred_capacity")
        grow = self._special.pages_to_grow(new_specials)
        if grow:
            self._grow_special_pages(grow)   # may raise out-of-memory; bookkeeping untouched
        # State changes from here on.
        if not defer:
            self._pool.free(patch.take_pending())
        pages = self._pool.allocate(num_frames)
        patch.append(pages)
        self._pool.free(patch.evict(eviction, new_specials, defer))
        destinations = iter(self._special.append(new_specials))
        copies = [(frame.page, slot, *next(destinations))
                  for frame in eviction.evicted for slot in range(per_frame)]
        return pages, copies

    def _plan(self, num_frames: int, store: bool, write_pages: list[int],
              copies: list[tuple[int, int, int, int]]) -> StepTable:
        """Page table and index tensors of the step: one upload, then the backend's plan."""
        spec, special = self.spec, self._special
        per_page = spec.tokens_per_frame
        visible = self._patch.visible_pages()
        if not store:
            visible.append(spec.scratch_page)
        visible += special.visible_pages()
        last_page_len = special.last_page_len
        num_kv_tokens = (len(visible) - 1) * per_page + last_page_len
        pad = spec.specials_per_evicted_frame
        # The backend may need a few visible pages for the fixed form (FlashInfer splits them
        # into several requests); the first steps after a reset then run in the plain form.
        static = num_frames == 1 and len(copies) <= pad and len(visible) >= self._backend.min_static_pages
        if static:
            # Fixed layout for every single-frame step: no-op copies of a scratch-page row onto
            # itself fill the copy slots (the step's own writes come after the copies).
            copies = copies + [(spec.scratch_page, 0, spec.scratch_page, 0)] * (pad - len(copies))
        stride = 2 * per_page
        src = [page * stride + slot for page, slot, _, _ in copies]
        dst = [page * stride + slot for _, _, page, slot in copies]
        values = (write_pages + src + [row + per_page for row in src]
                  + dst + [row + per_page for row in dst]
                  + visible + [0, num_frames * per_page, 0, len(visible), last_page_len])
        host, device_i32, device_values = self._uploader.upload(values)
        f, n, m = len(write_pages), len(copies), len(visible)
        a, b, c = f + 2 * n, f + 4 * n, f + 4 * n + m
        table = StepTable(
            num_frames=num_frames, num_queries=num_frames * per_page, num_kv_tokens=num_kv_tokens,
            write_pages=device_values[:f], copy_src=device_values[f:a],
            copy_dst=device_values[a:b], pages=device_values[b:c], pages_i32=device_i32[b:c],
            host_pages=host[b:c], host_qo_indptr=host[c:c + 2], host_kv_indptr=host[c + 2:c + 4],
            host_last_page_len=host[c + 4:c + 5], static=static)
        self._backend.plan(table, self._pools[0].shape[0])
        self._uploader.done()
        return table

    def _require_step(self, k: torch.Tensor) -> StepTable:
        step = self._step
        if step is None:
            raise CacheError("no step in progress: call begin_step() before attend()/write() "
                             "(rollback_last_frame, flush and reset end the current step)")
        if k.shape[0] != step.num_queries:
            raise ValueError(f"expected {step.num_queries} tokens (F * P) from begin_step, "
                             f"got tensors of shape {tuple(k.shape)}")
        return step

    def _grow_special_pages(self, extra: int) -> None:
        """Add `extra` special pages to every layer's pool, one layer at a time."""
        total = self._pools[0].shape[0] + extra
        for layer, old in enumerate(self._pools):
            grown = self._new_pool(total)
            grown[:old.shape[0]].copy_(old)
            self._pools[layer] = grown
            del old
        self._pools_version += 1
        self._special.num_pages += extra

    def _new_pool(self, num_pages: int) -> torch.Tensor:
        spec = self.spec
        # Zeroed so that never-written slots can't hold NaN/Inf garbage.
        return torch.zeros((num_pages, 2, spec.tokens_per_frame, spec.num_heads, spec.head_dim),
                           dtype=spec.storage_dtype, device=spec.device)

    def _index_capacity(self) -> int:
        """Upper bound of one step's index values before the special stream grows."""
        spec = self.spec
        copies = spec.frame_pages * spec.special_tokens
        visible = spec.patch_pages + self._special.num_pages
        return spec.frame_pages + 4 * copies + visible + 5
