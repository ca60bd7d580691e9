"""cache/: one mechanism at a time (spec, page pool, patch stream, special stream, cache)."""
import math

import pytest
import torch

from lingbot_ros.cache import (CacheError, CacheExhausted, CacheSpec, NothingToRollback,
                               PagedKVCache, SpecialStreamFull)
from lingbot_ros.cache.page_pool import PagePool
from lingbot_ros.cache.patch_stream import PatchStream
from lingbot_ros.cache.special_stream import SpecialStream


def tiny_spec(**overrides):
    fields = dict(num_layers=2, num_heads=2, head_dim=4, tokens_per_frame=5, special_tokens=2,
                  scale_frames=1, sliding_window=2, deferred_capacity=1, special_chunk_pages=1,
                  dtype=torch.float64)
    fields.update(overrides)
    return CacheSpec(**fields)


def run_step(cache, num_frames=1, store=True, seed=0):
    """begin_step + attend on every layer with random tensors; returns the outputs."""
    s = cache.spec
    g = torch.Generator().manual_seed(seed)
    shape = (num_frames * s.tokens_per_frame, s.num_heads, s.head_dim)
    cache.begin_step(num_frames, store=store)
    return [cache.attend(layer, *(torch.randn(shape, generator=g, dtype=s.dtype) for _ in range(3)))
            for layer in range(s.num_layers)]


# ---- CacheSpec ------------------------------------------------------------------------------

def test_released_sizes_match_the_spec():
    spec = CacheSpec(num_layers=24, num_heads=16, head_dim=64, tokens_per_frame=1005,
                     dtype=torch.bfloat16, device="cpu")
    assert spec.page_bytes == 24 * 1005 * 1024 * 2 * 2          # 98.8 MB per retained frame
    assert spec.specials_per_evicted_frame * spec.token_bytes == 576 * 1024  # per evicted frame
    assert spec.layer_page_bytes * 24 == spec.page_bytes
    assert spec.frame_pages == 8 + 64 + 1 + 8 and spec.scratch_page == spec.frame_pages
    assert spec.base_pages == spec.patch_pages + 4


@pytest.mark.parametrize("field, value, words", [
    ("num_heads", 0, "num_heads must be a positive int"),
    ("special_tokens", 9, "exceeds tokens_per_frame"),
    ("scale_frames", -1, "scale_frames must be an int >= 0"),
    ("camera_only", 1, "camera_only must be a bool"),
    ("max_special_tokens", -5, "max_special_tokens must be None or an int >= 0"),
    ("dtype", torch.int32, "floating torch.dtype"),
    ("kv_dtype", torch.float16, "kv_dtype must be None"),
    ("split_window_pages", 0, "split_window_pages must be None or a positive int"),
])
def test_spec_rejects_bad_fields_saying_which(field, value, words):
    with pytest.raises(ValueError, match=words):
        tiny_spec(**{field: value})


def test_spec_normalises_device():
    assert tiny_spec(device="cpu").device == torch.device("cpu")


def test_full_window_pages_follow_the_window_unless_given():
    assert tiny_spec(scale_frames=2, sliding_window=3).full_window_pages == 5
    assert tiny_spec(scale_frames=2, sliding_window=3, include_scale_frames=False).full_window_pages == 3
    assert tiny_spec(scale_frames=2, sliding_window=1, split_window_pages=5).full_window_pages == 5


# ---- PagePool -------------------------------------------------------------------------------

def test_page_pool_accounting_and_reuse_order():
    pool = PagePool(4)
    assert pool.allocate(2) == [0, 1] and pool.num_free == 2
    pool.free([1, 0])
    assert pool.num_free == 4
    assert pool.allocate(1) == [0]           # the last page freed is reused first
    with pytest.raises(CacheExhausted, match="need 4 free pages but only 3 of 4 are free"):
        pool.allocate(4)
    assert pool.num_free == 3                # a refused allocation takes nothing
    pool.reset()
    assert sorted(pool.free_pages()) == [0, 1, 2, 3]


def test_page_pool_catches_double_free():
    pool = PagePool(2)
    with pytest.raises(AssertionError, match="freed twice"):
        pool.free([0])


# ---- PatchStream ----------------------------------------------------------------------------

def window_seqs(stream):
    return [f.seq for f in stream.anchors], [f.seq for f in stream.window]


def step(stream, defer=False):
    """Append one frame (page = its seq) and evict; returns the seqs that left, oldest first."""
    eviction = stream.eviction_for(1)
    stream.append([stream.next_seq])
    stream.evict(eviction, 0, defer)
    return [f.seq for f in eviction.frames]


def test_window_eviction_keeps_anchors_and_newest():
    stream = PatchStream(scale_frames=2, sliding_window=3, include_scale_frames=True)
    for _ in range(5):                       # frames 0..4: 5 <= A + Wn, nobody leaves
        assert step(stream) == []
    assert window_seqs(stream) == ([0, 1], [2, 3, 4])
    assert stream.eviction_for(1).dropped == ()
    assert step(stream) == [2]               # frame 5: frame 2 leaves (oldest non-anchor)
    assert step(stream) == [3]               # frame 6: frame 3 leaves
    assert window_seqs(stream) == ([0, 1], [4, 5, 6])


def test_without_anchors_every_eviction_drops_the_oldest_scale_frames():
    stream = PatchStream(scale_frames=2, sliding_window=2, include_scale_frames=False)
    for _ in range(4):                       # frames 0..3 stored: A + Wn, no anchors
        assert step(stream) == []
    assert window_seqs(stream) == ([], [0, 1, 2, 3])
    eviction = stream.eviction_for(1)        # frame 4: positions [0, 2) dropped, [2, 3) evicted
    assert [f.seq for f in eviction.dropped] == [0, 1] and [f.seq for f in eviction.evicted] == [2]
    assert step(stream) == [0, 1, 2]
    assert window_seqs(stream) == ([], [3, 4])
    assert step(stream) == []                # frame 5: 3 stored <= A + Wn, nobody leaves
    assert step(stream) == []                # frame 6: 4 stored
    eviction = stream.eviction_for(1)        # frame 7: the same split again
    assert [f.seq for f in eviction.dropped] == [3, 4] and [f.seq for f in eviction.evicted] == [5]
    assert step(stream) == [3, 4, 5]
    assert window_seqs(stream) == ([], [6, 7])


def test_rollback_undoes_pending_evictions_only():
    stream = PatchStream(scale_frames=1, sliding_window=1, include_scale_frames=True)
    for _ in range(2):                       # frames 0 (anchor), 1
        step(stream)
    assert step(stream, defer=True) == [1]   # frame 2: frame 1 pending
    assert stream.pending == [1]
    assert stream.pop_newest() == (2, 0)     # frame 2 goes, frame 1 comes back
    assert window_seqs(stream) == ([0], [1]) and stream.pending == []
    assert step(stream, defer=True) == [1]   # frame 2 again, frame 1 pending
    assert stream.take_pending() == [1]      # executed: no longer undoable
    stream.pop_newest()                      # frame 2 goes, frame 1 stays evicted
    assert window_seqs(stream) == ([0], []) and stream.next_seq == 2


def test_appending_frames_that_would_evict_each_other_is_refused():
    stream = PatchStream(scale_frames=1, sliding_window=2, include_scale_frames=True)
    step(stream)
    with pytest.raises(ValueError, match="append at most sliding_window=2"):
        stream.eviction_for(3)               # 4 > A + Wn and the 3 new frames > Wn
    assert stream.eviction_for(2).frames == ()   # 3 frames: no eviction


# ---- SpecialStream --------------------------------------------------------------------------

def test_special_stream_packs_tokens_and_grows_in_chunks():
    stream = SpecialStream(tokens_per_page=4, first_page=10, chunk_pages=2, max_tokens=None)
    assert stream.pages_to_grow(8) == 0      # 2 pages allocated
    assert stream.append(3) == [(10, 0), (10, 1), (10, 2)]
    assert stream.last_page_len == 3 and stream.visible_pages() == [10]
    assert stream.append(2) == [(10, 3), (11, 0)]
    assert stream.pages_to_grow(4) == 2      # 9 tokens need 3 pages: one chunk more
    assert stream.pages_to_grow(20) == 6     # 25 tokens need 7 pages: three chunks more
    stream.truncate(2)
    assert stream.num_tokens == 3 and stream.used_pages == 1


def test_special_stream_cap():
    stream = SpecialStream(tokens_per_page=4, first_page=0, chunk_pages=1, max_tokens=5)
    stream.check_room(5)
    with pytest.raises(SpecialStreamFull, match="holds 0 of max_special_tokens=5"):
        stream.check_room(6)


# ---- PagedKVCache ---------------------------------------------------------------------------

def dense_attention(q, keys, values):
    scores = torch.einsum("thd,shd->hts", q, keys) / q.shape[-1] ** 0.5
    return torch.einsum("hts,shd->thd", scores.softmax(-1), values)


def test_float32_matches_dense_reference():
    spec = tiny_spec(dtype=torch.float32, num_layers=1, tokens_per_frame=9, special_tokens=6,
                     scale_frames=2, sliding_window=2)
    cache = PagedKVCache(spec, backend="torch")
    g = torch.Generator().manual_seed(1)
    frames, specials = [], []
    for _ in range(7):
        q, k, v = (torch.randn(9, 2, 4, generator=g) for _ in range(3))
        cache.begin_step(1)
        frames.append((k, v))
        if len(frames) > 4:                  # A + Wn passed: the oldest non-anchor leaves
            gone = frames.pop(2)
            specials.append((gone[0][:6], gone[1][:6]))
        out = cache.attend(0, q, k, v)
        keys = torch.cat([f[0] for f in frames] + [s[0] for s in specials])
        values = torch.cat([f[1] for f in frames] + [s[1] for s in specials])
        torch.testing.assert_close(out, dense_attention(q, keys, values), atol=1e-5, rtol=1e-5)


def test_float8_storage_is_attention_over_e4m3_rounded_keys_and_values():
    """kv_dtype=float8: the pools hold K/V rounded to e4m3 (saturating at +-448), and attention
    over them equals the dense reference over the rounded values, through evictions (special
    copies in float8), a non-keyframe, a rollback and pool growth."""
    fp8 = torch.float8_e4m3fn
    spec = tiny_spec(dtype=torch.float32, kv_dtype=fp8, num_layers=1, tokens_per_frame=9,
                     special_tokens=6, scale_frames=2, sliding_window=2, special_chunk_pages=1)
    cache = PagedKVCache(spec, backend="torch")
    assert cache.layer_pool(0).dtype == fp8 and spec.token_bytes * 4 == tiny_spec(
        dtype=torch.float32, num_layers=1).token_bytes
    rounded = lambda x: x.clamp(-448, 448).to(fp8).float()
    g = torch.Generator().manual_seed(2)
    frames, specials = [], []
    for step in range(9):
        q, k, v = (torch.randn(9, 2, 4, generator=g) * 30 for _ in range(3))
        k[0, 0, 0] = 1e4                     # past e4m3's range: saturates, never NaN
        store = step != 5
        cache.begin_step(1, store=store)
        current = [(rounded(k), rounded(v))]
        if store:
            frames.append(current[0])
            current = []
            if len(frames) > 4:
                gone = frames.pop(2)
                specials.append((gone[0][:6], gone[1][:6]))
        out = cache.attend(0, q, k, v)
        seen = frames + current
        keys = torch.cat([f[0] for f in seen] + [s[0] for s in specials])
        values = torch.cat([f[1] for f in seen] + [s[1] for s in specials])
        torch.testing.assert_close(out, dense_attention(q, keys, values), atol=1e-4, rtol=1e-4)
        assert torch.isfinite(out).all()
    assert cache.stats().special_pages > 1   # the special stream grew: its float8 pages were copied


@pytest.mark.parametrize("flags, per_frame", [
    (dict(), 2), (dict(camera_only=True), 1), (dict(cross_frame_special=False), 0)])
def test_specials_left_by_each_evicted_frame(flags, per_frame):
    cache = PagedKVCache(tiny_spec(**flags), backend="torch")
    for seed in range(6):                    # frames 0..5: frames 1, 2, 3 evicted
        run_step(cache, seed=seed)
    assert cache.stats().special_tokens == 3 * per_frame


class NoAnchorStream:
    """Drives a cache frame by frame, remembering each frame's page and layer-0 keys."""

    def __init__(self, spec):
        self.cache = PagedKVCache(spec, backend="torch")
        self.page_of, self.keys = {}, {}
        self.next_frame = 0

    def store(self, count=1):
        s, cache = self.cache.spec, self.cache
        g = torch.Generator().manual_seed(self.next_frame)
        shape = (count * s.tokens_per_frame, s.num_heads, s.head_dim)
        cache.begin_step(count)
        frames = range(self.next_frame, self.next_frame + count)
        self.page_of.update(zip(frames, cache.step_table.write_pages.tolist()))
        for layer in range(s.num_layers):
            q, k, v = (torch.randn(shape, generator=g, dtype=s.dtype) for _ in range(3))
            cache.attend(layer, q, k, v)
            if layer == 0:
                self.keys.update(zip(frames, k.view(count, s.tokens_per_frame, s.num_heads, s.head_dim)))
        self.next_frame += count

    def check(self, retained, specials_of, pending=()):
        """retained: frames kept whole, oldest first; specials_of: frames whose specials are in
        the special stream, in eviction order; pending: left frames whose pages wait for flush."""
        s, cache = self.cache.spec, self.cache
        census, stats = cache.page_census(), cache.stats()
        assert census["anchor"] == []                       # no anchors without include_scale_frames
        assert census["window"] == [self.page_of[f] for f in retained]
        assert census["pending"] == [self.page_of[f] for f in pending]
        # Every page not retained or pending is back in the pool.
        assert stats.free_pages == s.frame_pages - len(retained) - len(pending)
        per_frame = s.specials_per_evicted_frame
        assert stats.special_tokens == per_frame * len(specials_of)
        if per_frame and specials_of:
            rows = cache.layer_pool(0)[s.patch_pages:, 0].reshape(-1, s.num_heads, s.head_dim)
            expected = torch.cat([self.keys[f][:per_frame] for f in specials_of])
            assert torch.equal(rows[:stats.special_tokens], expected)


@pytest.mark.parametrize("flags", [dict(), dict(camera_only=True), dict(cross_frame_special=False)])
def test_no_anchors_worked_example_of_spec_9(flags):
    """include_scale_frames=False, A = 3, Wn = 4, phase 1 of 3 frames: every eviction keeps the
    specials of the frame at position A and drops the A frames before it, so the retained
    frames oscillate between Wn and A + Wn. (2 specials per frame, 1 with camera_only, none
    without cross_frame_special.)"""
    run = NoAnchorStream(tiny_spec(scale_frames=3, sliding_window=4, include_scale_frames=False,
                                   deferred_capacity=0, **flags))
    run.store(3)                             # phase 1: frames 0-2
    run.check(retained=[0, 1, 2], specials_of=[])
    for frame in range(3, 7):                # frames 3-6: up to A + Wn = 7 retained, nobody leaves
        run.store()
        run.check(retained=list(range(frame + 1)), specials_of=[])
    run.store()                              # frame 7: 8 > 7; frame 3 evicted, 0-2 dropped
    run.check(retained=[4, 5, 6, 7], specials_of=[3])
    for frame in range(8, 11):               # frames 8-10: appended, nobody leaves
        run.store()
        run.check(retained=list(range(4, frame + 1)), specials_of=[3])
    run.store()                              # frame 11: frame 7 evicted, 4-6 dropped
    run.check(retained=[8, 9, 10, 11], specials_of=[3, 7])
    for frame in range(12, 15):              # frames 12-14: appended, nobody leaves
        run.store()
    run.check(retained=[8, 9, 10, 11, 12, 13, 14], specials_of=[3, 7])
    run.store()                              # frame 15: frame 11 evicted, 8-10 dropped
    run.check(retained=[12, 13, 14, 15], specials_of=[3, 7, 11])


def test_no_anchors_deferred_eviction_rolls_back_exactly():
    """The same stream with deferral: frame 11 leaves frames 4-7 pending (7's specials are in
    the stream at once); its rollback brings back all four and takes 7's specials off."""
    run = NoAnchorStream(tiny_spec(scale_frames=3, sliding_window=4, include_scale_frames=False,
                                   deferred_capacity=4))
    run.store(3)                             # frames 0-2
    for _ in range(8):                       # frames 3-10 (frame 7: 3 evicted, 0-2 dropped)
        run.store()
    run.cache.defer_evictions = True
    run.store()                              # frame 11: 7 evicted, 4-6 dropped, all pending
    run.check(retained=[8, 9, 10, 11], specials_of=[3, 7], pending=[4, 5, 6, 7])
    run.cache.rollback_last_frame()          # frame 11 gone; 4-7 back, 7's specials gone
    run.check(retained=[4, 5, 6, 7, 8, 9, 10], specials_of=[3])
    run.next_frame = 11
    run.store()                              # frame 11 again
    run.check(retained=[8, 9, 10, 11], specials_of=[3, 7], pending=[4, 5, 6, 7])
    assert run.cache.flush() == 4            # executed: the four pages are free now
    run.check(retained=[8, 9, 10, 11], specials_of=[3, 7])


def test_no_anchors_deferral_budget_below_one_eviction_is_refused():
    spec = tiny_spec(scale_frames=3, sliding_window=4, include_scale_frames=False, deferred_capacity=3)
    assert spec.frames_per_eviction == 4     # one evicted + A dropped
    run = NoAnchorStream(spec)
    run.store(3)
    for _ in range(4):                       # frames 3-6: A + Wn retained
        run.store()
    run.cache.defer_evictions = True
    before = run.cache.stats()
    with pytest.raises(CacheExhausted, match="evicts 4 more, over deferred_capacity=3"):
        run.cache.begin_step(1)              # frame 7 would leave 4 frames pending
    assert run.cache.stats() == before


def test_special_stream_growth_keeps_contents():
    cache = PagedKVCache(tiny_spec(), backend="torch")   # 1 special page of 5 tokens
    for seed in range(5):                    # frames 3, 4 evict frames 1, 2: 4 tokens
        run_step(cache, seed=seed)
    first = cache.spec.patch_pages
    before = [cache.layer_pool(i)[first].clone() for i in range(2)]
    run_step(cache, seed=5)                  # frame 5 evicts frame 3: 6 tokens, one more page
    assert cache.stats().special_pages == 2
    for layer in range(2):
        assert torch.equal(cache.layer_pool(layer)[first, :, :4], before[layer][:, :4])


def test_reset_keeps_every_buffer_and_a_rerun_grows_nothing():
    cache = PagedKVCache(tiny_spec(), backend="torch")   # 1 special page of 5 tokens
    for seed in range(7):                    # frames 3-6 evict frames 1-4: 8 tokens, 2 pages
        run_step(cache, seed=seed)
    before = cache.stats()
    version, shapes = cache.buffers_version, [cache.layer_pool(i).shape for i in range(2)]
    assert before.special_pages == 2 and version[0] == 1   # the pools grew once
    cache.reset()                            # empty, nothing reallocated, nothing grown
    after = cache.stats()
    assert (after.frames_stored, after.special_tokens, after.pending_pages) == (0, 0, 0)
    assert after.free_pages == cache.spec.frame_pages
    assert after.special_pages == 2 and after.bytes_allocated == before.bytes_allocated
    assert cache.buffers_version == version
    assert all(not cache.layer_pool(i).any() for i in range(2))   # zeroed, as a fresh cache
    fresh = PagedKVCache(tiny_spec(), backend="torch")
    for seed in range(7):                    # the same stream again: same outputs, no growth
        for got, expected in zip(run_step(cache, seed=seed), run_step(fresh, seed=seed)):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert cache.buffers_version == version
    assert [cache.layer_pool(i).shape for i in range(2)] == shapes
    assert fresh.buffers_version[0] == 1     # the fresh cache had to grow


def test_cap_refuses_before_any_change():
    cache = PagedKVCache(tiny_spec(max_special_tokens=3), backend="torch")
    for seed in range(4):                    # frame 3 evicts frame 1: 2 tokens
        run_step(cache, seed=seed)
    before = (cache.stats(), cache.page_census(), cache.step_table)
    with pytest.raises(SpecialStreamFull, match="max_special_tokens=3"):
        cache.begin_step(1)                  # frame 4 would evict frame 2: 4 tokens > 3
    assert (cache.stats(), cache.page_census(), cache.step_table) == before


def test_deferred_evictions_beyond_capacity_are_refused_until_flush():
    cache = PagedKVCache(tiny_spec(deferred_capacity=1), backend="torch")
    cache.defer_evictions = True
    for seed in range(4):                    # frame 3 evicts frame 1 (pending)
        run_step(cache, seed=seed)
    before = cache.stats()
    with pytest.raises(CacheExhausted, match="call flush"):
        cache.begin_step(1)                  # would evict frame 2: 2 pending > 1
    assert cache.stats() == before
    assert cache.flush() == 1
    run_step(cache, seed=9)
    assert cache.stats().pending_pages == 1


def test_non_deferred_step_frees_earlier_pending_pages():
    cache = PagedKVCache(tiny_spec(), backend="torch")
    cache.defer_evictions = True
    for seed in range(4):
        run_step(cache, seed=seed)
    assert cache.stats().pending_pages == 1
    cache.defer_evictions = False
    run_step(cache, seed=4)
    assert cache.stats().pending_pages == 0
    cache.rollback_last_frame()              # executed evictions are not undone
    assert cache.num_stored_frames == 2


def test_non_keyframe_sees_itself_but_is_not_stored():
    cache = PagedKVCache(tiny_spec(), backend="torch")
    run_step(cache, seed=0)
    before = cache.stats()
    run_step(cache, store=False, seed=1)
    assert cache.stats() == before
    table = cache.step_table
    assert table.host_pages.tolist()[-1] == cache.spec.scratch_page
    assert table.num_kv_tokens == 2 * cache.spec.tokens_per_frame
    with pytest.raises(ValueError, match="takes 1 frame"):
        cache.begin_step(2, store=False)


def test_phase_one_step_of_several_frames():
    cache = PagedKVCache(tiny_spec(), backend="torch")
    outputs = run_step(cache, num_frames=3)  # A + Wn frames at once
    assert outputs[0].shape == (15, 2, 4) and cache.num_stored_frames == 3
    with pytest.raises(ValueError, match="would evict frames of the same step"):
        cache.begin_step(3)


def test_page_shortage_is_refused_with_counts():
    cache = PagedKVCache(tiny_spec(sliding_window=4, scale_frames=0, deferred_capacity=0),
                         backend="torch")                # 5 frame pages
    run_step(cache, num_frames=4)
    with pytest.raises(CacheExhausted, match="needs 2 pages but 1 are free"):
        cache.begin_step(2)


def test_misuse_errors_say_what_to_do():
    cache = PagedKVCache(tiny_spec(), backend="torch")
    with pytest.raises(NothingToRollback, match="no frame is stored"):
        cache.rollback_last_frame()
    q = torch.zeros(5, 2, 4, dtype=torch.float64)
    with pytest.raises(CacheError, match="call begin_step"):
        cache.attend(0, q, q, q)
    run_step(cache)
    cache.flush()
    with pytest.raises(CacheError, match="call begin_step"):
        cache.attend(0, q, q, q)             # flush ended the step
    cache.begin_step(1)
    with pytest.raises(ValueError, match="expected 5 tokens"):
        cache.attend(0, q[:4], q[:4], q[:4])
    with pytest.raises(ValueError, match="num_frames must be a positive int"):
        cache.begin_step(0)


def test_backend_choice():
    assert PagedKVCache(tiny_spec(), backend="auto").backend == "torch"   # CPU
    with pytest.raises(ValueError, match="unknown attention backend"):
        PagedKVCache(tiny_spec(), backend="sdpa")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        PagedKVCache(tiny_spec(), backend="flashinfer")


def test_stats_bytes():
    spec = tiny_spec()
    cache = PagedKVCache(spec, backend="torch")
    assert cache.stats().bytes_allocated == spec.base_pages * spec.page_bytes
    for seed in range(4):                    # 3 stored, 1 evicted (2 specials)
        run_step(cache, seed=seed)
    assert cache.stats().bytes_in_use == 3 * spec.page_bytes + 2 * spec.token_bytes


def test_partial_attention_merge_equals_attention_over_the_union():
    """The KV-split merge of the FlashInfer backend, on the CPU: attention over disjoint key runs
    (an empty one included) with base-2 log-sum-exps, merged, == attention over all keys."""
    from lingbot_ros.cache import PartialAttention
    g = torch.Generator().manual_seed(0)
    T, H, D = 5, 3, 8
    q, k, v = (torch.randn(n, H, D, generator=g) for n in (T, 23, 23))
    scale = D ** -0.5
    outs, lses = [], []
    for lo, hi in [(0, 7), (7, 7), (7, 16), (16, 23)]:
        logits = torch.einsum("thd,khd->htk", q, k[lo:hi]) * scale              # [H, T, n]
        outs.append(torch.einsum("htk,khd->thd", logits.softmax(-1), v[lo:hi]).nan_to_num())
        lses.append((logits.logsumexp(-1) / math.log(2)).transpose(0, 1))      # [T, H], -inf if empty
    merged = PartialAttention(torch.stack(outs), torch.stack(lses)).merge()
    expected = torch.einsum("htk,khd->thd", (torch.einsum("thd,khd->htk", q, k) * scale).softmax(-1), v)
    torch.testing.assert_close(merged, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("queries, heads, head_dim, sms, splits", [
    (1005, 16, 64, 132, 4),    # released model on an H200: 96 work items -> 4 x 96 in 3 waves
    (6336, 16, 64, 132, 1),    # 528 items: 4 full waves already
    (37, 4, 64, 132, 8),       # far too little work: as many splits as allowed
])
def test_kv_splits_fill_the_gpu(queries, heads, head_dim, sms, splits):
    from lingbot_ros.cache.attention_flashinfer import kv_splits_for
    assert kv_splits_for(queries, heads, head_dim, sms) == splits


# ---- take_over (a window switch prepared in a small cache) ----------------------------------

@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn])
@pytest.mark.parametrize("frames, non_keyframe", [(1, False), (3, False), (3, True), (4, False)])
def test_a_cache_that_takes_another_over_continues_as_the_other_would(frames, non_keyframe, kv_dtype):
    """A small cache (window 2, no deferral pages) runs a phase-1 step and single frames; a large
    one (window 5, deferral) at a later page layout takes it over: every later step, evictions
    included, gives what the small one's own next steps give, and the small one is unchanged."""
    dtype = torch.float32 if kv_dtype else torch.float64
    small = PagedKVCache(tiny_spec(scale_frames=2, sliding_window=2, deferred_capacity=0, dtype=dtype,
                                   kv_dtype=kv_dtype))
    large = PagedKVCache(tiny_spec(scale_frames=2, sliding_window=5, deferred_capacity=3, dtype=dtype,
                                   kv_dtype=kv_dtype))
    reference = PagedKVCache(tiny_spec(scale_frames=2, sliding_window=5, deferred_capacity=3, dtype=dtype,
                                       kv_dtype=kv_dtype))
    for cache in (large, reference):   # earlier frames: the large cache's pages are reused, out of order
        run_step(cache, 2, seed=1)
        run_step(cache, seed=2)
        cache.reset()
    # Phase 1's two frames at once, then single frames (the first a non-keyframe if asked).
    steps = [(1, True)] if frames == 1 else [(2, True)] + [(1, i > 0 or not non_keyframe) for i in range(frames - 2)]
    for seed, (n, store) in enumerate(steps):
        run_step(small, n, store=store, seed=10 + seed)
        run_step(reference, n, store=store, seed=10 + seed)
    before = small.page_census()
    large.take_over(small)
    assert small.page_census() == before
    assert large.stats().frames_stored == small.stats().frames_stored == reference.stats().frames_stored
    for seed in range(6):   # past the window: evictions and special tokens from here on
        store = seed != 2
        for mine, theirs in zip(run_step(large, store=store, seed=50 + seed), run_step(reference, store=store, seed=50 + seed)):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    assert large.stats() == reference.stats()


def test_take_over_refuses_before_any_change():
    small, large = PagedKVCache(tiny_spec(sliding_window=1)), PagedKVCache(tiny_spec(sliding_window=3))
    run_step(large)
    run_step(small)
    with pytest.raises(CacheError, match="reset it first"):
        large.take_over(small)
    large.reset()
    for seed in range(3):
        run_step(small, seed=seed)     # 1 anchor + window 1: the third frame evicts one
    census = large.page_census()
    with pytest.raises(CacheError, match="has evicted frames"):
        large.take_over(small)
    assert large.page_census() == census and large.stats().frames_stored == 0
    with pytest.raises(CacheError, match="keep anchors differently"):
        PagedKVCache(tiny_spec(scale_frames=2)).take_over(PagedKVCache(tiny_spec()))
    with pytest.raises(CacheError, match="pages differ"):
        PagedKVCache(tiny_spec(head_dim=8)).take_over(PagedKVCache(tiny_spec()))
