"""stream/multi_session.py: N streams batched in one step == N separate StreamingSessions.

A random program gives every stream, at every step, one action: no frame (absent from the
batch), a frame (interval rule, or forced keyframe / non-keyframe), a rollback, a flush, a reset
or a window switch (a reset and the stream's last frame again, as the mapping layer's windowed
policy does). The batched session runs every step's frames as one call; the reference runs each
stream in a session of its own. Every output of every frame must agree within 1e-5 of its scale
(float32, CPU; only the shapes of the matmuls differ: `assert_close`).
"""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lingbot_ros.cache import NothingToRollback
from lingbot_ros.model import ModelConfig, build_model
from lingbot_ros.stream import FrameError, MultiStreamSession, StreamFrame, StreamingSession, StreamSettings

pytestmark = pytest.mark.usefixtures("torch_single_thread")

H, W = 28, 42          # 2 x 3 patches: 12 tokens per frame
FRAMES_PER_STREAM = 40
OUTPUTS = ("pose_enc", "pose_enc_list", "extrinsic", "intrinsic", "depth", "depth_conf", "world_points", "image")
ACTIONS = ("absent", "frame", "frame", "frame", "keyframe", "non_keyframe", "rollback", "flush", "reset", "switch")


@pytest.fixture(scope="module")
def model():
    return build_model(ModelConfig.preset("tiny"), seed=3)


@pytest.fixture(scope="module")
def frames():
    g = torch.Generator().manual_seed(7)
    return torch.rand(3, FRAMES_PER_STREAM, 3, H, W, generator=g)   # [stream, frame, 3, H, W]


stream_settings = st.builds(
    StreamSettings, num_scale_frames=st.integers(1, 2), scale_frames=st.integers(1, 2),
    sliding_window=st.integers(2, 3), camera_num_iterations=st.just(2),
    keyframe_interval=st.integers(1, 3), defer_evictions=st.booleans(),
    include_scale_frames=st.booleans(), camera_only=st.booleans())


def assert_close(a, b, what):
    """|a - b| <= 1e-5 * (scale + |b|), scale = max |b| of the tensor: spec 18's tolerance form at
    1e-5. (Measured: pose, depth, confidence and points differ by at most 2.6e-6 absolute.)"""
    a, b = a.double(), b.double()
    error = (a - b).abs() - 1e-5 * (b.abs().max() + b.abs())
    assert error.max() <= 0, f"{what}: max |a - b| {(a - b).abs().max():.3g}, max |b| {b.abs().max():.3g}"


def camera_of(K, image_size):
    """The FoVs (radians) and principal point an intrinsic matrix encodes. The focal lengths are
    1/tan of the FoV: random weights give FoVs near 0 (focal lengths up to 2e7 px), where a FoV
    within 1e-5 gives a focal length only within 1e-5 relative to the FoV's size."""
    W, H = image_size
    fov = torch.stack([2 * torch.atan(H / 2 / K[1, 1]), 2 * torch.atan(W / 2 / K[0, 0])])
    return torch.cat([fov, K[:2, 2]])


def assert_same(got, expected, where):
    assert [r.index for r in got] == [r.index for r in expected], where
    for a, b in zip(got, expected):
        assert (a.is_keyframe, a.time_index, a.image_size) == (b.is_keyframe, b.time_index, b.image_size), where
        for key in OUTPUTS:
            x, y = getattr(a, key), getattr(b, key)
            if key == "intrinsic":
                x, y = camera_of(x, a.image_size), camera_of(y, b.image_size)
            assert_close(x, y, f"{where} frame {a.index} {key}")


def outcome(verb):
    """What a verb did: None, or the type of the error it raised (both sides must agree)."""
    try:
        verb()
    except NothingToRollback as error:
        return type(error)
    return None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), num_streams=st.sampled_from([1, 2, 3]), stream_settings=stream_settings,
       steps=st.integers(4, 20))
def test_batched_streams_equal_separate_sessions(model, frames, data, num_streams, stream_settings, steps):
    batched = MultiStreamSession(model, num_streams, stream_settings)
    separate = [StreamingSession(model, stream_settings) for _ in range(num_streams)]
    fed = [[] for _ in range(num_streams)]       # frame numbers each stream was given
    for step in range(steps):
        actions = data.draw(st.lists(st.sampled_from(ACTIONS), min_size=num_streams, max_size=num_streams),
                            label=f"step {step}")
        batch, expected = [], {}
        for s, action in enumerate(actions):
            where = f"step {step} stream {s} {action}"
            if action == "rollback":
                assert outcome(lambda: batched.rollback_last_frame(s)) == \
                    outcome(separate[s].rollback_last_frame), where
                continue
            if action == "flush":
                batched.flush(s), separate[s].flush()
                continue
            if action in ("reset", "switch"):
                batched.reset(s), separate[s].reset()
                if action == "reset" or not fed[s]:
                    continue
                number = fed[s][-1]                       # the switch runs the last frame again
            elif action == "absent":
                continue
            else:
                number = len(fed[s]) % FRAMES_PER_STREAM
            keyframe = {"keyframe": True, "non_keyframe": False}.get(action)
            fed[s].append(number)
            batch.append(StreamFrame(s, frames[s, number], keyframe))
            expected[s] = separate[s].step(frames[s, number], keyframe=keyframe)
        got = batched.step(batch)
        assert sorted(got) == sorted(expected)
        for s in expected:
            assert_same(got[s], expected[s], f"step {step} stream {s}")
    for s in range(num_streams):
        assert batched.time_index(s) == separate[s].time_index


def test_a_stream_absent_from_steps_is_untouched(model, frames):
    """Stream 2 sits out while streams 0 and 1 step, reset and roll back: its pages in every
    layer's pool, its camera cache and its counters do not change, and its next frame gives what
    a session that never saw the others gives."""
    kw = dict(num_scale_frames=2, scale_frames=1, sliding_window=2, camera_num_iterations=2,
              defer_evictions=True)
    batched = MultiStreamSession(model, 3, StreamSettings(**kw))
    alone = StreamingSession(model, StreamSettings(**kw))
    for i in range(5):
        batched.step([StreamFrame(s, frames[s, i]) for s in range(3)])
        alone.step(frames[2, i])
    pool = batched._pool.pool
    pages = pool._streams[2].pages()
    before = ([pool.layer_pool(l)[pages].clone() for l in range(model.config.depth)],
              batched._sessions[2].camera_cache.k.clone(), pool.stream(2).page_census(),
              batched.stream_stats(2).frames_seen, batched.time_index(2))
    for i in range(5, 30):   # grows the other streams' special pages past the first chunk
        batched.step([StreamFrame(s, frames[s, i]) for s in (0, 1)])
        if i % 4 == 0:
            batched.rollback_last_frame(1)
        if i == 20:
            batched.reset(0)
    assert pool.layer_pool(0).shape[0] > 3 * pool.spec.base_pages
    after = ([pool.layer_pool(l)[pages] for l in range(model.config.depth)],
             batched._sessions[2].camera_cache.k, pool.stream(2).page_census(),
             batched.stream_stats(2).frames_seen, batched.time_index(2))
    for x, y in zip(before[0], after[0]):
        assert torch.equal(x, y)
    assert torch.equal(before[1], after[1]) and before[2:] == after[2:]
    got = batched.step([StreamFrame(2, frames[2, 5]), StreamFrame(0, frames[0, 30])])[2]
    assert_same(got, alone.step(frames[2, 5]), "stream 2 after sitting out")


def test_bad_frames_are_refused_naming_the_stream(model, frames):
    batched = MultiStreamSession(model, 2, StreamSettings(num_scale_frames=1, camera_num_iterations=2))
    batched.step([StreamFrame(0, frames[0, 0]), StreamFrame(1, frames[1, 0])])
    with pytest.raises(FrameError, match="stream 1: frame size 56x28 differs"):
        batched.step([StreamFrame(0, frames[0, 1]), StreamFrame(1, torch.rand(3, 28, 56))])
    with pytest.raises(FrameError, match="stream 1: expected a \\[3, H, W\\] image"):
        batched.step([StreamFrame(1, torch.rand(4, 28, 42))])
    with pytest.raises(FrameError, match="at most one frame per stream"):
        batched.step([StreamFrame(0, frames[0, 1]), StreamFrame(0, frames[0, 2])])
    with pytest.raises(FrameError, match="stream must be an int in \\[0, 2\\)"):
        batched.step([StreamFrame(2, frames[0, 1])])
    # Nothing ran: stream 0's next frame is its second.
    assert batched.step([StreamFrame(0, frames[0, 1])])[0][0].index == 1


def test_long_run_with_special_pages_grown_by_turns(model, frames):
    """Past the first special chunk: the streams grow their special streams into chunks at the
    end of the shared pool, in turns (interleaved owners); outputs still equal separate sessions'."""
    kw = dict(num_scale_frames=2, scale_frames=1, sliding_window=2, camera_num_iterations=2, keyframe_interval=2)
    batched = MultiStreamSession(model, 3, StreamSettings(**kw))
    separate = [StreamingSession(model, StreamSettings(**kw)) for _ in range(3)]
    fed = [0, 0, 0]
    for step in range(36):
        batch, expected = [], {}
        for s in range(3):
            if s and step % (s + 2) == 0:
                continue                                  # sits out
            keyframe = True if s == 2 else None           # stream 2 stores every frame
            batch.append(StreamFrame(s, frames[s, fed[s]], keyframe))
            expected[s] = separate[s].step(frames[s, fed[s]], keyframe=keyframe)
            fed[s] += 1
        got = batched.step(batch)
        for s in expected:
            assert_same(got[s], expected[s], f"step {step} stream {s}")
    pool = batched._pool.pool
    owners = [s for page in range(3 * pool.spec.base_pages, pool.layer_pool(0).shape[0])
              for s in range(3) if page in pool._streams[s].special.pages]
    assert len(owners) == pool.layer_pool(0).shape[0] - 3 * pool.spec.base_pages   # each page one owner
    assert len(set(owners)) >= 2


def test_a_dropped_session_frees_its_pool_at_once(model, frames):
    """No reference cycle through the streams' cache factories or views: the pool (GPU memory on
    CUDA) goes with the session, not at the next cycle collection."""
    import gc
    import weakref

    batched = MultiStreamSession(model, 2, StreamSettings(num_scale_frames=1, camera_num_iterations=2))
    batched.step([StreamFrame(0, frames[0, 0]), StreamFrame(1, frames[1, 0])])
    batched.step([StreamFrame(0, frames[0, 1])])
    pool = weakref.ref(batched._pool.pool)
    gc.disable()
    try:
        del batched
        assert pool() is None
    finally:
        gc.enable()


def test_a_full_deferral_budget_is_flushed_as_in_a_single_session(model, frames):
    """Deferred evictions never flushed by the caller: each stream's budget fills, its session
    makes the oldest evictions final within the batched step (as `step` does alone), and the
    outputs still equal separate sessions'."""
    kw = dict(num_scale_frames=2, scale_frames=1, sliding_window=2, camera_num_iterations=2,
              defer_evictions=True)
    batched = MultiStreamSession(model, 2, StreamSettings(**kw))
    separate = [StreamingSession(model, StreamSettings(**kw)) for _ in range(2)]
    pending = [[], []]
    for i in range(FRAMES_PER_STREAM):
        got = batched.step([StreamFrame(s, frames[s, i]) for s in range(2)])
        for s in range(2):
            assert_same(got[s], separate[s].step(frames[s, i]), f"frame {i} stream {s}")
            kv = batched.stream_stats(s).kv_cache   # None while phase 1 buffers
            pending[s].append(0 if kv is None else kv.pending_pages)
    for s in range(2):
        # The budget filled and was flushed in a step (pending fell without a flush call).
        assert any(b < a for a, b in zip(pending[s], pending[s][1:])), pending[s]
