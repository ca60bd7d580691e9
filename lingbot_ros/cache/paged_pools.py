"""`PagedPools`: the page pools of all global-attention layers and one step's device work, for
one or several streams' page bookkeeping (`StreamPages`).

One pool tensor per layer, `[num_pages, 2, P, H, D]` (dim 1: K at 0, V at 1; FlashInfer's NHD
paged layout). A step is one or more requests, one per stream, each with its own new frames and
visible pages: `_begin` checks every stream's part before it changes any, grows the pools where a
special stream needs pages, uploads one page table and makes one attention plan; `attend(layer,
...)` then only launches device work. A request's queries see only its own pages.
Single-request single-frame steps keep their index tensors at fixed device addresses (special-token
copies padded to a fixed count), so that the device work of all layers can be captured once as a
CUDA graph and replayed while `buffers_version` stays the same.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .attention_flashinfer import FlashInferAttention, flashinfer_available
from .attention_torch import TorchAttention
from .errors import CacheError, NothingToRollback
from .kv_storage import raw, to_storage
from .partials import PartialAttention
from .spec import CacheSpec
from .step_table import IndexUploader, StepTable
from .stream_pages import CacheStats, StreamPages, StreamRequest


def _build_backend(name: str, spec: CacheSpec) -> TorchAttention | FlashInferAttention:
    if name == "auto":
        name = "flashinfer" if flashinfer_available(spec) else "torch"
    if name == "torch":
        return TorchAttention(spec)
    if name == "flashinfer":
        return FlashInferAttention(spec)
    raise ValueError(f"unknown attention backend {name!r}; use 'torch', 'flashinfer' or 'auto'")


class PagedPools:
    """The pools, the index upload and the backend, shared by the streams `streams` lists."""

    def __init__(self, spec: CacheSpec, streams: list[StreamPages], backend: str) -> None:
        self.spec = spec
        self._streams = streams
        self._backend = _build_backend(backend, spec)
        self._pools = [self._new_pool(len(streams) * spec.base_pages) for _ in range(spec.num_layers)]
        self._pools_version = 0
        self._uploader = IndexUploader(spec.device, self._index_capacity())
        self._step: StepTable | None = None

    @property
    def backend(self) -> str:
        """The attention backend in use: 'torch' or 'flashinfer'."""
        return self._backend.name

    @property
    def attention(self):
        """The attention backend object (its ``plan`` runs once per step)."""
        return self._backend

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

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """This layer's device work of the step except attention: copy evicted frames'
        specials into the special streams, then write k, v `[T, H, D]` (the requests' frames
        in order) to the step's pages."""
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
        """q, k, v `[T, H, D]` (k already rotated, dtype = spec.dtype) -> out `[T, H, D]`:
        `write(layer, k, v)`, then non-causal softmax attention of each request's queries over
        its visible pages (with a float8 `kv_dtype`, over K and V as stored: rounded to e4m3).
        merge=False: the backend may return its results over disjoint page runs unmerged, for
        the caller to merge inside its own fused kernel."""
        self.write(layer, k, v)
        out = self._backend.run(self._pools[layer], q)
        if merge and isinstance(out, PartialAttention):
            return out.merge()
        return out

    # ---- internals --------------------------------------------------------------------------

    def _begin(self, parts: Sequence[tuple[StreamPages, int, bool]]) -> None:
        """One step of `(stream, num_frames, store)` parts, one request each, in this order.
        Raises ValueError, CacheExhausted or SpecialStreamFull before changing anything."""
        prepared = [stream.prepare(num_frames, store) for stream, num_frames, store in parts]
        for (stream, _, _), step in zip(parts, prepared):
            if step.grow_pages:
                # May raise out-of-memory; no bookkeeping has changed yet.
                stream.special.add_pages(self._grow_pages(step.grow_pages))
        requests = [stream.apply(step) for (stream, _, _), step in zip(parts, prepared)]
        self._step = self._plan(requests)

    def _zero(self, stream: StreamPages) -> None:
        """Zero the stream's pages in every pool (one memset when it is the only stream), so
        that its next frames read exactly what a fresh cache's would, even after NaN."""
        # The pools may have been made under the caller's inference_mode (inference tensors,
        # writable only inside it); zeroing under it works for plain tensors too.
        with torch.inference_mode():
            if len(self._streams) == 1:
                for pool in self._pools:
                    pool.zero_()
                return
            index = torch.tensor(stream.pages(), dtype=torch.int64, device=self.spec.device)
            for pool in self._pools:
                raw(pool).index_fill_(0, index, 0)

    def _copy_pages(self, other: "PagedPools", source: list[int], target: list[int]) -> None:
        """Every layer's pages ``source`` of ``other``'s pools into pages ``target`` of these."""
        if not source:
            return
        device = self.spec.device
        src = torch.tensor(source, dtype=torch.int64, device=other.spec.device)
        dst = torch.tensor(target, dtype=torch.int64, device=device)
        with torch.inference_mode():   # as _zero: the pools may be inference tensors
            for mine, theirs in zip(self._pools, other._pools):
                raw(mine).index_copy_(0, dst, raw(theirs).index_select(0, src).to(device))

    def _plan(self, requests: list[StreamRequest]) -> StepTable:
        """Page table and index tensors of the step: one upload, then the backend's plan."""
        spec = self.spec
        per_page = spec.tokens_per_frame
        write_pages = [page for r in requests for page in r.write_pages]
        copies = [copy for r in requests for copy in r.copies]
        visible = [page for r in requests for page in r.visible]
        pad = spec.specials_per_evicted_frame
        only = requests[0]
        # The backend may need a few visible pages for the fixed form (FlashInfer splits them
        # into several requests); the first steps after a reset then run in the plain form.
        static = (len(requests) == 1 and only.num_frames == 1 and len(copies) <= pad
                  and len(visible) >= self._backend.min_static_pages)
        if static:
            # Fixed layout for every single-frame step: no-op copies of a scratch-page row onto
            # itself fill the copy slots (the step's own writes come after the copies).
            copies = copies + [(only.scratch_page, 0, only.scratch_page, 0)] * (pad - len(copies))
        stride = 2 * per_page
        src = [page * stride + slot for page, slot, _, _ in copies]
        dst = [page * stride + slot for _, _, page, slot in copies]
        qo_indptr, kv_indptr = [0], [0]
        for r in requests:
            qo_indptr.append(qo_indptr[-1] + r.num_frames * per_page)
            kv_indptr.append(kv_indptr[-1] + len(r.visible))
        last_page_len = [r.last_page_len for r in requests]
        values = (write_pages + src + [row + per_page for row in src]
                  + dst + [row + per_page for row in dst]
                  + visible + qo_indptr + kv_indptr + last_page_len)
        host, device_i32, device_values = self._uploader.upload(values)
        f, n, m, R = len(write_pages), len(copies), len(visible), len(requests)
        a, b, c = f + 2 * n, f + 4 * n, f + 4 * n + m
        table = StepTable(
            num_frames=f, num_queries=f * per_page,
            num_kv_tokens=sum((len(r.visible) - 1) * per_page + r.last_page_len for r in requests),
            write_pages=device_values[:f], copy_src=device_values[f:a],
            copy_dst=device_values[a:b], pages=device_values[b:c], pages_i32=device_i32[b:c],
            host_pages=host[b:c], host_qo_indptr=host[c:c + R + 1],
            host_kv_indptr=host[c + R + 1:c + 2 * R + 2],
            host_last_page_len=host[c + 2 * R + 2:c + 3 * R + 2], static=static)
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

    def _grow_pages(self, extra: int) -> list[int]:
        """Add `extra` pages at the end of every layer's pool, one layer at a time; returns
        their ids."""
        first = self._pools[0].shape[0]
        total = first + extra
        for layer, old in enumerate(self._pools):
            grown = self._new_pool(total)
            grown[:old.shape[0]].copy_(old)
            self._pools[layer] = grown
            del old
        self._pools_version += 1
        return list(range(first, total))

    def _new_pool(self, num_pages: int) -> torch.Tensor:
        spec = self.spec
        # Zeroed so that never-written slots can't hold NaN/Inf garbage.
        return torch.zeros((num_pages, 2, spec.tokens_per_frame, spec.num_heads, spec.head_dim),
                           dtype=spec.storage_dtype, device=spec.device)

    def _index_capacity(self) -> int:
        """Upper bound of one step's index values (all streams) before a special stream grows."""
        spec = self.spec
        copies = spec.frame_pages * spec.special_tokens
        per_stream = spec.frame_pages + 4 * copies + spec.patch_pages + spec.special_chunk_pages + 3
        return len(self._streams) * per_stream + 2


class StreamVerbs:
    """The verbs of one stream's cache between steps, for a cache of its own (`PagedKVCache`)
    and for one stream of a shared pool (`StreamCacheView`): `_pages` is the stream's
    bookkeeping, `_host` the pools it lives in."""

    _pages: StreamPages
    _host: PagedPools

    @property
    def defer_evictions(self) -> bool:
        """Settable between steps; never changes outputs."""
        return self._pages.defer_evictions

    @defer_evictions.setter
    def defer_evictions(self, value: bool) -> None:
        self._pages.defer_evictions = value

    @property
    def num_stored_frames(self) -> int:
        return self._pages.num_stored

    def begin_step(self, num_frames: int, store: bool = True) -> None:
        """Prepare one forward call of this stream's `num_frames` frames (`num_frames * P` query
        tokens).

        store=True (keyframes; phase 1 may pass several frames): append the frames, evict, and
        move evicted frames' specials to the special stream. store=False (a non-keyframe, exactly
        one frame): attention also sees the frame itself; nothing is stored or evicted.
        Raises ValueError, CacheExhausted or SpecialStreamFull before changing anything.
        """
        self._host._begin([(self._pages, num_frames, store)])

    def rollback_last_frame(self) -> None:
        """Remove the newest stored frame. Its step's still-pending evictions are undone (frames
        back at the window's front, their specials off the stream's end); executed ones are not.
        With deferral on, append + rollback of a single-frame step == never appended."""
        if self._pages.num_stored == 0:
            raise NothingToRollback("no frame is stored, so there is nothing to roll back "
                                    "(after reset() or once every stored frame was rolled back)")
        self._pages.rollback()
        self._host._step = None

    def flush(self) -> int:
        """Free the pages of pending (deferred) evictions; returns how many. No output changes;
        afterwards those evictions can no longer be undone."""
        self._host._step = None
        return self._pages.flush()

    def reset(self) -> None:
        """Back to empty, keeping every buffer: the pools (with all the special pages the stream
        grew to), the index buffers and the backend's. So `buffers_version` stays the same (a
        CUDA graph captured before stays valid) and a new stream allocates nothing until its
        special stream outgrows every earlier one; a reset never allocates. The stream's pages
        are zeroed in place, so the new stream reads exactly what a fresh cache's would, even
        after NaN. Other streams of a shared pool are untouched."""
        self._pages.reset()
        self._host._zero(self._pages)
        self._host._step = None

    def stats(self) -> CacheStats:
        return self._pages.stats()

    def take_over(self, other: "StreamVerbs") -> None:
        """This empty stream continues where ``other`` (a cache of the same page shape, whose
        stream has evicted nothing) stands: its frames' pages are copied into this stream's, so
        the next step's outputs are the ones ``other``'s next step would give. A window switch
        prepared in a small cache beside a full one takes this way (stream/session.py).
        CacheError, having changed nothing, where it cannot (StreamPages.take_over)."""
        source, target = self._pages.take_over(other._pages)
        self._host._copy_pages(other._host, source, target)
        self._host._step = None

    def page_census(self) -> dict[str, list[int]]:
        """Owner of every page of the stream (each appears exactly once), for checks and diagnostics."""
        return self._pages.census()
