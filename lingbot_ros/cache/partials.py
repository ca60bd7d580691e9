"""`PartialAttention`: attention computed over disjoint key sets and not yet combined."""

from __future__ import annotations

from typing import NamedTuple

import torch


class PartialAttention(NamedTuple):
    """out [S, ..., H, D]: attention of the same queries over S disjoint key sets; lse [S, ..., H]:
    the base-2 log-sum-exp of each set's scaled logits (FlashInfer's convention; -inf for an empty
    set). Returned unmerged so that the merge can run inside the consumer's fused kernel."""

    out: torch.Tensor
    lse: torch.Tensor

    def merge(self) -> torch.Tensor:
        """Attention over the union of the key sets: [..., H, D] in out's dtype."""
        weight = torch.exp2(self.lse - self.lse.amax(0))                       # [S, ..., H]
        merged = (self.out.float() * weight[..., None]).sum(0) / weight.sum(0)[..., None]
        return merged.to(self.out.dtype)

    def view_queries(self, *shape: int) -> "PartialAttention":
        """The query axes viewed as `shape` (like `Tensor.view` on a merged result)."""
        splits, heads, dim = self.out.shape[0], self.out.shape[-2], self.out.shape[-1]
        return PartialAttention(self.out.view(splits, *shape, heads, dim),
                                self.lse.view(splits, *shape, heads))
