"""model/compiled.py: compiled per call signature, never past Dynamo's recompile limit.

Dynamo keeps a function's compiled variants on its code object and, with fullgraph=True, fails
once there are ``recompile_limit`` (8) of them: what a node met after a few image sizes or
settings (issue 20). The limit is Dynamo's, whatever the backend, so these tests trace with a
counting pass-through backend (fast on the CPU); Inductor's kernels are test_model_fused.py's.
"""
import pytest
import torch
from torch._dynamo.exc import FailOnRecompileLimitHit

from lingbot_ros.model import layers
from lingbot_ros.model.compiled import CompiledBySignature
from lingbot_ros.model.layers import Block
from lingbot_ros.model.rope import Rope2D, Rope3D


class CountingBackend:
    """A torch.compile backend that runs the traced graph as is and counts the graphs."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def scaled(x, table):
    return (x * table).sin() + 1


def shapes(n):
    return [(torch.randn(k, 3), torch.randn(k, 3)) for k in range(1, n + 1)]


def test_plain_compile_fails_past_the_limit_and_per_signature_does_not():
    calls = shapes(12)
    plain = torch.compile(scaled, backend=CountingBackend(), fullgraph=True, dynamic=False)
    with pytest.raises(FailOnRecompileLimitHit):
        for args in calls:
            plain(*args)
    backend = CountingBackend()
    compiled = CompiledBySignature(scaled, lambda x, t: (x.shape, t.shape), backend=backend,
                                   fullgraph=True, dynamic=False)
    for _ in range(2):
        for args in calls:
            torch.testing.assert_close(compiled(*args), scaled(*args))
    assert compiled.variants == 12
    assert backend.graphs == 12          # each signature traced once, replayed the second time


def test_least_recently_used_signatures_are_dropped():
    calls = shapes(5)
    backend = CountingBackend()
    compiled = CompiledBySignature(scaled, lambda x, t: x.shape, max_variants=3, backend=backend,
                                   fullgraph=True, dynamic=False)
    for args in calls:
        torch.testing.assert_close(compiled(*args), scaled(*args))
    assert compiled.variants == 3 and backend.graphs == 5
    compiled(*calls[-1])                 # kept: no new graph
    assert backend.graphs == 5
    torch.testing.assert_close(compiled(*calls[0]), scaled(*calls[0]))   # dropped: compiled again
    assert compiled.variants == 3 and backend.graphs == 6


def test_a_signature_that_misses_a_guard_runs_eagerly_instead_of_failing():
    """A signature coarser than Dynamo's guards makes one code object recompile; past the limit
    that variant runs eagerly, with the right results."""
    backend = CountingBackend()
    compiled = CompiledBySignature(scaled, lambda x, t: "all", backend=backend, fullgraph=True, dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=2):
        for args in shapes(5):
            torch.testing.assert_close(compiled(*args), scaled(*args))
    assert backend.graphs == 2


def block(qk_norm=True, eps=1e-5):
    torch.manual_seed(0)
    return Block(64, 4, 4.0, qk_norm=qk_norm, eps=eps).eval().requires_grad_(False)


def first_half_calls():
    """What one process meets: aggregator and DINOv2 blocks, 2D RoPE (cos rank 3), 3D RoPE (rank
    4), none, several image sizes, float32 and bf16 autocast: 14 signatures."""
    special = 6
    aggregator, dinov2 = block(), block(qk_norm=False, eps=1e-6)
    calls = []
    for h, w in ((2, 3), (3, 3), (2, 5)):
        x = torch.randn(1, special + h * w, 64)
        time_index = torch.tensor([4.0], dtype=torch.float64)
        calls += [(aggregator, x, Rope2D(16, 100.0, special)(h, w, "cpu"), False),
                  (aggregator, x, Rope3D(16, (4, 6, 6), 100.0, special)(time_index, h, w), False),
                  (dinov2, x, None, False),
                  (aggregator, x, Rope2D(16, 100.0, special)(h, w, "cpu"), True)]
    x = torch.randn(2, special + 6, 64)
    calls += [(aggregator, x, Rope3D(16, (4, 6, 6), 100.0, special)(torch.tensor([1.0, 2.0], dtype=torch.float64), 2, 3), False),
              (dinov2, x, None, True)]
    return calls


def run_first_half(fn, blk, x, rope, autocast):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast, cache_enabled=False):
        return fn(blk, x, rope)


def test_block_halves_signature_covers_what_dynamo_specialises_on():
    """The real first half (`Block.attention_inputs`) over the signatures one process meets: the
    code compiled as the blocks' fused halves are fails past 8; per signature each compiles
    exactly once (the signature is as fine as Dynamo's guards: no variant recompiles) and equals
    the eager half."""
    calls = first_half_calls()
    plain = torch.compile(Block.attention_inputs, backend=CountingBackend(), fullgraph=True, dynamic=False)
    with pytest.raises(FailOnRecompileLimitHit):
        for blk, x, rope, autocast in calls:
            run_first_half(plain, blk, x, rope, autocast)
    backend = CountingBackend()
    compiled = CompiledBySignature(Block.attention_inputs, layers._halves_signature, backend=backend,
                                   fullgraph=True, dynamic=False)
    with torch.inference_mode():
        for _ in range(2):
            for blk, x, rope, autocast in calls:
                got = run_first_half(compiled, blk, x, rope, autocast)
                expected = run_first_half(Block.attention_inputs, blk, x, rope, autocast)
                for a, b in zip(got, expected):
                    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert compiled.variants == len(calls) == 14
    assert backend.graphs == 14
