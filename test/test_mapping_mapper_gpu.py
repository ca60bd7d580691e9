"""The Mapper on the GPU: the windowed policy with CUDA graphs, against the offline windowed run.

A window switch resets the session, which keeps every buffer the graphs read: after the first
window (captures, special-stream growth) no window captures again, and the live results equal
the offline run's (same session kind: graphs, fused blocks, bf16). A run resumed from its map
database on the GPU (the continuation's images and results copied off the device, re-run in a
fresh session's graphs) goes on as one run with a new window at that frame. A NaN the graphs
compute is found by the device-side finite check: a counted failure, nothing of it kept.
"""
import dataclasses

import numpy as np
import torch

from lingbot_ros.mapping import factory
from lingbot_ros.mapping.files.export import read_ply, read_tum
from lingbot_ros.mapping.mapper import Mapper
from lingbot_ros.mapping.records import FAILED, InputFrame
from lingbot_ros.mapping.settings import MapperSettings
from lingbot_ros.mapping.windows.offline import WindowedRun

from helpers import GPU

pytestmark = GPU


def gpu_settings(**overrides) -> MapperSettings:
    return MapperSettings(**{"model_config": "tiny", "device": "cuda", "image_width": 70, "num_scale_frames": 2,
                             "scale_frames": 2, "sliding_window": 3, "long_run_policy": "windowed",
                             "window_size": 30, "overlap_size": 4, "min_confidence": 0.0,
                             "warmup_image_size": "140x112", **overrides})


def random_images(seed: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.ascontiguousarray((rng.random((112, 140, 3)) * 255).astype(np.uint8)) for _ in range(count)]


def run_windows(settings: MapperSettings, images):
    """A warmed-up Mapper over ``images``: it, the outputs published (new), the final ones, and
    the session's graph captures after each frame."""
    mapper = Mapper(settings, factory.build(settings))
    mapper.warm_up()
    new, final, captures = [], [], []
    for i, rgb in enumerate(images):
        outcome = mapper.process(InputFrame(rgb=rgb, stamp_ns=10**9 + i * 10**8))
        new, final = new + outcome.new, final + outcome.final
        captures.append(mapper.session.stats().graph_captures)
    return mapper, new, final + mapper.finish().final, captures


def test_windows_on_the_gpu_capture_once_and_equal_the_offline_run():
    settings = gpu_settings()
    images = random_images(3, 100)
    mapper, _, final, captures = run_windows(settings, images)
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


def test_frames_queued_on_the_gpu_give_what_one_at_a_time_gives():
    """Mapper.process_queued on CUDA: each frame's step queued behind the one before, which is
    placed on the placing stream meanwhile (window switches, spare work ahead included): the
    outputs of process, frame by frame."""
    settings = gpu_settings(window_size=12, window_switch_ahead=True)
    images = random_images(5, 40)
    frames = [InputFrame(rgb=rgb, stamp_ns=10**9 + i * 10**8) for i, rgb in enumerate(images)]
    plain, queued = (Mapper(settings, factory.build(settings)) for _ in range(2))
    one_at_a_time = [plain.process(frame) for frame in frames]
    together = list(queued.process_queued(iter(frames)))
    assert len(together) == len(one_at_a_time) and queued.snapshot.window == plain.snapshot.window >= 3
    for a, b in zip(one_at_a_time, together):
        assert [o.index for o in b.new] == [o.index for o in a.new]
        assert [o.index for o in b.final] == [o.index for o in a.final]
        for x, y in zip(a.new + a.final + a.revised, b.new + b.final + b.revised):
            np.testing.assert_allclose(y.camera_pose, x.camera_pose, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(y.depth, x.depth, rtol=1e-4, atol=1e-5)
    plain.finish(), queued.finish()   # the map merged
    np.testing.assert_allclose(queued.map_points()[0], plain.map_points()[0], rtol=1e-4, atol=1e-5)


def test_switches_prepared_ahead_on_the_gpu_replay_the_graphs_and_publish_the_same():
    """window_switch_ahead on the GPU: the spare session's own graphs, the overlap's pages copied
    into the live cache at each switch (its graph stays valid: no capture after window 0), and
    the outputs of the switches run at once."""
    images = random_images(4, 90)
    plain_mapper, new, final, _ = run_windows(gpu_settings(), images)
    plain = new + final
    mapper, new, final, captures = run_windows(gpu_settings(window_switch_ahead=True), images)
    ahead = new + final
    assert plain_mapper.snapshot.window == mapper.snapshot.window == 3
    assert captures[-1] == captures[30], captures
    assert [(o.index, o.provisional) for o in ahead] == [(o.index, o.provisional) for o in plain]
    for mine, theirs in zip(ahead, plain):
        for key in ("pose_enc", "depth", "world_points"):
            torch.testing.assert_close(getattr(mine.result, key), getattr(theirs.result, key), atol=1e-4, rtol=1e-4)


def test_a_run_resumed_on_the_gpu_goes_on_as_a_new_window_would(tmp_path):
    frames = [InputFrame(rgb=rgb, stamp_ns=10**9 + i * 10**8) for i, rgb in enumerate(random_images(5, 60))]
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


def test_a_nan_computed_in_the_graphs_is_a_counted_failure_and_nothing_of_it_is_kept(tmp_path):
    settings = gpu_settings(long_run_policy="none")
    mapper = Mapper(settings, factory.build(settings))
    mapper.warm_up()
    frames = [InputFrame(rgb=rgb, stamp_ns=10**9 + i * 10**8) for i, rgb in enumerate(random_images(7, 12))]
    for item in frames[:6]:
        mapper.process(item)
    points_before = len(mapper.map_points()[0])
    # The depth head's last bias read in place by the captured graph: this frame's depth and
    # world points are NaN on the device, as a numerical blow-up would make them.
    bias = mapper.session.model.depth_head.scratch.output_conv2[2].bias
    good = bias.detach().clone()
    with torch.no_grad():
        bias.fill_(float("nan"))
    outcome = mapper.process(frames[6])
    with torch.no_grad():
        bias.copy_(good)
    assert outcome.new == [] and [n.kind for n in outcome.notices] == [FAILED], outcome.notices
    assert "non-finite depth, intrinsics or points" in outcome.notices[0].text
    assert mapper.snapshot.failed == 1 and mapper.snapshot.trajectory_poses == 6
    assert len(mapper.map_points()[0]) == points_before
    for item in frames[7:]:
        mapper.process(item)
    mapper.finish()
    saved = mapper.save(tmp_path)
    assert saved.num_poses == 11 and mapper.snapshot.failed == 1
    assert np.isfinite(read_ply(tmp_path / "map.ply")[0]).all()
    trajectory = read_tum(tmp_path / "trajectory.tum")
    assert np.isfinite(trajectory.poses()).all() and frames[6].stamp_ns not in trajectory.stamps_ns().tolist()
