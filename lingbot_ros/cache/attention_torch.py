"""`TorchAttention`: gathers the visible pages into dense K/V and runs PyTorch SDPA.
Works on any device and dtype; the reference backend."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .kv_storage import from_raw, raw
from .spec import CacheSpec
from .step_table import StepTable


class TorchAttention:
    """Non-causal attention of the step's queries over the visible pages (gather + SDPA)."""

    name = "torch"
    supports_graphs = False   # the gather's length follows the visible tokens
    min_static_pages = 1
    generation = 0

    def __init__(self, spec: CacheSpec) -> None:
        self.spec = spec
        self._slots = torch.arange(spec.tokens_per_frame, device=spec.device)  # [P]
        self._rows: torch.Tensor | None = None   # [2 * Tk] pool rows: K rows then V rows

    def plan(self, table: StepTable, num_pool_pages: int) -> None:
        """Once per step: the pool rows of every visible token (device ops, no host sync)."""
        per_page = self.spec.tokens_per_frame
        k_rows = (table.pages[:, None] * (2 * per_page) + self._slots).view(-1)
        k_rows = k_rows[:table.num_kv_tokens]          # the last page may be partial
        self._rows = torch.cat((k_rows, k_rows + per_page))

    def run(self, pool: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """pool [pages, 2, P, H, D], q [T, H, D] -> out [T, H, D] (contiguous)."""
        heads, dim = self.spec.num_heads, self.spec.head_dim
        kv = raw(pool).view(-1, heads, dim).index_select(0, self._rows).view(2, 1, -1, heads, dim)
        kv = from_raw(kv, pool.dtype).to(q.dtype)
        # SDPA's fused CUDA kernels (cuDNN, flash) need a batch axis: [1, H, T, D] views. With 3-D
        # inputs it falls back to the math kernel, which materialises every T x Tk score.
        out = F.scaled_dot_product_attention(            # [1, H, T, D]
            q[None].transpose(1, 2), kv[0].transpose(1, 2), kv[1].transpose(1, 2))
        return out[0].transpose(0, 1).contiguous()
