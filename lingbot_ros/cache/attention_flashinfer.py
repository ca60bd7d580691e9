"""`FlashInferAttention`: FlashInfer's paged prefill kernel straight over the page pool (CUDA,
fp16/bf16). `flashinfer` is imported only when this backend is built."""

from __future__ import annotations

import math

import torch

from .kv_storage import FP8
from .partials import PartialAttention
from .spec import CacheSpec
from .step_table import StepTable

WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's documented default for its scratch space
HEAD_DIMS = (64, 128, 256)           # head sizes FlashInfer's prebuilt/JIT kernels are made for
MAX_KV_SPLITS = 8


def kv_splits_for(num_queries: int, num_heads: int, head_dim: int, num_sms: int) -> int:
    """Requests a single-frame step's visible pages are split into. FlashInfer's Hopper kernel
    (FA3) gives each (tile of queries, head, request) one work item and does not split a long
    KV itself: one frame of the released model (1005 queries in tiles of 192, 16 heads) makes
    96 items for 132 SMs, a quarter of the GPU idle. Take the fewest splits whose items fill
    whole waves to >= 90%, else the most (short of work). On the H200, one frame's global
    attention: 23.5 ms unsplit, 20.8 ms in 4 (bench/attention_kernels.py)."""
    tile = 192 if head_dim <= 64 else 128
    items = math.ceil(num_queries / tile) * num_heads
    for splits in range(1, MAX_KV_SPLITS + 1):
        waves = math.ceil(splits * items / num_sms)
        if splits * items >= 0.9 * waves * num_sms:
            return splits
    return MAX_KV_SPLITS


def flashinfer_available(spec: CacheSpec) -> bool:
    """True when FlashInfer can serve this spec: CUDA device, half dtype, a head size it is
    built for, package importable."""
    if (spec.device.type != "cuda" or spec.dtype not in (torch.float16, torch.bfloat16)
            or spec.storage_dtype not in (spec.dtype, FP8) or spec.head_dim not in HEAD_DIMS):
        return False
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return False
    return True


class FlashInferAttention:
    """`BatchPrefillWithPagedKVCacheWrapper` on the NHD pool `[pages, 2, P, H, D]`: `plan` once
    per step, `run` per layer, non-causal, page size P. Multi-frame steps: one request.

    Single-frame steps (`table.static`) go through a second wrapper in FlashInfer's CUDA-graph
    mode: its index buffers have fixed addresses and its schedule a fixed grid, so `run` can be
    captured once and replayed after each step's `plan`. The frame's queries are repeated as
    `kv_splits` requests over consecutive runs of the visible pages (whole pages; the last run
    ends with the one partial page), so that the kernel's work fills the GPU; `run` returns the
    runs' results unmerged (`PartialAttention`). The cache plans a step in this form only when
    at least `min_static_pages` pages are visible. Its page-index buffer is sized to the pool;
    `generation` counts its rebuilds and the query buffer's (a captured graph is stale after
    one).

    Float8 K/V (`spec.kv_dtype`): each layer's pool is cast into one scratch pool in `spec.dtype`
    (one layer's worth, reused by every layer) and the bf16 kernel runs over it, so attention
    computes as the torch backend's does: over K and V as stored, with the queries and the
    probabilities in `spec.dtype`. FlashInfer's own FP8 forms were measured and not taken
    (bench/README.md, "FP8 attention kernels"): its FA3 FP8 kernel rounds the queries and the
    probabilities to e4m3 as well (10-18x bf16's error on the model's outputs), and with bf16
    queries it runs FA2 at less than half the speed."""

    name = "flashinfer"
    supports_graphs = True

    def __init__(self, spec: CacheSpec) -> None:
        if spec.device.type != "cuda":
            raise ValueError(f"the flashinfer backend needs a CUDA device, not {spec.device}; "
                             "use backend='torch'")
        if spec.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"the flashinfer backend computes in float16/bfloat16, not {spec.dtype}; "
                             "set CacheSpec.dtype or use backend='torch'")
        try:
            import flashinfer
        except ImportError as error:
            raise ValueError("backend='flashinfer' but the flashinfer package does not import "
                             f"({error}); install flashinfer-python or use backend='torch'") from error
        self.spec = spec
        self.generation = 0
        # Float8 pools: the layer being attended, cast to spec.dtype (sized by plan, fixed address).
        self._dequantized: torch.Tensor | None = None
        self._flashinfer = flashinfer
        # Both wrappers plan into the same float workspace: only one step is planned at a time.
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=spec.device)
        self._batch = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
        self._graph_wrapper = None
        self._graph_capacity = 0
        # FlashInfer's plan() stages its schedule in a pinned host buffer and copies it to the
        # device without blocking; the next plan() rewrites that buffer. A host running frames
        # ahead of the device (no sync between steps) could overwrite it before the previous
        # copy ran, and that frame would read the next one's schedule. This event marks the
        # copy's place in the stream; plan() waits for it (at once unless the host is a frame
        # ahead).
        self._planned = torch.cuda.Event()
        self._active = self._batch
        self._split_queries: torch.Tensor | None = None   # [kv_splits, T, H, D], fixed address
        self._split_qo_indptr: torch.Tensor | None = None
        sms = torch.cuda.get_device_properties(spec.device).multi_processor_count
        # No more splits than the pages a full window shows: steady-state steps must qualify.
        self.kv_splits = min(kv_splits_for(spec.tokens_per_frame, spec.num_heads, spec.head_dim, sms),
                             spec.full_window_pages)
        # Every request gets at least one page (FA3 does not take an empty one).
        self.min_static_pages = self.kv_splits

    def plan(self, table: StepTable, num_pool_pages: int) -> None:
        spec = self.spec
        self._planned.synchronize()
        if spec.storage_dtype == FP8:
            self._size_dequantized(num_pool_pages)
        if table.static:
            self._plan_split(table, num_pool_pages)
        else:
            self._active = self._batch
            self._batch.plan(
                table.host_qo_indptr, table.host_kv_indptr, table.pages_i32, table.host_last_page_len,
                num_qo_heads=spec.num_heads, num_kv_heads=spec.num_heads,
                head_dim_qk=spec.head_dim, page_size=spec.tokens_per_frame, causal=False,
                q_data_type=spec.dtype, kv_data_type=spec.dtype, o_data_type=spec.dtype)
        self._planned.record()

    def _plan_split(self, table: StepTable, num_pool_pages: int) -> None:
        spec, splits, T = self.spec, self.kv_splits, table.num_queries
        if num_pool_pages > self._graph_capacity:
            self._build_graph_wrapper(num_pool_pages)
        if self._split_queries is None or self._split_queries.shape[1] != T:
            self._split_queries = torch.empty((splits, T, spec.num_heads, spec.head_dim),
                                              dtype=spec.dtype, device=spec.device)
            self._split_qo_indptr = torch.arange(splits + 1, dtype=torch.int32) * T
            self.generation += 1
        self._active = self._graph_wrapper
        pages = len(table.host_pages)
        kv_indptr = torch.tensor([pages * i // splits for i in range(splits + 1)], dtype=torch.int32)
        last_page_len = torch.full((splits,), spec.tokens_per_frame, dtype=torch.int32)
        last_page_len[-1] = table.host_last_page_len[0]
        # Page indices from the device copy: in CUDA-graph mode FlashInfer copies host indices
        # into its buffer synchronously, a device-to-device copy stays asynchronous.
        self._graph_wrapper.plan(
            self._split_qo_indptr, kv_indptr, table.pages_i32, last_page_len,
            num_qo_heads=spec.num_heads, num_kv_heads=spec.num_heads,
            head_dim_qk=spec.head_dim, page_size=spec.tokens_per_frame, causal=False,
            q_data_type=spec.dtype, kv_data_type=spec.dtype, o_data_type=spec.dtype)

    def _size_dequantized(self, num_pool_pages: int) -> None:
        """The scratch pool matches the pools' page count (they grow with the special stream):
        reallocated, outside any capture, when they do."""
        if self._dequantized is None or self._dequantized.shape[0] != num_pool_pages:
            spec = self.spec
            self._dequantized = None   # the old one's memory first
            self._dequantized = torch.empty((num_pool_pages, 2, spec.tokens_per_frame, spec.num_heads,
                                             spec.head_dim), dtype=spec.dtype, device=spec.device)
            self.generation += 1

    def run(self, pool: torch.Tensor, q: torch.Tensor) -> torch.Tensor | PartialAttention:
        """pool [pages, 2, P, H, D], q [T, H, D] -> out [T, H, D], or its `kv_splits` parts."""
        if pool.dtype == FP8:
            pool = self._dequantized.copy_(pool)
        if self._active is self._batch:
            return self._batch.run(q, pool)
        queries = self._split_queries
        queries.copy_(q.expand_as(queries))
        out, lse = self._graph_wrapper.run(queries.flatten(0, 1), pool, return_lse=True)
        return PartialAttention(out.view(queries.shape), lse.view(queries.shape[:3]))

    def _build_graph_wrapper(self, num_pages: int) -> None:
        device = self.spec.device
        self._graph_wrapper = self._flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self._workspace, "NHD", use_cuda_graph=True,
            qo_indptr_buf=torch.zeros(self.kv_splits + 1, dtype=torch.int32, device=device),
            paged_kv_indptr_buf=torch.zeros(self.kv_splits + 1, dtype=torch.int32, device=device),
            paged_kv_indices_buf=torch.zeros(num_pages, dtype=torch.int32, device=device),
            paged_kv_last_page_len_buf=torch.zeros(self.kv_splits, dtype=torch.int32, device=device))
        self._graph_capacity = num_pages
        self.generation += 1
