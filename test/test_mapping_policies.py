"""mapping/'s policies without a model, as the cache's tests are: the live windowed policy
(LiveWindows) stepped by hand with synthetic frame results, the cache caps of the reset policy
(CacheCaps), how the applied metric scale follows its estimate (applied_scale), the motion keyframe
policy (MotionPolicy) and a session run's bookkeeping (SessionRun). Each against a plain reference
or a table of steps; no checkpoint, no ../shared.
"""
import dataclasses
import math
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from lingbot_ros.mapping.keyframes import FLUSH, KEEP, ROLLBACK, WORK_WIDTH, MotionPolicy, parallax_px, to_work_gray
from lingbot_ros.mapping.windows.live import ROLLBACK_MARGIN, LiveWindows, Pending
from lingbot_ros.mapping.long_run import CacheCaps, NoRestarts
from lingbot_ros.stream.session import NOTHING_STORED, CacheUsage
from lingbot_ros.mapping.placement.metric_scale import MetricScale
from lingbot_ros.mapping.records import InputFrame
from lingbot_ros.mapping.placement.metric_scale import applied_scale
from lingbot_ros.mapping.windows.similarity import rotations_to_quaternions
from lingbot_ros.mapping.streams import SessionRun
from lingbot_ros.mapping.windows.rule import WindowError, WindowRule
from lingbot_ros.model.geometry import pose_to_extrinsic
from lingbot_ros.stream import FrameResult

# ----------------------------------------------------------------------------- LiveWindows

H = W = 2   # a 2x2 depth map is enough: the alignment reads depth ratios and camera poses


def result(index: int, centre, rotation=torch.eye(3), depth: float = 1.0) -> FrameResult:
    """A frame result whose camera sits at ``centre`` with camera-to-world ``rotation``."""
    pose = torch.cat([torch.as_tensor(centre, dtype=torch.float32),
                      rotations_to_quaternions(rotation.float()), torch.tensor([1.0, 1.0])])
    return FrameResult(index=index, is_keyframe=True, time_index=index, pose_enc=pose, pose_enc_list=pose[None],
                       extrinsic=pose_to_extrinsic(pose), intrinsic=torch.eye(3), depth=torch.full((H, W), depth),
                       depth_conf=torch.ones(H, W), world_points=torch.zeros(H, W, 3), image=torch.zeros(3, H, W),
                       image_size=(W, H))


def pending(index: int) -> Pending:
    return Pending(frame=InputFrame(rgb=np.zeros((4, 4, 3), np.uint8), stamp_ns=index), index=index,
                   position=-1, rerun=False, image=torch.zeros(3, H, W))


# Window 1's model frame is window 0's moved by S^-1: X0 = s R X1 + t. A frame seen again in
# window 1 has its centre at R^T (c0 - t) / s, its rotation R^T R0 and its depth d0 / s.
S, R, T = 2.0, torch.tensor([[0.0, -1, 0], [1, 0, 0], [0, 0, 1]]), torch.tensor([1.0, -2.0, 0.5])
CENTRES = [torch.tensor([0.3 * i, 0.1 * i, 0.0]) for i in range(8)]


def seen_again(index: int) -> FrameResult:
    return result(index, R.T @ (CENTRES[index] - T) / S, R.T, depth=1.0 / S)


def test_a_window_rule_the_live_policy_cannot_follow_is_refused():
    with pytest.raises(WindowError, match="not shorter than the window"):
        LiveWindows(WindowRule(window_size=4, num_scale_frames=2, overlap_size=4), "anchor")


def test_live_windows_step_by_step_through_two_windows_of_four_with_an_overlap_of_two():
    windows = LiveWindows(WindowRule(window_size=4, num_scale_frames=2, overlap_size=2), "anchor")
    assert (windows.length, windows.overlap) == (4, 2)
    assert windows.inputs.maxlen == 2 + ROLLBACK_MARGIN

    # Window 0: placed at once with the identity; positions 0 and 1 are final, 2 and 3 provisional.
    window0 = {}
    for i in range(4):
        p = windows.enter(pending(i))
        assert p.position == i and windows.switch_due == (i == 3)   # full after the fourth
        [(placed, warped)] = windows.place(p, result(i, CENTRES[i]))
        assert placed is p and torch.allclose(warped.pose_enc[:3], CENTRES[i])
        window0[i] = warped
    assert [windows.is_final(k) for k in range(4)] == [True, True, False, False]
    assert windows.switch_due and windows.switch_refusal() == ""
    assert [(r.window, r.first_index) for r in windows.records] == [(0, 0)]

    # The switch: the last two frames run again in window 1, marked as re-runs, at positions 0, 1.
    reruns = windows.next_window()
    assert [(p.index, p.rerun) for p in reruns] == [(2, True), (3, True)]
    assert windows.number == 1 and windows.count == 0 and windows.similarity is None
    assert windows.switch_refusal() != ""   # nothing of window 1 placed yet: no further switch

    # Nothing is placed until the whole overlap has a result; then both at once, aligned.
    assert windows.place(windows.enter(reruns[0]), seen_again(2)) == []
    placed = windows.place(windows.enter(reruns[1]), seen_again(3))
    assert [p.index for p, _ in placed] == [2, 3]
    for p, warped in placed:   # back in window 0's frame: the same centre, rotation and depth
        np.testing.assert_allclose(warped.pose_enc[:7], window0[p.index].pose_enc[:7], atol=1e-5)
        np.testing.assert_allclose(warped.depth, window0[p.index].depth, atol=1e-5)
    record = windows.records[-1]
    assert (record.window, record.first_index) == (1, 2)
    assert windows.last_scale == pytest.approx(S) and record.overlap_error == pytest.approx(0.0, abs=1e-5)

    # A new frame in window 1 is placed at once, warped by the window's similarity.
    p4 = windows.enter(pending(4))
    assert p4.position == 2 and not windows.is_final(p4.position)
    [(_, warped)] = windows.place(p4, seen_again(4))
    np.testing.assert_allclose(warped.pose_enc[:3], CENTRES[4], atol=1e-5)

    # Rollback: the newest new frame can go; a re-run frame cannot.
    assert windows.refuses_rollback(had_result=True) == ""
    windows.hold(SimpleNamespace(index=4))
    assert windows.forget_newest(had_result=True).index == 4
    assert windows.count == 2 and [p.index for p in windows.inputs] == [2, 3] and len(windows.tail) == 2
    assert "run again to align two windows" in windows.refuses_rollback(had_result=True)


def test_provisional_outputs_are_superseded_by_the_rerun_or_final_at_the_end():
    windows = LiveWindows(WindowRule(window_size=4, num_scale_frames=2, overlap_size=2), "anchor")
    for index in (2, 3):
        windows.hold(SimpleNamespace(index=index))
    assert windows.is_provisional(2) and [o.index for o in windows.provisional()] == [2, 3]
    windows.finalised(2)                               # the next window ran frame 2 again
    assert not windows.is_provisional(2) and windows.is_provisional(3)
    resumed, outputs = windows.end()                   # the stream ends: frame 3's value is final
    assert resumed == {} and [o.index for o in outputs] == [3] and windows.provisional() == []


def test_new_window_asks_for_a_switch_at_the_next_frame():
    windows = LiveWindows(WindowRule(window_size=4, num_scale_frames=2, overlap_size=2), "anchor")
    for i in range(2):
        windows.place(windows.enter(pending(i)), result(i, CENTRES[i]))
    assert not windows.switch_due
    windows.switch_asked = True
    assert windows.switch_due and [p.index for p in windows.next_window()] == [0, 1]
    assert not windows.switch_asked


def test_rollback_is_refused_once_the_kept_inputs_are_used_up():
    windows = LiveWindows(WindowRule(window_size=40, num_scale_frames=2, overlap_size=2), "anchor")
    for i in range(3):
        windows.place(windows.enter(pending(i)), result(i, CENTRES[i]))
    for _ in range(3):
        assert windows.refuses_rollback(had_result=True) == ""
        windows.forget_newest(had_result=True)
    assert "keeps the inputs of its newest" in windows.refuses_rollback(had_result=True)


# ----------------------------------------------------------------------------- CacheCaps

def stats(stored: int, kv_bytes, camera_bytes: int) -> CacheUsage:
    """The session's usage with ``kv_bytes`` of KV cache in use (None: not allocated yet)."""
    return CacheUsage(frames_stored=stored, pages=0, bytes_allocated=0, bytes_in_use=(kv_bytes or 0) + camera_bytes)


@settings(max_examples=300, deadline=None)
@given(max_keyframes=st.integers(0, 50), max_cache_mb=st.sampled_from([0.0, 0.5, 1.0, 3.5]),
       stored=st.integers(0, 60), kv_bytes=st.one_of(st.none(), st.integers(0, 4 * 2**20)),
       camera_bytes=st.integers(0, 2**20))
def test_cache_caps_restart_exactly_when_a_cap_is_reached(max_keyframes, max_cache_mb, stored, kv_bytes, camera_bytes):
    """Against the rule written plainly: a cap of 0 is off; either cap reached restarts, the
    keyframe cap named first; memory is the KV cache's (none before phase 1) plus the camera cache's."""
    reason = CacheCaps(max_keyframes, max_cache_mb).restart_reason(stats(stored, kv_bytes, camera_bytes))
    in_use = (kv_bytes or 0) + camera_bytes
    if max_keyframes and stored >= max_keyframes:
        assert reason == f"cache cap: {stored} keyframes stored (max_keyframes={max_keyframes})"
    elif max_cache_mb and in_use >= max_cache_mb * 2**20:
        assert reason is not None and f"(max_cache_mb={max_cache_mb:g})" in reason
    else:
        assert reason is None


def test_no_restarts_never_restarts():
    assert NoRestarts().restart_reason(stats(10**6, 10**12, 10**12)) is None


# ----------------------------------------------------------------------------- applied_scale

def scale(value: float, known: bool = True) -> MetricScale:
    return MetricScale(known=known, scale=value if known else 1.0, spread=0.01 if known else math.inf, pairs=10,
                       reason="" if known else "not yet")


def test_the_first_known_estimate_is_taken_and_an_unknown_one_changes_nothing():
    unknown = scale(1.0, known=False)
    assert applied_scale(unknown, unknown, 0.05) is unknown
    assert applied_scale(unknown, scale(3.0), 0.05).scale == 3.0   # taken as it is, however far
    assert applied_scale(scale(2.0), unknown, 0.05).scale == 2.0   # lost confidence: kept


@settings(max_examples=300, deadline=None)
@given(applied=st.floats(0.01, 100), estimate=st.floats(0.01, 100), step=st.sampled_from([0.0, 0.01, 0.05, 0.5]))
def test_a_known_scale_follows_the_estimate_by_bounded_steps_without_overshooting(applied, estimate, step):
    got = applied_scale(scale(applied), scale(estimate), step).scale
    if step == 0.0 or abs(math.log(estimate / applied)) <= math.log1p(step):
        assert got == applied                                          # frozen, or within the band
    else:
        assert got == pytest.approx(applied * (1 + step) ** (1 if estimate > applied else -1))
        assert min(applied, estimate) <= got <= max(applied, estimate)   # towards it, never past it


def test_repeated_estimates_bring_the_scale_within_one_step():
    current = scale(1.0)
    for _ in range(200):
        current = applied_scale(current, scale(10.0), 0.05)
    assert abs(math.log(current.scale / 10.0)) <= math.log1p(0.05)


# ----------------------------------------------------------------------------- MotionPolicy

TEXTURE = cv2.resize((np.random.default_rng(3).random((60, 80)) * 255).astype(np.uint8), (640, 480),
                     interpolation=cv2.INTER_CUBIC)


def shifted(px: int, size=(640, 480)) -> np.ndarray:
    rgb = np.ascontiguousarray(np.dstack([np.roll(TEXTURE, px, axis=1)] * 3))
    return rgb if size == (640, 480) else cv2.resize(rgb, size, interpolation=cv2.INTER_AREA)


def test_motion_policy_step_by_step():
    policy = MotionPolicy(min_parallax_px=4.0)
    assert policy.is_keyframe(shifted(0)) and policy.last_parallax_px == math.inf   # the first frame
    assert not policy.is_keyframe(shifted(2))              # 1 px at the 320 px working width
    assert policy.last_parallax_px == pytest.approx(2 * WORK_WIDTH / 640, abs=0.3)
    assert not policy.is_keyframe(shifted(6))              # still measured from frame 0 (3 px)
    assert policy.is_keyframe(shifted(10))                 # 5 px from frame 0: the new reference
    assert not policy.is_keyframe(shifted(12))             # 1 px from the new reference
    assert not policy.is_keyframe(shifted(12, size=(320, 240)))   # half the size: the same working copy
    assert policy.is_keyframe(shifted(12, size=(640, 360)))   # another aspect: nothing to compare
    assert policy.last_parallax_px == math.inf
    assert not policy.is_keyframe(shifted(12, size=(640, 360)))
    policy.reset()
    assert policy.is_keyframe(shifted(12, size=(640, 360)))   # after a reset: the first frame again


def test_parallax_measures_image_motion():
    reference = to_work_gray(shifted(0))
    assert parallax_px(reference, to_work_gray(shifted(0))) < 0.5
    assert 9 < parallax_px(reference, to_work_gray(shifted(20))) < 11   # 20 px at 640 = 10 at 320
    assert parallax_px(reference, np.zeros((10, 10), np.uint8)) == float("inf")


def test_the_motion_policy_decides_what_a_stored_frame_becomes():
    """Phase 1 keeps every frame (it only sets the reference); after it a frame that moved is
    flushed in, one that did not is rolled back, each measured from the last kept one."""
    policy = MotionPolicy(min_parallax_px=4.0)
    steps = [(0, False, KEEP), (2, False, KEEP),           # phase 1: 0 is the reference, 2 moved 1 px
             (4, True, ROLLBACK), (10, True, FLUSH),      # 2 px, then 5 px from frame 0
             (12, True, ROLLBACK), (20, True, FLUSH)]     # 1 px, then 5 px from frame 10
    assert [policy.decide(shifted(px), in_phase2) for px, in_phase2, _ in steps] == [d for *_, d in steps]


# ----------------------------------------------------------------------------- SessionRun

def test_session_run_keeps_the_newest_frames_rollback_may_need():
    run = SessionRun.new(rollback_depth=2, keyframe_interval=3, motion=None)
    assert run.given.maxlen == 2 * 3 + 1 and run.stored.maxlen == 2
    run.given.extend(range(20))
    run.stored.extend(range(20))
    assert list(run.given) == list(range(13, 20)) and list(run.stored) == [18, 19]
    run.awaiting.extend([dataclasses.replace(pending(0), rerun=True), pending(1), pending(2)])
    assert run.buffered_new() == 2   # a window's re-run frame was placed before


def test_session_run_says_why_the_newest_frame_cannot_be_rolled_back():
    run = SessionRun.new(rollback_depth=2, keyframe_interval=1, motion=None)
    assert run.rollback_refusal() == NOTHING_STORED                 # nothing given yet: the session's words
    run.give(pending(0))
    assert run.rollback_refusal() == ""                             # a buffered scale frame: dropped
    assert list(run.given) == [0] and [p.index for p in run.awaiting] == [0]
    run.awaiting.clear()                                            # phase 1 ran
    run.given.extend([1, 2])
    run.stored.extend([1, 2])
    assert run.rollback_refusal() == ""                             # the newest given is stored
    run.given.append(3)                                             # not stored (not a keyframe)
    assert run.rollback_refusal().startswith("the newest frame (3) is not stored in the cache")
