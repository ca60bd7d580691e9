"""Transformer building blocks shared by DINOv2, the aggregator and the camera head (spec 5, 7, 10)."""
from __future__ import annotations

import contextlib
import functools
import types
from contextvars import ContextVar
from typing import Callable, Hashable, Iterator, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..cache.partials import PartialAttention
from .compiled import CompiledBySignature

# attend(q, k, v) -> out, all [B, T, H, D], or its unmerged parts over disjoint key sets (a paged
# cache's split attention); the default is dense attention within each sequence.
AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], "torch.Tensor | PartialAttention"]
# rope(x) -> x rotated, x [B, T, H, D]
RopeFn = Callable[[torch.Tensor], torch.Tensor]


def dense_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # SDPA wants [B, H, T, D]; scale defaults to 1/sqrt(D) as in the spec.
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
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
    """Multi-head self-attention's projections; q/k LayerNorm (aggregator only) runs before RoPE
    (spec 7). The block calls attention itself, between `heads` and `proj`."""

    def __init__(self, dim: int, num_heads: int, qk_norm: bool):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.q_norm = nn.LayerNorm(self.head_dim, eps=1e-5) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-5) if qk_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim)

    def heads(self, x: torch.Tensor, rope: Optional[RopeFn] = None):
        """x [B, T, C] -> q, k, v [B, T, H, D], all in the dtype of v (the matmul's under autocast:
        attention would round q and k to it anyway)."""
        B, T, _ = x.shape
        # qkv output dim is laid out [3, heads, head_dim]
        q, k, v = self.qkv(x).view(B, T, 3, self.num_heads, self.head_dim).unbind(2)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = rope(q), rope(k)
        return q.to(v.dtype), k.to(v.dtype), v


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

    def attention_inputs(self, x: torch.Tensor, rope: Optional[RopeFn] = None):
        return self.attn.heads(self.norm1(x), rope)

    def attention_output(self, x: torch.Tensor, out: "torch.Tensor | PartialAttention") -> torch.Tensor:
        """x [B, T, C] and attention's out [B, T, H, D] (or its parts, merged here: fused, the
        merge joins the kernels after it) -> the block's output."""
        if isinstance(out, PartialAttention):
            out = out.merge()
        x = x + self.ls1(self.attn.proj(out.flatten(2)))
        return x + self.ls2(self.mlp(self.norm2(x)))

    def forward(self, x: torch.Tensor, rope: Optional[RopeFn] = None,
                attend: AttendFn = dense_attend) -> torch.Tensor:
        """The two halves around attention run as the enclosing `block_kernels` context says
        (eager outside any)."""
        kernels = _block_kernels.get()
        return kernels.attention_output(self, x, attend(*kernels.attention_inputs(self, x, rope)))


class BlockKernels(NamedTuple):
    """How a block runs its two halves around attention: `Block.attention_inputs` and
    `Block.attention_output`, or the same functions compiled (`fused_halves`)."""

    attention_inputs: Callable
    attention_output: Callable


EAGER_KERNELS = BlockKernels(Block.attention_inputs, Block.attention_output)
# A context, not a parameter: the caller (the streaming session) picks the kernels once and
# enters them around a call, as it does autocast; no forward signature carries the choice.
_block_kernels: ContextVar[BlockKernels] = ContextVar("block_kernels", default=EAGER_KERNELS)


@contextlib.contextmanager
def block_kernels(kernels: BlockKernels) -> Iterator[None]:
    """Every `Block` called inside (in this thread) runs its halves with `kernels`."""
    token = _block_kernels.set(kernels)
    try:
        yield
    finally:
        _block_kernels.reset(token)


def _describe(value) -> Hashable:
    """What Dynamo specialises a compiled half on, for one argument: a tensor's shape, dtype and
    device, a block's structure (not its weights: blocks share code), RoPE's table shape and
    pairing, split attention's part shapes."""
    if isinstance(value, torch.Tensor):
        return value.shape, value.dtype, value.device
    if isinstance(value, Block):
        return (type(value.attn.q_norm), value.norm1.eps, value.attn.num_heads,
                value.attn.qkv.weight.dtype, value.attn.qkv.weight.device)
    if isinstance(value, PartialAttention):
        return PartialAttention, _describe(value.out), _describe(value.lse)
    if value is None or isinstance(value, (types.FunctionType, int, float, bool, str)):
        return value
    # Any other object (a RoPE rotation: cos, sin and the pairing function) by its attributes.
    return type(value), tuple((name, _describe(v)) for name, v in vars(value).items())


def _halves_signature(block: Block, x: torch.Tensor, extra=None) -> Hashable:
    device = x.device.type
    return (_describe(block), _describe(x), _describe(extra), torch.is_grad_enabled(),
            torch.is_inference_mode_enabled(), torch.is_autocast_enabled(device),
            torch.get_autocast_dtype(device))


@functools.cache
def fused_halves() -> BlockKernels:
    """`Block.attention_inputs` and `Block.attention_output` compiled by torch.compile (Inductor):
    layer norms, q/k norms, RoPE, casts, LayerScale, residual adds and GELU become a few fused
    kernels around the matmuls instead of ~30 separate ones per block. Compiled lazily on first
    call, once per signature (shapes, dtypes, RoPE kind, block structure; not per block: blocks
    share code, their weights are inputs), in a bounded cache that never fails
    (`model/compiled.py`); attention stays outside, so any attention function (a KV cache) can
    sit between."""
    def compile_(fn):
        return CompiledBySignature(fn, _halves_signature, dynamic=False, fullgraph=True)
    return BlockKernels(compile_(Block.attention_inputs), compile_(Block.attention_output))
