"""`TorchAttention`: gathers the visible pages into dense K/V and runs PyTorch SDPA.
Works on any device and dtype; the reference backend."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .kv_storage import from_raw, raw
from .spec import CacheSpec
from .step_table import StepTable


class TorchAttention:
    """Non-causal attention of the step's queries over the visible pages (gather + SDPA), one
    SDPA per request (stream) of the step."""

    name = "torch"
    supports_graphs = False   # the gather's length follows the visible tokens
    min_static_pages = 1
    generation = 0

    def __init__(self, spec: CacheSpec) -> None:
        self.spec = spec
        self._slots = torch.arange(spec.tokens_per_frame, device=spec.device)  # [P]
        # Per request: (first query row, end query row, pool rows: K rows then V rows [2 * Tk])
        self._requests: list[tuple[int, int, torch.Tensor]] = []

    def plan(self, table: StepTable, num_pool_pages: int) -> None:
        """Once per step: the pool rows of every visible token (device ops, no host sync; the
        request bounds are host data)."""
        per_page = self.spec.tokens_per_frame
        k_rows = table.pages[:, None] * (2 * per_page) + self._slots          # [m, P]
        qo, kv = table.host_qo_indptr.tolist(), table.host_kv_indptr.tolist()
        self._requests = []
        for r, last in enumerate(table.host_last_page_len.tolist()):
            rows = k_rows[kv[r]:kv[r + 1]].reshape(-1)
            rows = rows[:rows.numel() - per_page + last]     # the last page may be partial
            self._requests.append((qo[r], qo[r + 1], torch.cat((rows, rows + per_page))))

    def run(self, pool: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """pool [pages, 2, P, H, D], q [T, H, D] -> out [T, H, D] (contiguous)."""
        if len(self._requests) == 1:
            return self._attend(pool, q, self._requests[0][2])
        return torch.cat([self._attend(pool, q[start:end], rows) for start, end, rows in self._requests])

    def _attend(self, pool: torch.Tensor, q: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        heads, dim = self.spec.num_heads, self.spec.head_dim
        kv = raw(pool).view(-1, heads, dim).index_select(0, rows).view(2, 1, -1, heads, dim)
        kv = from_raw(kv, pool.dtype).to(q.dtype)
        # SDPA's fused CUDA kernels (cuDNN, flash) need a batch axis: [1, H, T, D] views. With 3-D
        # inputs it falls back to the math kernel, which materialises every T x Tk score.
        out = F.scaled_dot_product_attention(            # [1, H, T, D]
            q[None].transpose(1, 2), kv[0].transpose(1, 2), kv[1].transpose(1, 2))
        return out[0].transpose(0, 1).contiguous()
