"""Transformer building blocks shared by DINOv2, the aggregator and the camera head (spec 5, 7, 10)."""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

# attend(q, k, v) -> out, all [B, T, H, D]; the default is dense attention within each sequence.
AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# rope(x) -> x rotated, x [B, T, H, D]
RopeFn = Callable[[torch.Tensor], torch.Tensor]


def dense_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """key_mask: optional bool [Tk], False = key not visible to any query."""
    # SDPA wants [B, H, T, D]; scale defaults to 1/sqrt(D) as in the spec.
    mask = None if key_mask is None else key_mask.view(1, 1, 1, -1)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask)
    return out.transpose(1, 2)


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, out: Optional[int] = None):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, out or dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))   # exact (erf) GELU


class Attention(nn.Module):
    """Multi-head self-attention; q/k LayerNorm (aggregator only) runs before RoPE (spec 7)."""

    def __init__(self, dim: int, num_heads: int, qk_norm: bool):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.q_norm = nn.LayerNorm(self.head_dim, eps=1e-5) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-5) if qk_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, rope: Optional[RopeFn] = None,
                attend: AttendFn = dense_attend) -> torch.Tensor:
        B, T, C = x.shape
        # qkv output dim is laid out [3, heads, head_dim]
        q, k, v = self.qkv(x).view(B, T, 3, self.num_heads, self.head_dim).unbind(2)  # each [B, T, H, D]
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = rope(q), rope(k)
        out = attend(q, k, v)                                                          # [B, T, H, D]
        return self.proj(out.reshape(B, T, C))


class Block(nn.Module):
    """Pre-norm transformer block with LayerScale: x += ls1*attn(norm1 x); x += ls2*mlp(norm2 x)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, qk_norm: bool, eps: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, num_heads, qk_norm)
        self.ls1 = LayerScale(dim)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.ls2 = LayerScale(dim)

    def forward(self, x: torch.Tensor, rope: Optional[RopeFn] = None,
                attend: AttendFn = dense_attend) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x), rope, attend))
        return x + self.ls2(self.mlp(self.norm2(x)))
