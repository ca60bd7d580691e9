"""cache/: the FlashInfer backend against the torch backend on the same stream (bf16)."""

import pytest
import torch

from lingbot_ros.cache import CacheSpec, PagedKVCache

from helpers import GPU

pytestmark = GPU


def spec(**overrides):
    fields = dict(num_layers=2, num_heads=4, head_dim=64, tokens_per_frame=37, special_tokens=6,
                  scale_frames=2, sliding_window=3, deferred_capacity=4, special_chunk_pages=1,
                  dtype=torch.bfloat16, device="cuda")
    fields.update(overrides)
    return CacheSpec(**fields)


# (num_frames, store, defer): phase 1, keyframes past the window, non-keyframes, deferral
SCHEDULE = [(3, True, False)] + [(1, True, i % 3 == 0) for i in range(10)] + [(1, False, False)] * 2 \
    + [(1, True, True)] * 2


@pytest.mark.parametrize("flags", [dict(), dict(camera_only=True), dict(include_scale_frames=False),
                                   dict(tokens_per_frame=1005, num_heads=16)])
def test_flashinfer_matches_torch_backend(flags):
    s = spec(**flags)
    fast, slow = PagedKVCache(s, backend="flashinfer"), PagedKVCache(s, backend="torch")
    assert fast.backend == "flashinfer"
    g = torch.Generator(device="cuda").manual_seed(0)
    for step, (num_frames, store, defer) in enumerate(SCHEDULE):
        for cache in (fast, slow):
            cache.defer_evictions = defer
            cache.begin_step(num_frames, store=store)
        assert fast.step_table.host_pages.tolist() == slow.step_table.host_pages.tolist()
        for layer in range(s.num_layers):
            q, k, v = (torch.randn(num_frames * s.tokens_per_frame, s.num_heads, s.head_dim,
                                   generator=g, device="cuda", dtype=s.dtype) for _ in range(3))
            out = fast.attend(layer, q, k, v)
            expected = slow.attend(layer, q, k, v)
            assert out.shape == expected.shape == q.shape
            torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2,
                                       msg=lambda m: f"step {step} layer {layer}: {m}")
        if step == 6:
            for cache in (fast, slow):
                cache.rollback_last_frame()


@pytest.mark.parametrize("tokens, heads", [(37, 4), (1005, 16)])
def test_flashinfer_fp8_matches_torch_backend_over_the_same_e4m3_values(tokens, heads):
    """Float8 K/V: FlashInfer (each layer's e4m3 pool cast into its bf16 scratch, bf16 queries)
    against the torch backend over the same stored values, within the bf16 test's bound: both
    attend over K/V as stored, nothing else is rounded to e4m3. Through a rollback and, with
    37-token frames, a growth of the pools (the scratch follows); the pools stay byte-identical."""
    s = spec(kv_dtype=torch.float8_e4m3fn, tokens_per_frame=tokens, num_heads=heads)
    fast, slow = PagedKVCache(s, backend="flashinfer"), PagedKVCache(s, backend="torch")
    assert fast.layer_pool(0).dtype == torch.float8_e4m3fn
    g = torch.Generator(device="cuda").manual_seed(1)
    pages = {fast.layer_pool(0).shape[0]}
    for step, (num_frames, store, defer) in enumerate(SCHEDULE):
        for cache in (fast, slow):
            cache.defer_evictions = defer
            cache.begin_step(num_frames, store=store)
        for layer in range(s.num_layers):
            q, k, v = (torch.randn(num_frames * s.tokens_per_frame, s.num_heads, s.head_dim,
                                   generator=g, device="cuda", dtype=s.dtype) for _ in range(3))
            out = fast.attend(layer, q, k, v).float()
            expected = slow.attend(layer, q, k, v).float()
            torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2,
                                       msg=lambda m: f"step {step} layer {layer}: {m}")
        assert torch.equal(fast.layer_pool(0).view(torch.uint8), slow.layer_pool(0).view(torch.uint8))
        pages.add(fast.layer_pool(0).shape[0])
        if step == 6:
            for cache in (fast, slow):
                cache.rollback_last_frame()
    if tokens == 37:   # 6 specials of 37-token frames fill a page within the schedule
        assert len(pages) > 1, "the schedule must grow the pools (the scratch is resized with them)"


def test_auto_picks_flashinfer_for_half_precision_on_cuda():
    assert PagedKVCache(spec(), backend="auto").backend == "flashinfer"
    assert PagedKVCache(spec(dtype=torch.float32), backend="auto").backend == "torch"
