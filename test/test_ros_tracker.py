"""Tracker with a real tiny session (no DDS): motion keyframes, rollback of map points, caps, stamps.

The fixture checkpoint runs at a 112-pixel input width on CPU; frames are one textured image
shifted sideways, so the motion policy's parallax is known (a shift of s pixels at 640 px is s/2
at the policy's 320 px working width).
"""
import itertools

import cv2
import numpy as np
import pytest

from lingbot_ros.cache import NothingToRollback
from lingbot_ros.ros import model_loader, params
from lingbot_ros.ros.frames import optical_pose_to_map
from lingbot_ros.ros.tracker import INITIALISING, RESET, TRACKING, InputFrame, Tracker

pytestmark = pytest.mark.usefixtures("torch_single_thread")


@pytest.fixture(scope="module")
def fixture_files(shared_dir):
    fixture = shared_dir / "fixtures" / "tiny_default"
    if not (fixture / "ckpt.pt").exists():
        pytest.skip(f"tiny fixture missing under {shared_dir}")
    return {"checkpoint": str(fixture / "ckpt.pt"), "model_config": str(fixture / "config.json")}


@pytest.fixture
def make_tracker(fixture_files):
    def make(**overrides) -> Tracker:
        cfg = params.validate({**fixture_files, "device": "cpu", "image_width": 112,
                               "num_scale_frames": 3, "sliding_window": 2, "min_confidence": 0.0,
                               "points_stride": 2, **overrides})
        loaded = model_loader.load(cfg)
        return Tracker(loaded.session, loaded.preprocessor, cfg, cfg.num_scale_frames)
    return make


_BASE = cv2.resize((np.random.default_rng(1).random((60, 80)) * 255).astype(np.uint8), (640, 480),
                   interpolation=cv2.INTER_CUBIC)
_counter = itertools.count()


def frame(shift_px: int = 0, stamp_s: float | None = None) -> InputFrame:
    """The textured image shifted right by ``shift_px``; stamps advance 0.1 s per call."""
    stamp_s = next(_counter) * 0.1 if stamp_s is None else stamp_s
    rgb = np.ascontiguousarray(np.dstack([np.roll(_BASE, shift_px, axis=1)] * 3))
    return InputFrame(rgb=rgb, stamp=None, stamp_ns=round(stamp_s * 1e9), frame_id="cam",
                      received_ns=0)


def stored(tracker) -> int:
    return tracker.session.stats()["frames_stored"]


def spy(monkeypatch, obj, name) -> list:
    """Count calls of obj.name while still running it."""
    calls, original = [], getattr(obj, name)
    monkeypatch.setattr(obj, name, lambda *a, **k: (calls.append(a), original(*a, **k))[1])
    return calls


def test_motion_policy_keeps_and_flushes_or_rolls_back(make_tracker, monkeypatch):
    tracker = make_tracker(keyframe_policy="motion", keyframe_min_parallax_px=4.0)
    flushes, rollbacks = spy(monkeypatch, tracker.session, "flush"), \
        spy(monkeypatch, tracker.session, "rollback_last_frame")
    for shift in (0, 12, 24):                        # the scale frames are always kept
        outputs = tracker.process(frame(shift))
    assert [o.is_keyframe for o in outputs] == [True] * 3 and stored(tracker) == 3
    assert (len(flushes), len(rollbacks)) == (0, 0)
    map_before = tracker.map_points()[0].copy()

    outputs = tracker.process(frame(26))             # 1 px at 320: too little motion
    assert len(outputs) == 1 and not outputs[0].is_keyframe and outputs[0].pose_map.shape == (4, 4)
    assert stored(tracker) == 3 and (len(flushes), len(rollbacks)) == (0, 1)
    np.testing.assert_array_equal(tracker.map_points()[0], map_before)

    # Each 8 px step is kept and flushed; past anchors + window (3 + 2) frames get evicted, and
    # the flush frees their pages at once instead of leaving them pending.
    for n, shift in enumerate((40, 56, 72, 88), start=1):
        (output,) = tracker.process(frame(shift))
        assert output.is_keyframe and stored(tracker) == 3 + n
        assert (len(flushes), len(rollbacks)) == (n, 1)
        assert tracker.session.stats()["kv_cache"].pending_pages == 0
    assert tracker.session.stats()["kv_cache"].window_pages == 2


def test_rollback_removes_the_newest_keyframe_points_from_the_map(make_tracker):
    frames = [frame(8 * i) for i in range(5)]
    reference = make_tracker()
    for f in frames[:4]:
        reference.process(f)
    rolled = make_tracker()
    for f in frames:
        rolled.process(f)
    assert len(rolled.map_points()[0]) > 0 and stored(rolled) == 5

    rolled2 = make_tracker()
    for f in frames:
        rolled2.process(f)
    assert rolled2.rollback_last_frame() is True     # frame 5's points were still pending
    assert stored(rolled2) == 4
    for got, want in zip(rolled2.map_points(), reference.map_points()):
        np.testing.assert_array_equal(got, want)
    assert not np.array_equal(rolled.map_points()[0], reference.map_points()[0])
    # Frame 4 was merged when frame 5 arrived: a second rollback cannot take its points back.
    assert rolled2.rollback_last_frame() is False and stored(rolled2) == 3
    np.testing.assert_array_equal(rolled2.map_points()[0], reference.map_points()[0])


def test_rollback_while_buffering_drops_the_scale_frame(make_tracker):
    tracker = make_tracker()
    with pytest.raises(NothingToRollback):
        tracker.rollback_last_frame()
    tracker.process(frame(0))
    tracker.process(frame(8))
    assert tracker.state == INITIALISING and tracker.init_frames == 2
    assert tracker.rollback_last_frame() is True
    assert tracker.init_frames == 1 and tracker.state_text == "initialising 1/3"
    assert tracker.process(frame(16)) == []           # still needs a third scale frame
    assert len(tracker.process(frame(24))) == 3 and tracker.state == TRACKING


def test_cache_caps_name_the_limit(make_tracker):
    tracker = make_tracker(max_keyframes=4)
    for i in range(3):
        tracker.process(frame(8 * i))
    assert tracker.cap_reason(tracker.cache()) is None
    tracker.process(frame(24))
    assert tracker.cap_reason(tracker.cache()) == "cache cap: 4 keyframes stored (max_keyframes=4)"

    tracker = make_tracker(max_keyframes=0, max_cache_mb=0.001)
    for i in range(3):
        tracker.process(frame(8 * i))
    assert tracker.cap_reason(tracker.cache()).startswith("cache cap: ")
    assert "(max_cache_mb=0.001)" in tracker.cap_reason(tracker.cache())


def test_reset_keeping_the_map_continues_from_the_last_pose(make_tracker):
    tracker = make_tracker()
    for i in range(4):
        outputs = tracker.process(frame(8 * i))
    points = len(tracker.map_points()[0])
    tracker.reset("cache cap", keep_map=True)
    assert tracker.state == RESET and stored(tracker) == 0 and tracker.resets == 1
    assert len(tracker.voxel_map) == points and len(tracker.trajectory) == 4
    # The new stream's origin is the last camera: a first camera at the model's identity lands
    # exactly where the old stream left off.
    np.testing.assert_allclose(tracker.origin @ optical_pose_to_map(np.eye(4)), outputs[-1].pose_map,
                               atol=1e-9)
    for i in range(3):
        after = tracker.process(frame(8 * i))
    np.testing.assert_allclose(after[0].pose_map,
                               tracker.origin @ optical_pose_to_map(after[0].result.extrinsic.numpy()),
                               atol=1e-6)

    tracker.reset("reset service", keep_map=False)
    assert len(tracker.voxel_map) == 0 and len(tracker.trajectory) == 0


def test_stamp_checks(make_tracker):
    tracker = make_tracker(max_stamp_gap_s=1.0)
    assert tracker.check_stamp(frame(0, 10.0)) is None           # nothing seen yet
    tracker.process(frame(0, 10.0))
    assert tracker.check_stamp(frame(0, 10.9)) is None
    assert "gap of 1.500 s" in tracker.check_stamp(frame(0, 11.5))
    assert "went back by 0.500 s" in tracker.check_stamp(frame(0, 9.5))
    assert make_tracker(max_stamp_gap_s=0.0).check_stamp(frame(0, 1e6)) is None
