"""The windowed long-run policy live (one frame at a time) against the offline windowed run.

The live Mapper must give, for every frame, the final value the original's offline mode gives
(spec 13.1: windows, alignment, stitching), on the same images; what it publishes first for an
overlap frame is the earlier window's (provisional) value.
"""
import functools

import numpy as np
import pytest
import torch
from PIL import Image

from lingbot_ros.cache import NothingToRollback
from lingbot_ros.mapping.placement.conversion import Placement
from lingbot_ros.mapping.records import InputFrame
from lingbot_ros.mapping.settings import MapperSettings, SettingsError
from lingbot_ros.mapping.windows.offline import WindowedRun

from helpers import GET_SHARED, missing

pytestmark = pytest.mark.usefixtures("torch_single_thread")


@pytest.fixture(scope="module")
def images(shared_data):
    folder = shared_data("courthouse_jpg")
    files = sorted(folder.glob("*.jpg"))[:40]
    if len(files) < 40:
        missing(f"40 images in {folder}", GET_SHARED)
    return [np.asarray(Image.open(f).convert("RGB")) for f in files]


@pytest.fixture
def windowed(tiny_mapper):
    return functools.partial(tiny_mapper, sliding_window=4, map_points_stride=4, long_run_policy="windowed",
                             window_size=10, overlap_size=4)


def frames(images, count):
    return [InputFrame(rgb=images[i], stamp_ns=10**9 + i * 10**8) for i in range(count)]


def run_live(mapper, inputs):
    new, final = [], []
    for frame in inputs:
        outcome = mapper.process(frame)
        new += outcome.new
        final += outcome.final
    final += mapper.finish().final
    return new, final


@pytest.mark.parametrize("count, overrides", [
    (32, {}),                                                    # tiny_windowed's settings: 5 windows
    (37, {"keyframe_interval": 2, "overlap_size": 5}),            # L = 3 + 7 * 2 = 17 frames
    (25, {"overlap_size": 2}),                                    # overlap shorter than phase 1
    (8, {}),                                                      # one window, never switched
    (21, {"window_size": 5, "overlap_size": 3}),                  # overlap > step: frames re-run twice
])
def test_live_windows_equal_the_offline_windowed_run(windowed, images, count, overrides):
    mapper = windowed(**overrides)
    new, final = run_live(mapper, frames(images, count))
    assert [o.index for o in new] == list(range(count))           # every frame published once
    assert sorted(o.index for o in final) == list(range(count))   # and made final once
    assert not any(o.provisional for o in final)
    final.sort(key=lambda o: o.index)

    offline_mapper = windowed(**overrides)         # same weights, a fresh session
    settings = offline_mapper.settings
    run = WindowedRun(offline_mapper.session, settings.window_rule(), count)
    preprocess = offline_mapper.preprocessor
    with torch.inference_mode():
        offline = list(run.frames(preprocess(image) for image in images[:count]))
    assert [f.frame for f in offline] == list(range(count))
    for live, reference in zip(final, offline):
        if run.aligned:
            torch.testing.assert_close(live.result.pose_enc, reference.result.pose_enc, rtol=0, atol=1e-6)
        else:   # a single-window offline run keeps raw quaternions; live ones are unit, w >= 0
            torch.testing.assert_close(live.result.extrinsic, reference.result.extrinsic, rtol=0, atol=1e-5)
        torch.testing.assert_close(live.result.depth, reference.result.depth, rtol=0, atol=1e-6)
        torch.testing.assert_close(live.result.world_points, reference.result.world_points, rtol=0, atol=1e-5)
        assert live.is_keyframe == bool(reference.result.is_keyframe)
        np.testing.assert_allclose(live.camera_pose, Placement().camera_pose(live.result.extrinsic.numpy()))
    # Per-window scales and transforms are those of the offline run.
    records = mapper.window_records()
    assert len(records) == len(run.similarities)
    for record, sim in zip(records, run.similarities):
        torch.testing.assert_close(record.similarity.scale, sim.scale, rtol=0, atol=1e-6)
        torch.testing.assert_close(record.similarity.rotation, sim.rotation, rtol=0, atol=1e-6)
    # The saved trajectory holds the final values.
    np.testing.assert_allclose(mapper.saved_trajectory().poses(), np.stack([o.base_pose for o in final]), atol=1e-12)


def test_overlap_frames_are_published_provisionally_then_finalised(windowed, images):
    mapper = windowed()
    # L = 10, ov = 4: frames 6..9 are window 0's overlap with window 1.
    outcomes = [mapper.process(f) for f in frames(images, 11)]
    provisional = [o.index for outcome in outcomes for o in outcome.new if o.provisional]
    assert provisional == [6, 7, 8, 9]
    switch = outcomes[10]                                   # frame 10 starts window 1
    assert [o.index for o in switch.new] == [10]
    assert [o.index for o in switch.final] == [6, 7, 8, 9, 10]
    snapshot = mapper.snapshot
    assert snapshot.window == 1 and snapshot.restarts == 0 and snapshot.state_text == "tracking"
    assert snapshot.window_scale == pytest.approx(float(mapper.window_records()[1].similarity.scale))
    assert np.isfinite(snapshot.window_overlap_error) and snapshot.window_overlap_error >= 0
    # The published (provisional) pose and the final one differ: they come from two windows.
    first = {o.index: o.camera_pose for outcome in outcomes[:10] for o in outcome.new}
    final = {o.index: o.camera_pose for o in switch.final}
    final_base = {o.index: o.base_pose for o in switch.final}
    assert not np.allclose(first[8], final[8])
    np.testing.assert_allclose(mapper.saved_trajectory().poses()[6:10], np.stack([final_base[i] for i in range(6, 10)]))


def test_rollback_and_flush_inside_a_window_and_after_a_switch(windowed, images):
    inputs = frames(images, 16)
    kept = inputs[:5] + inputs[6:11] + inputs[12:15]
    reference = windowed()
    for frame in kept:
        reference.process(frame)
    mapper = windowed()
    for frame in inputs[:6]:
        mapper.process(frame)
    # No eviction yet (3 anchors + window 4 > 6 frames), so the rollbacks here are exact.
    assert "rolled back frame 5" in mapper.rollback_last_frame()    # inside window 0
    assert "flushed" in mapper.flush()
    for frame in inputs[6:12]:
        mapper.process(frame)
    assert mapper.snapshot.window == 1            # the 11th frame kept (index 11) started window 1
    # Right after the switch the newest stored frame is the new one: it rolls back...
    assert "rolled back frame 11" in mapper.rollback_last_frame()
    # ... but the overlap frames run again for the alignment do not.
    with pytest.raises(NothingToRollback, match="align two windows"):
        mapper.rollback_last_frame()
    assert "flushed" in mapper.flush()
    for frame in inputs[12:15]:
        mapper.process(frame)
    # The same poses as a run that never saw the rolled-back frames.
    np.testing.assert_allclose(mapper.saved_trajectory().poses(), reference.saved_trajectory().poses(), atol=1e-9)
    np.testing.assert_allclose(mapper.map_points()[0], reference.map_points()[0], atol=1e-6)


def test_windowed_settings_are_checked():
    with pytest.raises(SettingsError, match="must be shorter than a window"):
        MapperSettings(long_run_policy="windowed", window_size=10, overlap_size=10, num_scale_frames=3,
                       scale_frames=3)


def test_saving_mid_stream_equals_ending_the_stream_there(windowed, images, tmp_path):
    """The node saves while its stream goes on; the offline tool ends the stream first. Both
    write the same trajectory and map: provisional frames count with their current value."""
    live, ended = windowed(), windowed()
    for frame in frames(images, 20):               # frames 18, 19: window 2, provisional
        live.process(frame)
        ended.process(frame)
    assert live._stream.windows.provisional()
    ended.finish()
    saved_live, saved_ended = live.save(tmp_path / "live"), ended.save(tmp_path / "ended")
    assert saved_live.num_points == saved_ended.num_points > 0
    assert (tmp_path / "live" / "trajectory.tum").read_text() == (tmp_path / "ended" / "trajectory.tum").read_text()
    assert (tmp_path / "live" / "map.ply").read_bytes() == (tmp_path / "ended" / "map.ply").read_bytes()
    # Saving changed nothing: the live stream goes on, its provisional frames still provisional.
    assert live._stream.windows.provisional()


def published(outputs):
    """What a front end gets of each output, in order: index, flags, the result's tensors."""
    return [(o.index, o.provisional, o.is_keyframe, o.result) for o in outputs]


def assert_same_outputs(a, b):
    assert [x[:3] for x in a] == [y[:3] for y in b]
    for (*_, x), (*_, y) in zip(a, b):
        for key in ("pose_enc", "depth", "depth_conf", "extrinsic", "world_points"):
            torch.testing.assert_close(getattr(x, key), getattr(y, key), rtol=0, atol=0, msg=key)


@pytest.fixture
def take_overs(monkeypatch):
    """How many window switches took a spare session's stream over."""
    from lingbot_ros.stream import StreamingSession
    calls, original = [], StreamingSession.take_over
    monkeypatch.setattr(StreamingSession, "take_over", lambda self, other: (calls.append(1), original(self, other))[1])
    return calls


@pytest.mark.parametrize("count, overrides", [
    (32, {}),                                                    # 3 switches, window 10, overlap 4
    (37, {"keyframe_interval": 2, "overlap_size": 5}),            # L = 17 frames, non-keyframes in the overlap
])
def test_switches_prepared_ahead_publish_the_same_outputs(windowed, images, count, overrides, take_overs):
    plain = run_live(windowed(**overrides), frames(images, count))
    assert not take_overs
    mapper = windowed(window_switch_ahead=True, **overrides)
    ahead = run_live(mapper, frames(images, count))
    assert len(take_overs) == mapper.snapshot.window > 0          # every switch was prepared ahead
    for mine, theirs in zip(ahead, plain):                       # new, then final
        assert_same_outputs(published(mine), published(theirs))


def test_a_rollback_or_a_new_window_voids_the_work_ahead_and_the_switch_runs_the_frames(windowed, images,
                                                                                        take_overs):
    inputs = frames(images, 30)

    def drive(mapper):
        new = []
        for i, frame in enumerate(inputs):
            new += mapper.process(frame).new
            if i == 7:     # window 0's overlap is positions 6..9: frame 7 ran ahead already
                mapper.rollback_last_frame()
            if i == 17:    # window 2 (from frame 17 on) asks for the next one at frame 18
                mapper.new_window()
        return published(new + mapper.finish().final)

    plain = drive(windowed())
    assert not take_overs
    mapper = windowed(window_switch_ahead=True)
    assert_same_outputs(drive(mapper), plain)
    # Switches at frames 11 (a frame run ahead was rolled back), 17 (prepared ahead), 18 (asked
    # early, nothing ahead) and 24 (prepared ahead).
    assert (mapper.snapshot.window, len(take_overs)) == (4, 2)


@pytest.mark.parametrize("overrides, words", [
    ({"keyframe_policy": "motion"}, "set keyframe_policy interval"),
    ({"overlap_size": 2}, "shorter than phase 1"),
    ({"window_size": 6, "overlap_size": 4}, "over half a window"),
    ({"overlap_size": 9}, "does not fit the cache"),
    ({"long_run_policy": "reset"}, "set long_run_policy windowed"),
])
def test_switches_ahead_refuse_settings_they_cannot_keep_exact(overrides, words):
    base = dict(long_run_policy="windowed", window_size=12, overlap_size=4, num_scale_frames=3, scale_frames=3,
                sliding_window=4, window_switch_ahead=True)
    with pytest.raises(SettingsError, match=words):
        MapperSettings(**{**base, **overrides})


def test_the_spare_cache_holds_the_overlap_and_splits_its_attention_as_the_live_one(windowed, images):
    mapper = windowed(window_switch_ahead=True, window_size=12, overlap_size=5)
    for frame in frames(images, 12):   # the spare's cache is made at its first step
        mapper.process(frame)
    live, spare = mapper.session._cache.spec, mapper._ahead.spare._cache.spec   # private: the specs are the point
    assert spare.scale_frames + spare.sliding_window == 5 and spare.deferred_capacity == 0
    # FlashInfer splits a step's pages by the full window's: as the live cache, or the GPU rounds
    # the spare's steps differently from the switch's own (bench/README.md, 2026-12-07).
    assert spare.full_window_pages == live.full_window_pages == live.scale_frames + live.sliding_window


def test_the_work_ahead_is_spread_by_cost_and_done_before_the_switch_frame(windowed, images, monkeypatch):
    from lingbot_ros.mapping.windows import ahead as ahead_module
    monkeypatch.setattr(ahead_module, "PHASE1_LAYERS_PER_SLICE", 1)     # many slices: something to spread
    mapper = windowed(window_switch_ahead=True, window_size=12, overlap_size=5)   # L 12, ov 5, phase 1 3
    switch_ahead = mapper._ahead          # private: what each frame carries is the point here
    costs, depth = switch_ahead.costs, len(mapper.session.model.aggregator.frame_blocks)
    # Phase 1's 3 frames (the last begins the batch), its layers, the camera head, the depth head
    # a frame at a time, then the 2 later overlap frames.
    assert costs == ahead_module.work_costs(3, depth, 5, 1) and len(costs) == 3 + depth + 1 + 3 + 2
    carried, done = [], 0
    for frame in frames(images, 13):
        mapper.process(frame)
        carried.append(sum(costs[done:switch_ahead._done]))
        done = switch_ahead._done
    assert mapper.snapshot.window == 1
    # Frames 7-11 are the overlap; 9 completes phase 1's batch. The switch frame (12) carries
    # nothing: it places the overlap's results. Every frame from 9 on carries about an even share
    # of what was left (at most half the largest call over it); the last one takes the rest.
    assert carried[:9] == [0.0] * 9 and carried[12] == 0.0
    assert sum(carried) == pytest.approx(sum(costs))
    for position in (9, 10):
        share = sum(carried[position:12]) / (12 - position)
        assert carried[position] <= share + max(costs) / 2, carried


def test_switches_ahead_after_a_resume_and_across_a_restart_publish_the_same(windowed, images, tmp_path,
                                                                            take_overs):
    """A run resumed from its map database (its first switch asked at once: nothing ahead), then a
    rollback and an image-size restart (the spare starts over with the next stream)."""
    inputs = frames(images, 40)
    inputs[30:] = [InputFrame(rgb=np.ascontiguousarray(f.rgb[:200]), stamp_ns=f.stamp_ns) for f in inputs[30:]]

    def drive(ahead: bool):
        database = str(tmp_path / f"ahead_{ahead}.db")
        first = windowed(window_switch_ahead=ahead, map_database=database)
        for frame in inputs[:13]:
            first.process(frame)
        first.close()
        mapper = windowed(window_switch_ahead=ahead, map_database=database, resume=True)
        new, notices = [], []
        for i, frame in enumerate(inputs[13:], 13):
            outcome = mapper.process(frame)
            new, notices = new + outcome.new, notices + [n.text for n in outcome.notices]
            if i == 25:
                mapper.rollback_last_frame()
        return published(new + mapper.finish().final), notices, mapper.snapshot.window

    plain, plain_notices, plain_windows = drive(False)
    assert not take_overs
    ahead, notices, windows = drive(True)
    assert take_overs                       # some switches were prepared ahead
    assert_same_outputs(ahead, plain)
    assert notices == plain_notices and any("image size changed" in text for text in notices)
    assert windows == plain_windows
