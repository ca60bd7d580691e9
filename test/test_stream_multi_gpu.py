"""stream/multi_session.py on the GPU: N streams batched in one step (one FlashInfer plan with one
request per stream, bf16 or FP8 K/V; float32 through the torch backend) against N separate
StreamingSessions (each with its own cache, CUDA graphs and split attention, as the node runs one
camera). float32 through the torch backend: within the single-stream tolerance of
test_stream_frame_graph.py (graph replay against eager steps). bf16 and FP8: batched GEMMs and one
plan for several streams round differently from the separate sessions by as much as bf16's own
error, so both are measured against float32 separate sessions, and the batched error must be that
of the separate sessions (helpers.assert_as_accurate_as)."""

import dataclasses

import pytest
import torch

from lingbot_ros.model import ModelConfig, build_model
from lingbot_ros.stream import MultiStreamSession, StreamFrame, StreamingSession, StreamSettings

from helpers import GPU, assert_as_accurate_as

pytestmark = GPU

H, W = 56, 70   # 4 x 5 patches: 26 tokens per frame, so the special streams grow every 17 frames


@pytest.mark.parametrize("num_streams", [1, 2, 3])
@pytest.mark.parametrize("dtype, kv_cache_dtype, backend", [
    ("auto", "auto", "flashinfer"), ("auto", "fp8", "flashinfer"), ("float32", "auto", "torch")])
def test_batched_streams_match_separate_sessions(num_streams, dtype, kv_cache_dtype, backend):
    model = build_model(ModelConfig.preset("tiny"), device="cuda", seed=5)
    g = torch.Generator().manual_seed(2)
    frames = torch.rand(num_streams, 70, 3, H, W, generator=g).cuda()
    settings = StreamSettings(num_scale_frames=2, scale_frames=2, sliding_window=3, camera_num_iterations=2,
                              defer_evictions=True, dtype=dtype, kv_cache_dtype=kv_cache_dtype)
    batched = MultiStreamSession(model, num_streams, settings)
    separate = [StreamingSession(model, settings) for _ in range(num_streams)]
    low_precision = dtype != "float32"
    float32 = dataclasses.replace(settings, dtype="float32", kv_cache_dtype="auto")
    references = [StreamingSession(model, float32) for _ in range(num_streams)] if low_precision else []
    got = {s: [] for s in range(num_streams)}
    expected = {s: [] for s in range(num_streams)}
    reference = {s: [] for s in range(num_streams)}
    fed = [0] * num_streams
    for step in range(70):
        batch = []
        for s in range(num_streams):
            if (step + s) % 5 == 4 and s > 0:        # streams sit out on different steps
                continue
            keyframe = (fed[s] + s) % 7 != 3
            batch.append(StreamFrame(s, frames[s, fed[s]], keyframe))
            expected[s] += separate[s].step(frames[s, fed[s]], keyframe=keyframe)
            if references:
                reference[s] += references[s].step(frames[s, fed[s]], keyframe=keyframe)
            fed[s] += 1
        for s, results in batched.step(batch).items():
            got[s] += results
        for s in range(num_streams):
            sessions = [separate[s]] + references[s:s + 1]
            if step % 9 == 8 and separate[s].stats().frames_stored > 3:
                batched.rollback_last_frame(s), [x.rollback_last_frame() for x in sessions]
            elif step == 40 + s:
                batched.reset(s), [x.reset() for x in sessions]
            else:
                batched.flush(s), [x.flush() for x in sessions]
    assert batched._pool.pool.backend == backend
    for s in range(num_streams):
        assert len(got[s]) == len(expected[s]) == fed[s]
        for a, b in zip(got[s], expected[s]):
            assert (a.index, a.is_keyframe, a.time_index) == (b.index, b.is_keyframe, b.time_index)
        for key in ("pose_enc", "depth", "depth_conf", "world_points"):
            if low_precision:
                assert_as_accurate_as([getattr(a, key) for a in got[s]], [getattr(b, key) for b in expected[s]],
                                      [getattr(r, key) for r in reference[s]], f"stream {s} {key}")
                continue
            for a, b in zip(got[s], expected[s]):
                torch.testing.assert_close(getattr(a, key), getattr(b, key), atol=2e-3, rtol=2e-3,
                                           msg=lambda m: f"stream {s} frame {a.index} {key}: {m}")
