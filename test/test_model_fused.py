"""layers.fused_halves: the blocks' compiled halves around attention == the eager block.

The session enters them (`block_kernels`) around single-frame CUDA steps; Inductor compiles the
same graph for the CPU, so the equivalence (both RoPE kinds, no RoPE, mixed precision) is
checked here without a GPU.
"""
import math
import shutil

import pytest
import torch

from lingbot_ros.cache import PartialAttention
from lingbot_ros.model.layers import Block, block_kernels, dense_attend, fused_halves
from lingbot_ros.model.rope import Rope2D, Rope3D

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="torch.compile on the CPU needs a C++ compiler")


def blocks(n, qk_norm=True, eps=1e-5):
    torch.manual_seed(0)
    out = []
    for _ in range(n):
        b = Block(64, 4, 4.0, qk_norm=qk_norm, eps=eps).eval().requires_grad_(False)
        for p in b.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 1 else p.shape[-1] ** -0.5) + (p.dim() == 1) * 0.5)
        out.append(b)
    return out


def fused(block, *args):
    """The block with its halves compiled."""
    with block_kernels(fused_halves()):
        return block(*args)


def test_fused_blocks_match_eager_for_both_ropes_and_across_blocks():
    h, w, special = 2, 3, 6
    x = torch.randn(1, special + h * w, 64)
    rope2d = Rope2D(16, 100.0, special)(h, w, "cpu")
    ropes = [rope2d, None] + [Rope3D(16, (4, 6, 6), 100.0, special)(torch.tensor([float(t)], dtype=torch.float64), h, w)
                              for t in (0, 7, 1500)]
    for block in blocks(3):
        for rope in ropes:
            torch.testing.assert_close(fused(block, x, rope), block(x, rope), atol=1e-5, rtol=1e-5)


def test_fused_dinov2_blocks_match_eager():
    """The patch embedding's DINOv2 blocks: no q/k norm, no RoPE, another LayerNorm eps."""
    x = torch.randn(1, 11, 64)
    for block in blocks(2, qk_norm=False, eps=1e-6):
        torch.testing.assert_close(fused(block, x), block(x), atol=1e-5, rtol=1e-5)


def test_fused_blocks_under_bf16_autocast_match_eager():
    x = torch.randn(1, 12, 64)
    rope = Rope2D(16, 100.0, 6)(2, 3, "cpu")
    block = blocks(1)[0]
    seen = []

    def attend(q, k, v):
        seen.append((q.dtype, k.dtype, v.dtype))
        return dense_attend(q, k, v)

    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        compiled, eager = fused(block, x, rope, attend), block(x, rope, attend)
    # q and k reach attention in the matmul dtype, fused or not; the residual stream stays fp32.
    assert seen == [(torch.bfloat16,) * 3] * 2
    assert compiled.dtype == eager.dtype == torch.float32
    torch.testing.assert_close(compiled, eager, atol=2e-2, rtol=2e-2)


def split_attend(q, k, v, bounds=(0, 2, 2, 7, 12)):
    """Attention over consecutive key runs (one empty), returned unmerged as a paged cache's split
    attention does: per-run outputs and base-2 log-sum-exps."""
    outs, lses = [], []
    for lo, hi in zip(bounds, bounds[1:]):
        logits = torch.einsum("bthd,bkhd->bhtk", q.float(), k[:, lo:hi].float()) * q.shape[-1] ** -0.5
        outs.append(torch.einsum("bhtk,bkhd->bthd", logits.softmax(-1), v[:, lo:hi].float()).nan_to_num())
        lses.append((logits.logsumexp(-1) / math.log(2)).transpose(1, 2))      # [B, T, H]
    return PartialAttention(torch.stack(outs).to(v.dtype), torch.stack(lses))


def test_blocks_merge_split_attention_fused_and_eager():
    """A block handed attention in parts (PartialAttention) merges them itself; in the fused form
    the merge is compiled with the rest of the second half."""
    x = torch.randn(1, 12, 64)
    rope = Rope2D(16, 100.0, 6)(2, 3, "cpu")
    block = blocks(1)[0]
    expected = block(x, rope)
    torch.testing.assert_close(block(x, rope, split_attend), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused(block, x, rope, split_attend), expected, atol=1e-5, rtol=1e-5)
