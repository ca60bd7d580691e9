"""StreamingSession (spec 13): phases, keyframes, rollback, reset, batch equivalence, settings."""
import pytest
import torch
import torch.nn.functional as F

from lingbot_ros.cache import CacheSpec, NothingToRollback
from lingbot_ros.model import ModelConfig, build_model
from lingbot_ros.model.camera_cache import CameraKVCache
from lingbot_ros.model.layers import EAGER_KERNELS, Block, BlockKernels, dense_attend
from lingbot_ros.stream import FrameError, SettingsError, StreamingSession, StreamSettings
from lingbot_ros.stream.frame_compute import DEPTH_HEAD_FRAMES
from lingbot_ros.stream.session import NOTHING_STORED

pytestmark = pytest.mark.usefixtures("torch_single_thread")

H, W = 28, 42          # 2 x 3 patches: 12 tokens per frame


@pytest.fixture(scope="module")
def model():
    return build_model(ModelConfig.preset("tiny"), seed=3)


@pytest.fixture(scope="module")
def frames():
    return torch.rand(16, 3, H, W, generator=torch.Generator().manual_seed(1))


def small(**kw):
    base = dict(num_scale_frames=2, scale_frames=2, sliding_window=3, camera_num_iterations=2)
    return StreamSettings(**{**base, **kw})


def run(session, frames, **kw):
    return [r for f in frames for r in session.step(f, **kw)]


def assert_same(a, b, atol=1e-6):
    assert [r.index for r in a] == [r.index for r in b]
    for x, y in zip(a, b):
        assert (x.is_keyframe, x.time_index) == (y.is_keyframe, y.time_index)
        for key in ("pose_enc", "pose_enc_list", "depth", "depth_conf", "world_points"):
            torch.testing.assert_close(getattr(x, key), getattr(y, key), rtol=0, atol=atol, msg=key)


def test_phase1_is_buffered_then_one_result_per_call(model, frames):
    session = StreamingSession(model, small(num_scale_frames=3))
    assert session.step(frames[0]) == [] and session.step(frames[1]) == []
    batch = session.step(frames[2])
    assert [r.index for r in batch] == [0, 1, 2] and all(r.is_keyframe for r in batch)
    r = session.step(frames[3])
    assert len(r) == 1 and r[0].index == 3 and r[0].time_index == 3
    res = r[0]
    assert res.pose_enc.shape == (9,) and res.extrinsic.shape == (3, 4) and res.intrinsic.shape == (3, 3)
    assert res.depth.shape == (H, W) and res.depth_conf.shape == (H, W) and res.world_points.shape == (H, W, 3)
    assert res.image_size == (W, H) and res.pose_enc_list.shape == (2, 9) and (res.depth_conf >= 1).all()


def test_keyframe_interval_and_time_index(model, frames):
    session = StreamingSession(model, small(keyframe_interval=3))
    results = run(session, frames[:9])
    assert [r.is_keyframe for r in results] == [True, True, True, False, False, True, False, False, True]
    # A non-keyframe shares its time index with the next keyframe (spec 8.2).
    assert [r.time_index for r in results] == [0, 1, 2, 3, 3, 3, 4, 4, 4]


def test_non_keyframe_leaves_no_trace(model, frames):
    a = StreamingSession(model, small())
    b = StreamingSession(model, small())
    run(a, frames[:6]), run(b, frames[:6])
    assert not a.step(frames[15], keyframe=False)[0].is_keyframe
    after_a, after_b = run(a, frames[6:9]), run(b, frames[6:9])
    for x, y in zip(after_a, after_b):
        torch.testing.assert_close(x.pose_enc, y.pose_enc, rtol=0, atol=0)
        torch.testing.assert_close(x.depth, y.depth, rtol=0, atol=0)


@pytest.mark.parametrize("defer, prefix, anchors", [(True, 8, True), (False, 3, True), (True, 7, False)])
def test_rollback_equals_never_having_seen_the_frame(model, frames, defer, prefix, anchors):
    # With deferral on the rollback also undoes the evictions the frame caused (A + Wn = 5 frames
    # fit, so frames 5.. evict); without deferral it is exact while nothing has been evicted.
    # Without anchors, the second of the two rolled-back frames evicts one frame and drops two.
    seen = StreamingSession(model, small(defer_evictions=defer, include_scale_frames=anchors))
    fresh = StreamingSession(model, small(defer_evictions=defer, include_scale_frames=anchors))
    run(seen, frames[:prefix]), run(fresh, frames[:prefix])
    before = seen.stats()
    seen.step(frames[14])
    seen.step(frames[15])
    seen.rollback_last_frame()
    seen.rollback_last_frame()
    assert seen.stats().frames_stored == before.frames_stored
    assert seen.stats().camera_cache_frames == before.camera_cache_frames
    assert_same(run(seen, frames[prefix:prefix + 4]), run(fresh, frames[prefix:prefix + 4]))


def test_rollback_limits(model, frames):
    """rollback_refusal says beforehand what rollback_last_frame does: refuse with its reason, or undo."""
    session = StreamingSession(model, small(num_scale_frames=3))
    assert session.rollback_refusal() == NOTHING_STORED
    with pytest.raises(NothingToRollback):
        session.rollback_last_frame()
    session.step(frames[0]), session.step(frames[1])
    assert session.rollback_refusal() == ""
    session.rollback_last_frame()                      # drops the newest buffered frame
    assert session.stats().frames_buffered == 1
    run(session, frames[1:3])
    assert session.rollback_refusal() == NOTHING_STORED
    with pytest.raises(NothingToRollback, match="phase-1"):
        session.rollback_last_frame()
    run(session, frames[3:4])                          # a stored phase-2 frame
    assert session.rollback_refusal() == ""
    session.rollback_last_frame()
    assert session.rollback_refusal() == NOTHING_STORED


def test_reset_equals_a_fresh_session(model, frames):
    used = StreamingSession(model, small(keyframe_interval=2))
    run(used, frames[:10])
    used.reset()
    assert_same(run(used, frames[3:12]), run(StreamingSession(model, small(keyframe_interval=2)), frames[3:12]),
                atol=0)


def test_a_new_window_after_reset_reuses_every_buffer(model):
    """What a windowed mapper needs: reset() keeps the KV pools (with the special pages they grew
    to) and the camera cache's capacity, so a stream of the same size and length grows nothing
    (buffers_version and the camera generation unchanged: captured CUDA graphs stay valid), and
    its outputs equal a fresh session's."""
    long = torch.rand(70, 3, H, W, generator=torch.Generator().manual_seed(7))
    session = StreamingSession(model, small())
    run(session, long)                          # the special stream grows, the camera cache doubles
    kv, camera = session._global_cache(), session._camera
    before = (kv.buffers_version, camera.generation, kv.stats().bytes_allocated, camera.nbytes())
    assert kv.buffers_version[0] > 0 and camera.generation == 1 and camera.capacity == 128
    stats = session.stats()
    # K and V x 8 caches (2 iterations x 4 trunk blocks) x 70 rows x 16 heads x 16 dims x 4 bytes.
    assert stats.camera_cache_bytes_in_use == 2 * 8 * 70 * 16 * 16 * 4
    session.reset()
    assert session._global_cache() is kv
    assert (kv.buffers_version, camera.generation, kv.stats().bytes_allocated, camera.nbytes()) == before
    stats = session.stats()                     # what the new stream holds: nothing yet
    assert stats.kv_cache.bytes_in_use == 0 and stats.camera_cache_bytes_in_use == 0
    again = run(session, long)
    assert (kv.buffers_version, camera.generation, kv.stats().bytes_allocated, camera.nbytes()) == before
    assert_same(again, run(StreamingSession(model, small()), long), atol=0)


def test_short_stream_closes_phase1(model, frames):
    session = StreamingSession(model, small(num_scale_frames=4, sliding_window=4))
    assert run(session, frames[:2]) == []
    assert [r.index for r in session.close_scale_phase()] == [0, 1]
    assert len(session.step(frames[2])) == 1


class CausalCameraCache:
    """Batch reference for the camera head: frame i sees frames 0..i."""

    def attend(self, slot, q, k, v):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=True).transpose(1, 2)


def test_streaming_equals_block_causal_batch(model, frames):
    """Without eviction and with one scale frame, streaming == one block-causal forward."""
    S = 7
    m = build_model(ModelConfig.preset("tiny"), seed=3)
    with torch.no_grad():
        m.aggregator.scale_token[:, 0] = m.aggregator.scale_token[:, 1]   # one scale slot for all frames
    streamed = run(StreamingSession(m, small(num_scale_frames=1, sliding_window=8)), frames[:S])

    def block_causal(layer, q, k, v):                                     # [S, P, H, D]
        P = q.shape[1]
        frame = torch.arange(S).repeat_interleave(P)
        mask = frame[:, None] >= frame[None, :]
        flat = [t.reshape(1, S * P, *t.shape[2:]).transpose(1, 2) for t in (q, k, v)]
        return F.scaled_dot_product_attention(*flat, attn_mask=mask).transpose(1, 2).reshape(q.shape)

    with torch.no_grad():
        outs = m.aggregator(frames[:S], first_frame=True, scale_slot=1,
                            time_index=torch.arange(S, dtype=torch.float64), global_attend=block_causal)
        poses = m.camera_head(outs[-1][:, 0], CausalCameraCache(), 2)
        depth, _ = m.depth_head(outs, H, W)
    torch.testing.assert_close(torch.stack([r.pose_enc for r in streamed]), poses[-1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.stack([r.depth for r in streamed]), depth[..., 0], rtol=1e-4, atol=1e-5)


class SpecNineAttention:
    """The global attention of spec 9 with plain lists, one cache per layer: append the frames,
    then (past A + Wn) evict positions [A, len - Wn) keeping their specials, keeping only the
    last Wn frames without anchors, then attend densely to specials + retained frames."""

    def __init__(self, anchors, window, specials, include_scale_frames, cross_frame_special, camera_only):
        self.A, self.Wn, self.include = anchors, window, include_scale_frames
        self.kept = 0 if not cross_frame_special else 1 if camera_only else specials
        self.retained, self.special = {}, {}

    def __call__(self, layer, q, k, v):                                   # [F, P, H, D]
        frames = self.retained.setdefault(layer, [])
        special = self.special.setdefault(layer, [])
        frames += list(zip(k, v))
        if len(frames) > self.A + self.Wn:
            special += [(fk[:self.kept], fv[:self.kept]) for fk, fv in frames[self.A:len(frames) - self.Wn]]
            if self.include:
                del frames[self.A:len(frames) - self.Wn]
            else:
                del frames[:len(frames) - self.Wn]
        keys = torch.cat([fk for fk, _ in special] + [fk for fk, _ in frames])
        values = torch.cat([fv for _, fv in special] + [fv for _, fv in frames])
        F_, P, H, D = q.shape
        out = dense_attend(q.reshape(1, F_ * P, H, D), keys[None], values[None])
        return out.view(F_, P, H, D)


@pytest.mark.parametrize("flags", [dict(include_scale_frames=False),
                                   dict(include_scale_frames=False, camera_only=True),
                                   dict(include_scale_frames=False, cross_frame_special=False),
                                   dict()])
def test_streaming_follows_spec_9_with_any_cache_flags(model, frames, flags):
    """The session against spec 9 written out with lists, on the configuration of the issue
    (anchors 3, window 4, phase 1 of 3): without anchors frames 7, 11 and 15 each keep one
    frame's specials and drop three frames; outputs from frame 11 on depend on that."""
    settings = small(num_scale_frames=3, scale_frames=3, sliding_window=4, **flags)
    streamed = run(StreamingSession(model, settings), frames)
    attend = SpecNineAttention(3, 4, model.config.num_special_tokens,
                               settings.include_scale_frames, settings.cross_frame_special, settings.camera_only)
    camera = model.camera_head.new_cache(2, "cpu")
    poses, depths = [], []
    with torch.no_grad():
        for start, stop in [(0, 3)] + [(i, i + 1) for i in range(3, len(frames))]:
            outs = model.aggregator(frames[start:stop], first_frame=start == 0, scale_slot=int(start > 0),
                                    time_index=torch.arange(start, stop, dtype=torch.float64),
                                    global_attend=attend)
            camera.begin_step(stop - start, store=True)
            poses.append(model.camera_head(outs[-1][:, 0], camera, 2)[-1])
            depths.append(model.depth_head(outs, H, W)[0][..., 0])
    torch.testing.assert_close(torch.stack([r.pose_enc for r in streamed]), torch.cat(poses), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.stack([r.depth for r in streamed]), torch.cat(depths), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("static", [False, True])
def test_camera_cache_grows_and_rolls_back(static):
    # static: single-frame calls write at a device row and mask the rows past the visible length
    # (the CUDA-graph form); a multi-frame call (phase 1) takes the sliced path either way.
    cache = CameraKVCache(num_caches=2, num_heads=2, head_dim=4, device="cpu", capacity=2, static=static)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 2, 4, generator=gen) for _ in range(3))
    cache.begin_step(2, store=True)
    torch.testing.assert_close(cache.attend(1, q, k, v), dense_attend(q, k, v))
    ks, vs = [k], [v]
    for step in range(4):
        q, k, v = (torch.randn(1, 1, 2, 4, generator=gen) for _ in range(3))
        cache.begin_step(1, store=True)
        out = cache.attend(1, q, k, v)
        ks.append(k), vs.append(v)
        torch.testing.assert_close(out, dense_attend(q, torch.cat(ks, 1), torch.cat(vs, 1)))
    assert cache.length == 6 and cache.capacity == 8 and cache.generation == 2
    cache.rollback_last_frame()
    q, k, v = (torch.randn(1, 1, 2, 4, generator=gen) for _ in range(3))
    cache.begin_step(1, store=False)
    out = cache.attend(1, q, k, v)
    torch.testing.assert_close(out, dense_attend(q, torch.cat(ks[:4] + [k], 1), torch.cat(vs[:4] + [v], 1)))
    assert cache.length == 5


def test_camera_cache_reset_keeps_its_capacity():
    cache = CameraKVCache(num_caches=2, num_heads=2, head_dim=4, device="cpu", capacity=2, static=True)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):                          # 3 frames: 2 -> 4 rows
        q, k, v = (torch.randn(1, 1, 2, 4, generator=gen) for _ in range(3))
        cache.begin_step(1, store=True)
        cache.attend(0, q, k, v)
    cache.k[1].fill_(float("nan"))              # whatever the last stream left behind
    cache.reset()
    assert (cache.length, cache.capacity, cache.generation) == (0, 4, 1)
    assert not cache.k.any() and not cache.v.any()
    q, k, v = (torch.randn(1, 1, 2, 4, generator=gen) for _ in range(3))
    cache.begin_step(1, store=True)             # the masked rows take part in the attention
    torch.testing.assert_close(cache.attend(1, q, k, v), dense_attend(q, k, v))


def test_bfloat16_runs_close_to_float32(model, frames):
    ref = run(StreamingSession(model, small()), frames[:6])
    low = run(StreamingSession(model, small(dtype="bfloat16")), frames[:6])
    for key in ("pose_enc", "depth"):
        a = torch.stack([getattr(r, key) for r in low])
        b = torch.stack([getattr(r, key) for r in ref])
        assert a.dtype == torch.float32
        assert ((a - b).norm() / b.norm()) < 0.05


def test_fp8_kv_cache_runs_close_to_float32_in_half_the_memory(model, frames):
    """kv_cache_dtype=fp8 on the CPU (K/V rounded to e4m3 in the pools, attention in float32):
    the same stream within e4m3's rounding of the float32 outputs, and pools a quarter of
    float32's (half of bf16's)."""
    ref_session = StreamingSession(model, small())
    fp8_session = StreamingSession(model, small(kv_cache_dtype="fp8"))
    ref, low = run(ref_session, frames[:8]), run(fp8_session, frames[:8])
    for key in ("pose_enc", "depth", "world_points"):
        a = torch.stack([getattr(r, key) for r in low])
        b = torch.stack([getattr(r, key) for r in ref])
        assert torch.isfinite(a).all()
        assert 0 < ((a - b).norm() / b.norm()) < 0.05, key
    full, half = (s.stats().kv_cache.bytes_allocated for s in (ref_session, fp8_session))
    assert half * 4 == full


def test_resident_bfloat16_weights_give_the_autocast_outputs(frames):
    """store_matmul_weights rounds the weights once, as autocast does at every call: same outputs."""
    masters = build_model(ModelConfig.preset("tiny"), seed=3)
    resident = build_model(ModelConfig.preset("tiny"), seed=3).store_matmul_weights(torch.bfloat16)
    assert resident.aggregator.global_blocks[0].attn.qkv.weight.dtype == torch.bfloat16
    assert resident.aggregator.global_blocks[0].norm1.weight.dtype == torch.float32
    assert resident.camera_head.trunk[0].attn.qkv.weight.dtype == torch.float32
    expected = run(StreamingSession(masters, small(dtype="bfloat16")), frames[:5])
    got = run(StreamingSession(resident, small(dtype="bfloat16")), frames[:5])
    assert_same(got, expected, atol=0)
    with pytest.raises(SettingsError, match="stored in torch.bfloat16"):
        StreamingSession(resident, small())                      # a float32 session
    assert resident.store_matmul_weights(torch.bfloat16) is resident
    with pytest.raises(ValueError, match="build the model again"):
        resident.store_matmul_weights(torch.float32)
    assert masters.store_matmul_weights(torch.float32).matmul_dtype == torch.float32


@pytest.mark.parametrize("kw, message", [
    (dict(num_scale_frames=9, scale_frames=2, sliding_window=6), "exceeds scale_frames \\+ sliding_window"),
    (dict(keyframe_interval=0), "keyframe_interval must be an int >= 1"),
    (dict(dtype="float64"), "dtype must be"),
    (dict(attention_backend="magic"), "attention_backend"),
    (dict(kv_cache_dtype="int8"), "kv_cache_dtype must be one of"),
    (dict(max_special_tokens=-1), "max_special_tokens"),
])
def test_settings_that_make_no_sense_are_refused(kw, message):
    with pytest.raises(SettingsError, match=message):
        StreamSettings(**kw)


def test_bad_frames_are_refused(model, frames):
    session = StreamingSession(model, small())
    with pytest.raises(FrameError, match="\\[3, H, W\\]"):
        session.step(frames[0, 0])
    with pytest.raises(FrameError, match="torch.Tensor.*ndarray.*Preprocessor"):
        session.step(frames[0].numpy())
    with pytest.raises(FrameError, match="multiple of the patch size"):
        session.step(torch.rand(3, 30, 42))
    session.step(frames[0])
    with pytest.raises(FrameError, match="reset\\(\\) before changing size"):
        session.step(torch.rand(3, 42, 42))
    session.reset()
    assert session.step(torch.rand(3, 42, 42)) == []


@pytest.mark.parametrize("anchors", [True, False])
def test_deferral_never_changes_outputs_even_past_its_budget(model, frames, anchors):
    # Window 3 + 2 anchors: 11 evictions in 16 frames, more than the cache's deferral budget (8),
    # so the session has to flush on its own. Without anchors: 4 steps that each leave 3 frames.
    deferred = run(StreamingSession(model, small(defer_evictions=True, include_scale_frames=anchors)), frames)
    assert_same(deferred, run(StreamingSession(model, small(include_scale_frames=anchors)), frames), atol=0)


@pytest.mark.parametrize("defer", [False, True])
def test_frame_pages_are_those_the_eviction_mode_uses(model, frames, defer):
    """In steady state all frame pages but the next frame's are in use; only a deferring session
    holds pages for its deferral budget (and its outputs do not depend on it: test above)."""
    session = StreamingSession(model, small(defer_evictions=defer))
    run(session, frames[:10])                    # 2 anchors + window 3 full, 5 frames evicted
    kv = session.stats().kv_cache
    budget = CacheSpec.deferred_capacity if defer else 0
    assert kv.anchor_pages + kv.window_pages == 5
    assert kv.free_pages + kv.pending_pages == 1 + budget


def test_embedding_is_launched_before_the_caches_bookkeeping(model, frames):
    """The patch embedding reads no cache, so every call issues it before the caches'
    begin_step: on a GPU the host's bookkeeping (and FlashInfer's plan) then overlaps it."""
    session = StreamingSession(model, small())
    order = []
    embed = model.aggregator.embed

    def recording_embed(*args, **kwargs):
        order.append("embed")
        return embed(*args, **kwargs)

    run(session, frames[:1])                    # builds the caches (phase 1 still buffering)
    cache_begin, camera_begin = session._global_cache().begin_step, session._camera.begin_step
    session._global_cache().begin_step = lambda *a, **k: (order.append("cache"), cache_begin(*a, **k))
    session._camera.begin_step = lambda *a, **k: (order.append("camera"), camera_begin(*a, **k))
    model.aggregator.embed = recording_embed
    try:
        results = run(session, frames[1:4])     # the phase-1 batch, then two phase-2 frames
    finally:
        del model.aggregator.embed
    assert len(results) == 4
    assert order == ["embed", "cache", "camera"] * 3


def test_single_frame_steps_run_the_sessions_block_kernels(model, frames):
    """The session picks its single-frame block kernels once (compiled on CUDA, eager here) and
    enters them around the aggregator's work of single-frame calls only: phase 1's batch and the
    camera head run the eager kernels."""
    calls = []

    def recording_inputs(block, *args):
        calls.append(block)
        return Block.attention_inputs(block, *args)

    session = StreamingSession(model, small())
    assert session._compute.frame_kernels is EAGER_KERNELS
    session._compute.frame_kernels = BlockKernels(recording_inputs, Block.attention_output)
    results = run(session, frames[:2])          # phase 1
    assert calls == []
    results += run(session, frames[2:4])        # two single-frame steps
    agg = model.aggregator
    per_frame = list(agg.patch_embed.blocks) + [b for pair in zip(agg.frame_blocks, agg.global_blocks)
                                                for b in pair]
    assert calls == per_frame * 2
    assert_same(results, run(StreamingSession(model, small()), frames[:4]), atol=0)
    agg.frame_blocks[0](torch.zeros(1, 12, model.config.embed_dim))   # outside a session call
    assert len(calls) == 2 * len(per_frame)


@pytest.mark.parametrize("chunk", [1, 2])
def test_phase1_depth_head_in_chunks_equals_the_whole_batch(model, frames, monkeypatch, chunk):
    """The depth head runs a few frames at a time (its fp32 maps bound phase 1's peak memory):
    every output of a phase-1 batch and the frames after it equal those of one head call."""
    import lingbot_ros.stream.frame_compute as frame_compute

    def stream(frames_at_once):
        monkeypatch.setattr(frame_compute, "DEPTH_HEAD_FRAMES", frames_at_once)
        return run(StreamingSession(model, small(num_scale_frames=5, scale_frames=5)), frames[:8])

    whole, chunked = stream(64), stream(chunk)
    assert len(whole) == 8
    assert_same(chunked, whole, atol=1e-5)


@pytest.mark.parametrize("interval", [1, 2])
def test_a_session_that_takes_a_small_one_over_continues_as_it_would(model, frames, interval):
    """The window switch prepared ahead (mapping/windows/ahead.py): a spare session whose cache
    holds only the overlap runs phase 1 and a few frames; a used session, reset, takes it over;
    every later frame (evictions included) gives what a session fed all frames gives."""
    from lingbot_ros.mapping.windows.ahead import spare_session
    settings = small(keyframe_interval=interval)
    used, reference = StreamingSession(model, settings), StreamingSession(model, settings)
    spare = spare_session(used, overlap=4)           # window 4 - 2 anchors: 2 frames
    assert spare.settings == used.settings
    run(used, frames[8:15])                          # a full earlier window: its pages go out of order
    used.reset()
    head, tail = frames[:4], frames[4:12]
    expected = run(reference, head) + run(reference, tail)
    taken = run(spare, head)
    kv = spare.stats().kv_cache   # holds the overlap and one page for a step's new frame, no more
    assert (kv.frames_stored, kv.free_pages) == ({1: 4, 2: 3}[interval], {1: 1, 2: 2}[interval])
    used.take_over(spare)
    assert used.stats().frames_seen == spare.stats().frames_seen == 4
    assert_same(taken + run(used, tail), expected, atol=0)
    assert used.stats().kv_cache.special_tokens > 0   # the tail evicted frames


def test_take_over_refuses_what_it_cannot_continue(model, frames):
    session, other = StreamingSession(model, small()), StreamingSession(model, small())
    run(other, frames[:1])
    with pytest.raises(ValueError, match="not finished phase 1"):
        session.take_over(other)
    with pytest.raises(ValueError, match="same model and settings"):
        session.take_over(StreamingSession(model, small(keyframe_interval=2)))
    run(session, frames[:3])
    run(other, frames[1:2])
    with pytest.raises(ValueError, match="reset"):
        session.take_over(other)


@pytest.mark.parametrize("layers", [1, 3, 100])
def test_phase1_in_slices_equals_phase1_at_once(model, frames, layers):
    """scale_phase_layers: the batch's layers a few at a time, then the camera head, then the
    depth head a chunk at a time, each slice its own call; results and every later frame equal
    phase 1 run at once."""
    reference, sliced = StreamingSession(model, small()), StreamingSession(model, small())
    sliced.scale_phase_layers = layers
    expected = run(reference, frames[:8])
    assert sliced.step(frames[0]) == [] and sliced.step(frames[1]) == []
    assert sliced.scale_phase_running
    with pytest.raises(RuntimeError, match="advance_scale_phase"):
        sliced.step(frames[2])
    calls, results = 0, []
    while not results:
        results, calls = sliced.advance_scale_phase(), calls + 1
    depth = len(model.aggregator.frame_blocks)
    chunks = -(-2 // DEPTH_HEAD_FRAMES)   # the depth head's: small()'s 2 scale frames
    assert calls == -(-depth // layers) + 1 + chunks and not sliced.scale_phase_running
    assert_same(results + run(sliced, frames[2:8]), expected, atol=0)


def test_a_reset_drops_phase1_in_slices(model, frames):
    session = StreamingSession(model, small())
    session.scale_phase_layers = 1
    run(session, frames[:2])
    session.advance_scale_phase()
    session.reset()
    assert not session.scale_phase_running and not session.holds_frames
    session.scale_phase_layers = 0
    assert_same(run(session, frames[:5]), run(StreamingSession(model, small()), frames[:5]), atol=0)
