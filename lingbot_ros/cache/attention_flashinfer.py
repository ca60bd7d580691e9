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
    `plan` once per step from host int32 tensors, `run` per layer, non-causal, page size P."""

    name = "flashinfer"

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
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=spec.device)
        self._wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")

    def plan(self, table: StepTable) -> None:
        spec = self.spec
        self._wrapper.plan(
            table.host_qo_indptr, table.host_kv_indptr, table.host_pages,
            table.host_last_page_len,
            num_qo_heads=spec.num_heads, num_kv_heads=spec.num_heads,
            head_dim_qk=spec.head_dim, page_size=spec.tokens_per_frame,
            causal=False, q_data_type=spec.dtype, kv_data_type=spec.dtype)

    def run(self, pool: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """pool [pages, 2, P, H, D], q [T, H, D] -> out [T, H, D]."""
        return self._wrapper.run(q, pool)
