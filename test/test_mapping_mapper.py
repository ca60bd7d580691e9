"""The Mapper with a real tiny session (no ROS): policies, rollback, restarts, bounds, input checks.

The fixture checkpoint runs at a 112-pixel input width on CPU; frames are one textured image
shifted sideways, so the motion policy's parallax is known (a shift of s pixels at 640 px is s/2
at the policy's 320 px working width).
"""
import dataclasses
import functools

import numpy as np
import pytest

from lingbot_ros.cache import NothingToRollback
from lingbot_ros.mapping.files.export import read_ply, read_tum
from lingbot_ros.mapping.placement.conversion import R_MAP_FROM_OPTICAL, Placement
from lingbot_ros.mapping.records import FAILED, INITIALISING, REJECTED, RESTART, RESTARTED, TRACKING, InputFrame
from lingbot_ros.mapping.settings import MapperSettings, SettingsError

from helpers import frame

pytestmark = pytest.mark.usefixtures("torch_single_thread")


@pytest.fixture
def make_mapper(tiny_mapper):
    return functools.partial(tiny_mapper, long_run_policy="reset")


def stored(mapper) -> int:
    return mapper.session.stats().frames_stored


def spy(monkeypatch, obj, name) -> list:
    """Count calls of obj.name while still running it."""
    calls, original = [], getattr(obj, name)
    monkeypatch.setattr(obj, name, lambda *a, **k: (calls.append(a), original(*a, **k))[1])
    return calls


def test_motion_policy_keeps_and_flushes_or_rolls_back(make_mapper, monkeypatch):
    mapper = make_mapper(keyframe_policy="motion", keyframe_min_parallax_px=4.0)
    flushes, rollbacks = spy(monkeypatch, mapper.session, "flush"), \
        spy(monkeypatch, mapper.session, "rollback_last_frame")
    for shift in (0, 12, 24):                        # the scale frames are always kept
        outputs = mapper.process(frame(shift)).new
    assert [o.is_keyframe for o in outputs] == [True] * 3 and stored(mapper) == 3
    assert (len(flushes), len(rollbacks)) == (0, 0)
    map_before = mapper.map_points()[0].copy()

    outputs = mapper.process(frame(26)).new          # 1 px at 320: too little motion
    assert len(outputs) == 1 and not outputs[0].is_keyframe and outputs[0].camera_pose.shape == (4, 4)
    assert stored(mapper) == 3 and (len(flushes), len(rollbacks)) == (0, 1)
    np.testing.assert_array_equal(mapper.map_points()[0], map_before)

    # Each 8 px step is kept and flushed; past anchors + window (3 + 2) frames get evicted, and
    # the flush frees their pages at once instead of leaving them pending.
    for n, shift in enumerate((40, 56, 72, 88), start=1):
        (output,) = mapper.process(frame(shift)).new
        assert output.is_keyframe and stored(mapper) == 3 + n
        assert (len(flushes), len(rollbacks)) == (n, 1)
        assert mapper.session.stats().kv_cache.pending_pages == 0
    assert mapper.session.stats().kv_cache.window_pages == 2
    # A live change of the threshold applies to the next frame: 8 px at 640 is 4 px at 320.
    mapper.apply_live(mapper.settings.__class__(**{**mapper.settings.__dict__,
                                                   "keyframe_min_parallax_px": 100.0}))
    assert not mapper.process(frame(120)).new[0].is_keyframe


def test_rollback_removes_the_newest_keyframe_points_and_pose(make_mapper):
    frames = [frame(8 * i) for i in range(5)]
    reference = make_mapper()
    for f in frames[:4]:
        reference.process(f)
    rolled = make_mapper()
    for f in frames:
        rolled.process(f)
    assert rolled.snapshot.trajectory_poses == 5 and stored(rolled) == 5
    assert "its points left the map" in rolled.rollback_last_frame()
    assert stored(rolled) == 4
    # The rolled-back frame's pose leaves the trajectory (and so ~/path and the saved file).
    np.testing.assert_array_equal(rolled.saved_trajectory().poses(), reference.saved_trajectory().poses())
    for got, want in zip(rolled.map_points(), reference.map_points()):
        np.testing.assert_array_equal(got, want)
    # Frame 4 was merged when frame 5 arrived: a second rollback cannot take its points back.
    assert "already merged" in rolled.rollback_last_frame()
    assert stored(rolled) == 3 and rolled.snapshot.trajectory_poses == 3


def test_rollback_while_buffering_drops_the_scale_frame(make_mapper):
    mapper = make_mapper()
    with pytest.raises(NothingToRollback):
        mapper.rollback_last_frame()
    mapper.process(frame(0))
    mapper.process(frame(8))
    assert mapper.snapshot.state == INITIALISING and mapper.snapshot.init_frames == 2
    assert "buffered" in mapper.rollback_last_frame()
    assert mapper.snapshot.init_frames == 1 and mapper.snapshot.state_text == "initialising 1/3"
    assert mapper.process(frame(16)).new == []        # still needs a third scale frame
    assert len(mapper.process(frame(24)).new) == 3 and mapper.snapshot.state == TRACKING


def test_cache_cap_restarts_and_continues_from_the_last_pose(make_mapper):
    mapper = make_mapper(max_keyframes=4)
    for i in range(3):
        assert not mapper.process(frame(8 * i)).notices
    outcome = mapper.process(frame(24))
    last = outcome.new[-1].camera_pose
    assert [n.kind for n in outcome.notices] == [RESTART]
    assert "cache cap: 4 keyframes stored (max_keyframes=4)" in outcome.notices[0].text
    assert mapper.snapshot.state == RESTARTED and stored(mapper) == 0 and mapper.snapshot.restarts == 1
    assert mapper.snapshot.trajectory_poses == 4 and len(mapper.map_points()[0]) > 0
    # The new stream's model world starts at the last camera: a first camera at the model's
    # identity lands exactly where the old stream left off.
    np.testing.assert_allclose(mapper._stream.placement.camera_pose(np.eye(4)), last, atol=1e-12)
    for i in range(3):
        after = mapper.process(frame(8 * i)).new
    np.testing.assert_allclose(after[0].camera_pose,
                               mapper._stream.placement.camera_pose(after[0].result.extrinsic.numpy()), atol=1e-12)

    mapper = make_mapper(max_keyframes=0, max_cache_mb=0.001)
    outcome = [mapper.process(frame(8 * i)) for i in range(3)][-1]
    assert "(max_cache_mb=0.001)" in outcome.notices[0].text


def test_reset_clears_the_map_and_trajectory(make_mapper):
    mapper = make_mapper()
    for i in range(4):
        mapper.process(frame(8 * i))
    mapper.process(frame(40))
    outcome = mapper.reset("reset service")
    assert outcome.notices[0].kind == RESTART and "map cleared" in outcome.notices[0].text
    assert len(mapper.map_points()[0]) == 0 and mapper.snapshot.trajectory_poses == 0 and mapper.snapshot.restarts == 1


def test_reset_runs_buffered_scale_frames_first(make_mapper):
    """Frames buffered for phase 1 get their poses before a restart: no frame is lost silently."""
    mapper = make_mapper()
    first = [frame(0, stamp_s=50.0), frame(8, stamp_s=50.1)]
    for f in first:
        mapper.process(f)
    outcome = mapper.process(frame(0, stamp_s=10.0))        # a looped bag: restart first
    assert [o.frame for o in outcome.new] == first and not any(o.trusted for o in outcome.new)
    assert outcome.notices[0].kind == RESTART
    assert mapper.snapshot.init_frames == 1


def test_stamp_jitter_drops_the_frame_and_a_real_jump_back_restarts(make_mapper):
    mapper = make_mapper(max_stamp_gap_s=1.0, max_stamp_jitter_s=0.05)
    for i in range(4):
        mapper.process(frame(8 * i, stamp_s=10.0 + 0.1 * i))
    poses = mapper.snapshot.trajectory_poses
    outcome = mapper.process(frame(0, stamp_s=10.299))       # 1 ms back: jitter
    assert [n.kind for n in outcome.notices] == [REJECTED] and not outcome.new
    assert mapper.snapshot.rejected == 1 and mapper.snapshot.restarts == 0
    assert mapper.snapshot.trajectory_poses == poses and len(mapper.map_points()[0]) > 0
    outcome = mapper.process(frame(40, stamp_s=10.4))         # the stream goes on
    assert len(outcome.new) == 1 and not outcome.notices
    outcome = mapper.process(frame(0, stamp_s=11.5))          # forward gap of 1.1 s: held
    assert not outcome.notices and not outcome.new and mapper.snapshot.held_frames == 1
    outcome = mapper.process(frame(8, stamp_s=11.6))          # it follows: the jump was real
    assert outcome.notices[0].kind == RESTART and "gap of 1.100 s" in outcome.notices[0].text
    assert mapper.snapshot.held_frames == 0 and mapper.snapshot.init_frames == 2
    mapper.process(frame(16, stamp_s=11.7))
    outcome = mapper.process(frame(0, stamp_s=5.0))           # a looped bag
    assert "went back by 6.700 s" in outcome.notices[0].text
    assert mapper.snapshot.trajectory_poses == 0 and mapper.snapshot.init_frames == 1   # waits for phase 1
    for i in (1, 2):                                          # the third scale frame runs phase 1
        mapper.process(frame(8 * i, stamp_s=5.0 + 0.1 * i))
    assert mapper.snapshot.trajectory_poses == 3
    assert mapper.saved_trajectory().stamps_ns()[0] == 5 * 10**9   # the new map's trajectory starts at the loop


def test_a_single_frame_an_hour_ahead_is_refused_and_the_stream_goes_on(make_mapper):
    """Regression: one image stamped an hour ahead cost two restarts (the jump and the jump back),
    each clearing the map. Held, not followed by the next frame: refused, no restart."""
    mapper = make_mapper()
    for i in range(4):
        mapper.process(frame(8 * i, stamp_s=100.0 + 0.1 * i))
    points, poses = len(mapper.map_points()[0]), mapper.snapshot.trajectory_poses
    outcome = mapper.process(frame(32, stamp_s=3700.4))
    assert not outcome.notices and not outcome.new and outcome.taken is None
    assert mapper.snapshot.held_frames == 1 and mapper.snapshot.last_stamp_ns == round(100.3 * 10**9)
    outcome = mapper.process(frame(40, stamp_s=100.5))
    assert [n.kind for n in outcome.notices] == [REJECTED] and len(outcome.new) == 1
    assert "jumped 3600.100 s ahead" in outcome.notices[0].text and "did not follow" in outcome.notices[0].text
    assert outcome.taken.stamp_ns == round(100.5 * 10**9)
    snap = mapper.snapshot
    assert (snap.restarts, snap.rejected, snap.held_frames, snap.processed) == (0, 1, 0, 5)
    assert snap.trajectory_poses == poses + 1 and len(mapper.map_points()[0]) >= points
    # Held at the end of the input: nothing confirmed it, and taking it would clear the map.
    mapper.process(frame(48, stamp_s=9000.0))
    outcome = mapper.finish()
    assert [n.kind for n in outcome.notices] == [REJECTED] and "no frame followed" in outcome.notices[0].text
    assert (mapper.snapshot.rejected, mapper.snapshot.held_frames, mapper.snapshot.restarts) == (2, 0, 0)
    assert mapper.snapshot.trajectory_poses == poses + 1
    # A reset with a frame held: refused, counted, then the restart.
    mapper.process(frame(0, stamp_s=9100.0))
    outcome = mapper.reset("operator")
    assert [n.kind for n in outcome.notices] == [REJECTED, RESTART]
    assert (mapper.snapshot.rejected, mapper.snapshot.held_frames) == (3, 0)


def test_bad_geometry_is_rejected_input_not_a_model_failure(make_mapper):
    mapper = make_mapper()
    for i in range(4):
        mapper.process(frame(8 * i))
    before = mapper.saved_trajectory().poses().copy()
    for rgb in (np.zeros((1, 1, 3), np.uint8), np.zeros((10, 4000, 3), np.uint8)):
        outcome = mapper.process(InputFrame(rgb=rgb, stamp_ns=mapper.snapshot.last_stamp_ns + 1))
        assert [n.kind for n in outcome.notices] == [REJECTED], outcome.notices
    assert mapper.snapshot.rejected == 2 and mapper.snapshot.failed == 0 and mapper.snapshot.restarts == 0
    np.testing.assert_array_equal(mapper.saved_trajectory().poses(), before)
    assert len(mapper.process(frame(40)).new) == 1             # tracking goes on


def test_size_change_is_an_announced_restart(make_mapper):
    mapper = make_mapper()
    for i in range(4):
        mapper.process(frame(8 * i))
    outcome = mapper.process(frame(40, size=(320, 180)))
    assert [n.kind for n in outcome.notices] == [RESTART]
    assert "image size changed from 640x480 to 320x180" in outcome.notices[0].text
    assert mapper.snapshot.failed == 0 and mapper.snapshot.trajectory_poses == 4     # map continues
    assert mapper.snapshot.state == INITIALISING


def test_model_failure_is_counted_and_the_stream_restarts(make_mapper, monkeypatch):
    mapper = make_mapper()
    for i in range(4):
        mapper.process(frame(8 * i))

    def boom(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(mapper.session, "step", boom)
    outcome = mapper.process(frame(40))
    assert [n.kind for n in outcome.notices] == [FAILED] and "simulated" in outcome.notices[0].text
    assert mapper.snapshot.failed == 1 and "simulated" in mapper.snapshot.last_error
    monkeypatch.undo()
    assert mapper.process(frame(48)).new == [] and mapper.snapshot.state == INITIALISING


def test_a_failure_inside_the_phase_1_batch_counts_every_frame_of_it(make_mapper, monkeypatch):
    mapper = make_mapper()   # num_scale_frames 3: the third frame runs the batch of three
    step = mapper.session.step

    def poisoned(*args, **kwargs):   # the batch's middle result has a NaN depth: placing it fails
        results = step(*args, **kwargs)
        if len(results) > 1:
            bad = results[1].depth.clone()
            bad.view(-1)[0] = float("nan")
            results[1] = dataclasses.replace(results[1], depth=bad)
        return results

    monkeypatch.setattr(mapper.session, "step", poisoned)
    for i in range(3):
        mapper.process(frame(8 * i, stamp_s=1.0 + i))
    snapshot = mapper.snapshot
    # The first frame was placed; the failing one and the one after it are lost, counted once each.
    assert (snapshot.processed, snapshot.failed, snapshot.init_frames) == (1, 2, 0)
    assert snapshot.processed + snapshot.failed + snapshot.rejected + snapshot.init_frames == 3


@pytest.mark.parametrize("name", ["depth", "intrinsic", "world_points"])
def test_a_frame_with_non_finite_depth_intrinsics_or_points_is_a_counted_failure(make_mapper, monkeypatch,
                                                                                tmp_path, name):
    mapper = make_mapper()
    for i in range(4):
        mapper.process(frame(8 * i, stamp_s=1.0 + i))
    points_before = len(mapper.map_points()[0])
    step = mapper.session.step

    def poisoned(*args, **kwargs):   # the model's output for this one frame has one NaN
        results = step(*args, **kwargs)
        bad = getattr(results[0], name).clone()
        bad.view(-1)[0] = float("nan")
        return [dataclasses.replace(results[0], **{name: bad})]

    monkeypatch.setattr(mapper.session, "step", poisoned)
    outcome = mapper.process(frame(40, stamp_s=5.0))
    monkeypatch.undo()
    assert outcome.new == [] and [n.kind for n in outcome.notices] == [FAILED]
    assert "non-finite depth, intrinsics or points" in outcome.notices[0].text
    assert mapper.snapshot.failed == 1 and mapper.snapshot.trajectory_poses == 4
    xyz, _ = mapper.map_points()
    assert len(xyz) == points_before and np.isfinite(xyz).all()
    # Good frames afterwards: a new stream, placed; nothing non-finite in what is saved.
    outputs = [o for i in range(6, 10) for o in mapper.process(frame(8 * i, stamp_s=1.0 + i)).new]
    assert len(outputs) == 4 and mapper.snapshot.failed == 1
    saved = mapper.save(tmp_path)
    assert saved.num_poses == 8 and np.isfinite(read_ply(tmp_path / "map.ply")[0]).all()
    poses = read_tum(tmp_path / "trajectory.tum").poses()
    assert len(poses) == 8 and np.isfinite(poses).all()
    assert 5 * 10**9 not in read_tum(tmp_path / "trajectory.tum").stamps_ns().tolist()


def test_a_map_with_a_non_finite_point_is_neither_returned_nor_saved(make_mapper, monkeypatch, tmp_path):
    mapper = make_mapper()
    for i in range(4):
        mapper.process(frame(8 * i))
    xyz, rgb = mapper.map_points()
    xyz[0, 1] = np.inf                 # as if a conversion into map overflowed float32
    monkeypatch.setattr(mapper._store, "points", lambda *args: (xyz, rgb))
    with pytest.raises(FloatingPointError, match=f"1 of {len(xyz)} map points are not finite"):
        mapper.map_points()
    with pytest.raises(FloatingPointError):
        mapper.save(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_map_and_trajectory_are_bounded(make_mapper):
    mapper = make_mapper(max_map_points=50, max_trajectory_poses=3, map_voxel_size_m=0.001)
    notices = []
    for i in range(6):
        notices += mapper.process(frame(8 * i)).notices
    assert len(mapper.map_points()[0]) == 50
    assert mapper.snapshot.trajectory_poses == 3
    assert [n.kind for n in notices] == ["bound"]              # warned once


def test_warm_up_leaves_no_trace_and_refuses_a_live_stream(make_mapper):
    warmed, cold = make_mapper(warmup_image_size="320x240"), make_mapper()
    assert warmed.warm_up() > 0
    frames = [frame(8 * i) for i in range(5)]
    a = [o for f in frames for o in warmed.process(f).new]
    b = [o for f in frames for o in cold.process(f).new]
    np.testing.assert_array_equal(np.stack([o.camera_pose for o in a]), np.stack([o.camera_pose for o in b]))
    with pytest.raises(RuntimeError, match="before the first frame"):
        warmed.warm_up()


def test_save_writes_the_map_frame_trajectory(make_mapper, tmp_path):
    mapper = make_mapper()
    outputs = [o for i in range(5) for o in mapper.process(frame(8 * i, stamp_s=1.0 + i)).new]
    saved = mapper.save(tmp_path)
    assert saved.num_poses == 5 and saved.num_points == len(read_ply(tmp_path / "map.ply")[0])
    trajectory = read_tum(tmp_path / "trajectory.tum")
    assert trajectory.stamps_ns().tolist() == [k * 10**9 for k in (1, 2, 3, 4, 5)]
    # The saved trajectory is the robot base's (REP 105): with the default mount (the camera at
    # the base, looking along x) the base's pose is the camera's with the optical axes turned back.
    np.testing.assert_allclose(trajectory.poses(), np.stack([o.base_pose for o in outputs]), atol=1e-6)
    for o in outputs:
        expected = o.camera_pose.copy()
        expected[:3, :3] = o.camera_pose[:3, :3] @ R_MAP_FROM_OPTICAL.T
        np.testing.assert_allclose(o.base_pose, expected, atol=1e-6)
    # A camera at the model's origin is the base at the map's origin.
    np.testing.assert_allclose(mapper._stream.frames.conversion.base_pose(Placement().camera_pose(np.eye(4))), np.eye(4), atol=1e-12)


def test_settings_name_every_bad_value():
    with pytest.raises(SettingsError) as error:
        MapperSettings(sliding_window=0, device="gpu", keyframe_policy="often", map_voxel_size_m=0.0)
    text = str(error.value)
    for name in ("'sliding_window' must be >= 1", "'device' must be auto, cpu, cuda or cuda:N",
                 "'keyframe_policy' must be one of", "'map_voxel_size_m' must be >= 0.001"):
        assert name in text


def test_the_stamp_gap_rule_sees_frames_received_not_processed(make_mapper):
    """Regression: a slow step made a newest-frame-wins node skip frames; the next processed
    stamp was 16 s later and the node restarted and cleared its map (again at every phase 1).
    A frame carries the input's own gap before it (InputFrame.gap_ns); only that counts."""
    mapper = make_mapper()
    for i in range(4):
        mapper.process(frame(8 * i, stamp_s=100.0 + 0.1 * i))
    skipped = dataclasses.replace(frame(40, stamp_s=116.3), gap_ns=10**8)   # 160 frames skipped
    assert not mapper.process(skipped).notices and mapper.snapshot.restarts == 0
    gap = dataclasses.replace(frame(48, stamp_s=132.3), gap_ns=16 * 10**9)  # a gap in the input
    assert not mapper.process(gap).notices and mapper.snapshot.held_frames == 1
    assert "gap of 16.000 s" in mapper.process(frame(52, stamp_s=132.4)).notices[0].text
    mapper.process(frame(56, stamp_s=150.0))                   # no gap_ns: the stamps'
    assert mapper.process(frame(60, stamp_s=150.1)).notices[0].kind == RESTART


def test_settings_check_what_the_scale_estimator_needs():
    """Regression: scale_min_pairs 1 passed the settings, then the Mapper's constructor raised."""
    with pytest.raises(SettingsError, match="'scale_min_pairs' \\(1\\) must be >= 2"):
        MapperSettings(scale_source="odometry", scale_min_pairs=1)
    with pytest.raises(SettingsError, match="at most scale_window_pairs"):
        MapperSettings(scale_min_pairs=20, scale_window_pairs=10)
