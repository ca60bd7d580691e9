"""The Mapper on the GPU: the windowed policy with CUDA graphs, against the offline windowed run.

A window switch resets the session, which keeps every buffer the graphs read: after the first
window (captures, special-stream growth) no window captures again, and the live results equal
the offline run's (same session kind: graphs, fused blocks, bf16). A run resumed from its map
database on the GPU (the continuation's images and results copied off the device, re-run in a
fresh session's graphs) goes on as one run with a new window at that frame.
"""
import dataclasses
import importlib.util

import numpy as np
import pytest
import torch

from lingbot_ros.mapping import factory
from lingbot_ros.mapping.mapper import Mapper
from lingbot_ros.mapping.records import InputFrame
from lingbot_ros.mapping.settings import MapperSettings
from lingbot_ros.mapping.windows import WindowedRun

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("flashinfer") is None,
                       reason="needs CUDA and flashinfer"),
]


def gpu_settings(**overrides) -> MapperSettings:
    return MapperSettings(**{"model_config": "tiny", "device": "cuda", "image_width": 70, "num_scale_frames": 2,
                             "scale_frames": 2, "sliding_window": 3, "long_run_policy": "windowed",
                             "window_size": 30, "overlap_size": 4, "min_confidence": 0.0,
                             "warmup_image_size": "140x112", **overrides})


def test_windows_on_the_gpu_capture_once_and_equal_the_offline_run():
    settings = gpu_settings()
    rng = np.random.default_rng(3)
    images = [np.ascontiguousarray((rng.random((112, 140, 3)) * 255).astype(np.uint8)) for _ in range(100)]
    mapper = Mapper(settings, factory.build(settings))
    mapper.warm_up()
    final, captures = [], []
    for i, rgb in enumerate(images):
        final += mapper.process(InputFrame(rgb=rgb, stamp_ns=10**9 + i * 10**8)).final
        captures.append(mapper.session.stats()["graph_captures"])
    final += mapper.finish().final
    assert mapper.snapshot.window == 3                          # windows start at 0, 26, 52, 78
    # Window 0 captures (first frame, special-stream growth); the later windows replay.
    assert captures[-1] == captures[30], captures
    final.sort(key=lambda o: o.index)
    offline = Mapper(dataclasses.replace(settings, long_run_policy="none"), factory.build(settings))
    run = WindowedRun(offline.session, settings.window_rule(), len(images))
    with torch.inference_mode():
        reference = list(run.frames(offline.preprocessor(rgb) for rgb in images))
    for live, ref in zip(final, reference):
        torch.testing.assert_close(live.result.pose_enc, ref.result.pose_enc, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(live.result.depth, ref.result.depth, atol=1e-3, rtol=1e-3)


def test_a_run_resumed_on_the_gpu_goes_on_as_a_new_window_would(tmp_path):
    rng = np.random.default_rng(5)
    images = [np.ascontiguousarray((rng.random((112, 140, 3)) * 255).astype(np.uint8)) for _ in range(60)]
    frames = [InputFrame(rgb=rgb, stamp_ns=10**9 + i * 10**8) for i, rgb in enumerate(images)]
    stop = 37   # inside window 1 (26-55), past its phase 1

    def run(database: str, **overrides) -> Mapper:
        settings = gpu_settings(map_database=str(tmp_path / database), **overrides)
        mapper = Mapper(settings, factory.build(settings))
        mapper.warm_up()
        return mapper

    whole = run("whole.db")
    for item in frames[:stop]:
        whole.process(item)
    assert whole.new_window().startswith("window ")
    for item in frames[stop:]:
        whole.process(item)
    whole.finish()
    want = whole.saved_trajectory()
    whole.close()

    first = run("parts.db")
    for item in frames[:stop]:
        first.process(item)
    first.close()
    resumed = run("parts.db", resume=True)
    assert resumed.snapshot.state_text.startswith(f"resumed run 1 (clean) at frame {stop}: window ")
    for item in frames[stop:]:
        resumed.process(item)
    resumed.finish()
    got = resumed.saved_trajectory()
    resumed.close()
    assert [p.key for p in got] == [p.key for p in want] == list(range(len(frames)))
    np.testing.assert_allclose(got.poses(), want.poses(), atol=1e-3, rtol=1e-3)
