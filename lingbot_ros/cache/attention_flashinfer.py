"""`FlashInferAttention`: FlashInfer's paged prefill kernel straight over the page pool (CUDA,
fp16/bf16). `flashinfer` is imported only when this backend is built."""

from __future__ import annotations

import torch

from .spec import CacheSpec
from .step_table import StepTable

WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's documented default for its scratch space
HEAD_DIMS = (64, 128, 256)           # head sizes FlashInfer's prebuilt/JIT kernels are made for


def flashinfer_available(spec: CacheSpec) -> bool:
    """True when FlashInfer can serve this spec: CUDA device, half dtype, a head size it is
    built for, package importable."""
    if (spec.device.type != "cuda" or spec.dtype not in (torch.float16, torch.bfloat16)
            or spec.head_dim not in HEAD_DIMS):
        return False
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return False
    return True


class FlashInferAttention:
    """`BatchPrefillWithPagedKVCacheWrapper` on the NHD pool `[pages, 2, P, H, D]`, one request:
    `plan` once per step from host int32 tensors, `run` per layer, non-causal, page size P.

    Single-frame steps (`table.static`) go through a second wrapper in FlashInfer's CUDA-graph
    mode: its index buffers have fixed addresses and its schedule a fixed grid, so `run` can be
    captured once and replayed after each step's `plan`. Its page-index buffer is sized to the
    pool; `generation` counts its rebuilds (a captured graph is stale after one)."""

    name = "flashinfer"
    supports_graphs = True

    def __init__(self, spec: CacheSpec) -> None:
        if spec.device.type != "cuda":
            raise ValueError(f"the flashinfer backend needs a CUDA device, not {spec.device}; "
                             "use backend='torch'")
        if spec.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"the flashinfer backend stores float16/bfloat16, not {spec.dtype}; "
                             "set CacheSpec.dtype or use backend='torch'")
        try:
            import flashinfer
        except ImportError as error:
            raise ValueError("backend='flashinfer' but the flashinfer package does not import "
                             f"({error}); install flashinfer-python or use backend='torch'") from error
        self.spec = spec
        self.generation = 0
        self._flashinfer = flashinfer
        # Both wrappers plan into the same float workspace: only one step is planned at a time.
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=spec.device)
        self._batch = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
        self._graph_wrapper = None
        self._graph_capacity = 0
        self._active = self._batch

    def plan(self, table: StepTable, num_pool_pages: int) -> None:
        spec = self.spec
        if table.static:
            if num_pool_pages > self._graph_capacity:
                self._build_graph_wrapper(num_pool_pages)
            self._active = self._graph_wrapper
        else:
            self._active = self._batch
        # Page indices from the device copy: in CUDA-graph mode FlashInfer copies host indices
        # into its buffer synchronously, a device-to-device copy stays asynchronous.
        self._active.plan(
            table.host_qo_indptr, table.host_kv_indptr, table.pages_i32,
            table.host_last_page_len,
            num_qo_heads=spec.num_heads, num_kv_heads=spec.num_heads,
            head_dim_qk=spec.head_dim, page_size=spec.tokens_per_frame,
            causal=False, q_data_type=spec.dtype, kv_data_type=spec.dtype)

    def run(self, pool: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """pool [pages, 2, P, H, D], q [T, H, D] -> out [T, H, D]."""
        return self._active.run(q, pool)

    def _build_graph_wrapper(self, num_pages: int) -> None:
        device = self.spec.device
        self._graph_wrapper = self._flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self._workspace, "NHD", use_cuda_graph=True,
            qo_indptr_buf=torch.zeros(2, dtype=torch.int32, device=device),
            paged_kv_indptr_buf=torch.zeros(2, dtype=torch.int32, device=device),
            paged_kv_indices_buf=torch.zeros(num_pages, dtype=torch.int32, device=device),
            paged_kv_last_page_len_buf=torch.zeros(1, dtype=torch.int32, device=device))
        self._graph_capacity = num_pages
        self.generation += 1
