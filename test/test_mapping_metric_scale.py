"""mapping/placement/metric_scale.py: the scale from synthetic odometry of known scale and noise.

The synthetic robot drives in metres (straights, arcs, stops, turns in place); the "model" sees
its base positions divided by S_TRUE, in a frame of its own (rotated, shifted), with noise and
outlier frames; the odometry sees them in another frame, with noise and slow drift.
"""
import math

import numpy as np
import pytest

from lingbot_ros.mapping.placement.metric_scale import (SCALE_SOURCES, FixedScale, MetricScale,
                                              MetricScaleEstimator, NoScale, ScaleInputError,
                                              make_scale_source)
from lingbot_ros.mapping.placement.geometry import quaternion_to_rotation

S_TRUE = 3.7          # metres per model unit
KEYFRAME_NS = 300_000_000
SEEDS = list(range(12))


def rotation_z(angle):
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def drive(plan, step_m=0.12, turn_step=0.3):
    """True base poses [N, 4, 4] (metres) for a plan of ("straight", metres), ("arc", radius,
    radians), ("turn", radians: in place) and ("stop", keyframes), one pose per keyframe."""
    position, heading, poses = np.zeros(3), 0.0, []

    def keep():
        pose = np.eye(4)
        pose[:3, :3], pose[:3, 3] = rotation_z(heading), position
        poses.append(pose)

    keep()
    for kind, *args in plan:
        if kind == "straight":
            for _ in range(max(1, round(args[0] / step_m))):
                position = position + step_m * np.array([math.cos(heading), math.sin(heading), 0.0])
                keep()
        elif kind == "arc":
            radius, angle = args
            steps = max(1, round(abs(angle) * radius / step_m))
            for _ in range(steps):
                heading_mid = heading + angle / steps / 2
                chord = 2 * radius * math.sin(abs(angle) / steps / 2)
                position = position + chord * np.array([math.cos(heading_mid), math.sin(heading_mid), 0.0])
                heading += angle / steps
                keep()
        elif kind == "turn":
            steps = max(1, round(abs(args[0]) / turn_step))
            for _ in range(steps):
                heading += args[0] / steps
                keep()
        elif kind == "stop":
            for _ in range(args[0]):
                keep()
        else:
            raise AssertionError(kind)
    return np.array(poses)


# About 46 m of driving (465 keyframes): enough for a full window of 50 pairs or more at 0.2 m+ a pair.
TOUR = [("straight", 6.0), ("stop", 30), ("arc", 2.0, math.pi), ("turn", 2 * math.pi),
        ("straight", 4.0), ("arc", 1.0, -math.pi / 2), ("stop", 20), ("straight", 8.0),
        ("turn", -math.pi), ("arc", 3.0, 1.5 * math.pi), ("straight", 6.0)]


def rigid(rng):
    """A random frame: rotation [3, 3], translation [3]."""
    return quaternion_to_rotation(rng.normal(size=4)), rng.normal(scale=5.0, size=3)


def observe(truth, rng, model_noise=0.02, model_jitter_m=0.002, outlier_rate=0.05,
            odom_noise_m=0.003, odom_drift=0.005, model_frame=None):
    """(model positions [N, 3] in model units, odometry poses [N, 4, 4] T_odom_base).

    Model: each true displacement perturbed by ``model_noise`` of its length (accumulating, as a
    visual odometry drifts), plus ``model_jitter_m`` of white noise per position, ``outlier_rate``
    of the frames off by about a metre; then moved into the model's frame (``model_frame`` or a
    random one) and divided by S_TRUE. Odometry: the true poses in the odom frame, white noise
    ``odom_noise_m`` per axis, and a random walk of ``odom_drift`` per metre travelled per axis.
    """
    positions = truth[:, :3, 3]
    steps = np.diff(positions, axis=0)
    lengths = np.linalg.norm(steps, axis=1, keepdims=True)
    rotation_m, shift_m = model_frame or rigid(rng)
    noisy = steps + model_noise * lengths * rng.normal(size=steps.shape) / math.sqrt(3)
    model = np.vstack([np.zeros(3), np.cumsum(noisy, axis=0)])
    model += model_jitter_m * rng.normal(size=model.shape)
    outliers = rng.random(len(model)) < outlier_rate
    model[outliers] += rng.normal(scale=1.0, size=(outliers.sum(), 3))
    model = (model @ rotation_m.T + shift_m) / S_TRUE

    rotation_o, shift_o = rotation_z(rng.uniform(0, 2 * math.pi)), rng.normal(scale=5.0, size=3)
    drift_steps = odom_drift * lengths * rng.normal(size=steps.shape)
    drift = np.vstack([np.zeros(3), np.cumsum(drift_steps, axis=0)])
    odom = np.array(truth)
    odom[:, :3, :3] = rotation_o @ truth[:, :3, :3]
    odom[:, :3, 3] = ((positions + drift) @ rotation_o.T + shift_o
                      + odom_noise_m * rng.normal(size=positions.shape))
    return model, odom


def feed(estimator, model, odom, start=0, states=False):
    """Give keyframes to the estimator; the state after each one when ``states``."""
    seen = []
    for k, (position, pose) in enumerate(zip(model, odom)):
        estimator.add_keyframe((start + k) * KEYFRAME_NS, position, pose)
        if states:
            seen.append(estimator.state())
    return seen


def relative_error(state):
    return state.scale / S_TRUE - 1


# --- recovery ----------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_scale_is_recovered_within_2_percent(seed):
    """The issue's claim, on a tour with stops, turns in place, 5% outlier frames, 2% model
    noise per displacement, millimetre jitter, and odometry noise with drift: once the window
    holds 20 pairs (about 5 m of driving at 0.24 m a pair) the scale is known and every estimate
    is within 2% (the worst over 200 seeds was 1.65% when this was written)."""
    rng = np.random.default_rng(seed)
    model, odom = observe(drive(TOUR), rng)
    states = feed(MetricScaleEstimator(), model, odom, states=True)
    later = [s for s in states if s.pairs >= 20]
    assert later, "the tour gave fewer than 20 pairs"
    assert all(s.known for s in later), [s.reason for s in later if not s.known][:1]
    assert max(abs(relative_error(s)) for s in later) < 0.02
    assert states[-1].pairs == 50   # the window is full and bounded


def test_frames_do_not_matter():
    """Only displacement lengths count: the same noise in another model frame gives the same scale."""
    truth = drive(TOUR)
    estimates = []
    for frame_seed in (1, 2):
        model, odom = observe(truth, np.random.default_rng(7),
                              model_frame=rigid(np.random.default_rng(frame_seed)))
        estimator = MetricScaleEstimator()
        feed(estimator, model, odom)
        estimates.append(estimator.state())
    assert estimates[0].scale == pytest.approx(estimates[1].scale, rel=1e-9)
    assert estimates[0].spread == pytest.approx(estimates[1].spread, rel=1e-6)


def run_seeds(count, **noise):
    """Final states of ``count`` tours, outlier-free, with ``noise`` passed to ``observe``."""
    finals = []
    for seed in range(count):
        model, odom = observe(drive(TOUR), np.random.default_rng(1000 + seed), outlier_rate=0.0, **noise)
        estimator = MetricScaleEstimator()
        feed(estimator, model, odom)
        finals.append(estimator.state())
    assert all(s.known and s.pairs == 50 for s in finals)
    rms_error = math.sqrt(np.mean([math.log(s.scale / S_TRUE) ** 2 for s in finals]))
    return rms_error, float(np.mean([s.spread for s in finals]))


@pytest.mark.parametrize("model_noise", [0.02, 0.08])
def test_spread_is_the_standard_error_for_independent_pairs(model_noise):
    """Noise per displacement only (each pair's error independent of the others): over 40 seeds
    the estimates' error (root mean square, bias included) is what the spread says, within the
    sampling error of 40 seeds (about 11%) three times over."""
    rms_error, mean_spread = run_seeds(40, model_noise=model_noise, model_jitter_m=0.0, odom_noise_m=0.0)
    assert 0.7 < rms_error / mean_spread < 1.4
    assert mean_spread > model_noise / 20   # about noise / sqrt(2 * 50): it follows the noise


def test_spread_does_not_understate_white_position_noise():
    """White noise on positions makes neighbouring pairs' errors cancel partly (the displacements
    add up to one displacement); pairs are taken as independent, so the spread errs high."""
    rms_error, mean_spread = run_seeds(40, model_jitter_m=0.01)
    assert rms_error < mean_spread


# --- hand-computed cases -------------------------------------------------------------------------

def along_x(odom_steps_m, model_steps, start_odom=0.0):
    """Keyframes on a line: odometry poses [N, 4, 4] and model positions [N, 3] from their steps."""
    odom_x = start_odom + np.concatenate([[0.0], np.cumsum(odom_steps_m)])
    model_x = np.concatenate([[0.0], np.cumsum(model_steps)])
    odom = np.repeat(np.eye(4)[None], len(odom_x), axis=0)
    odom[:, 0, 3] = odom_x
    model = np.zeros((len(model_x), 3))
    model[:, 0] = model_x
    return model, odom


def test_outlier_pairs_are_clipped_hand_computed():
    """Ratios 3.6, 3.7, 3.8, 3.7, 100: median log 3.7, MAD 0.0267 (ln 3.8/3.7), band 3 * 1.4826
    MAD = 0.119: 100 is out, the estimate is the geometric mean of the other four."""
    ratios = np.array([3.6, 3.7, 3.8, 3.7, 100.0])
    model, odom = along_x(np.ones(5), 1.0 / ratios)
    estimator = MetricScaleEstimator(min_pairs=2, max_spread=0.5)
    feed(estimator, model, odom)
    state = estimator.state()
    inlier_logs = np.log(ratios[:4])
    assert state.known and state.pairs == 5
    assert state.scale == pytest.approx((3.6 * 3.7 * 3.8 * 3.7) ** 0.25, rel=1e-12)
    assert state.spread == pytest.approx(np.std(inlier_logs, ddof=1) / 2, rel=1e-9)


def test_noise_free_pairs_with_wild_outliers_give_the_exact_scale():
    rng = np.random.default_rng(3)
    ratios = np.full(40, S_TRUE)
    ratios[rng.choice(40, 15, replace=False)] = rng.uniform(0.1, 50.0, 15)   # 15 of 40 are wrong
    model, odom = along_x(np.full(40, 0.5), 0.5 / ratios)
    estimator = MetricScaleEstimator()
    feed(estimator, model, odom)
    assert estimator.state().scale == pytest.approx(S_TRUE, rel=1e-12)
    assert estimator.state().spread < 1e-12


def test_a_slow_robot_still_gives_pairs():
    """0.03 m per keyframe: a pair closes every 7 keyframes (0.21 m >= 0.2 m), so 70 steps give 10."""
    model, odom = along_x(np.full(70, 0.03), np.full(70, 0.03 / S_TRUE))
    estimator = MetricScaleEstimator()
    states = feed(estimator, model, odom, states=True)
    assert [s.pairs for s in states[:8]] == [0] * 7 + [1]
    assert states[-1].pairs == 10 and states[-1].known
    assert states[-1].scale == pytest.approx(S_TRUE, rel=1e-12)


def test_standing_still_adds_no_pair_and_moves_nothing():
    rng = np.random.default_rng(5)
    plan = [("straight", 12.0), ("stop", 80), ("straight", 1.0)]
    truth = drive(plan)
    model, odom = observe(truth, rng, outlier_rate=0.0)
    estimator = MetricScaleEstimator()
    moving = round(12.0 / 0.12) + 1
    feed(estimator, model[:moving], odom[:moving])
    before = estimator.state()
    assert before.known
    stopped = feed(estimator, model[moving:moving + 80], odom[moving:moving + 80], start=moving,
                   states=True)
    assert all(s == before for s in stopped)


def test_reason_while_standing_still_before_the_scale_is_known():
    model, odom = along_x([0.3, 0.3] + [0.0] * 5, [0.1, 0.1] + [0.0] * 5)
    estimator = MetricScaleEstimator(min_pairs=5)
    feed(estimator, model, odom)
    state = estimator.state()
    assert not state.known and state.scale == 1.0 and state.pairs == 2
    assert state.reason == ("robot not moving (standing still or turning in place) for 5 keyframes: "
                            "2 of 5 pairs")


def test_turning_in_place_gives_no_pair():
    """A robot spinning on the spot: its base does not move on either side (the model's base
    position jitters by millimetres), so no pair forms."""
    truth = drive([("turn", 4 * math.pi)], turn_step=0.1)
    model, odom = observe(truth, np.random.default_rng(11), outlier_rate=0.0)
    estimator = MetricScaleEstimator()
    feed(estimator, model, odom)
    state = estimator.state()
    assert len(truth) > 100 and state.pairs == 0 and not state.known
    assert state.reason.startswith("robot not moving (standing still or turning in place) for ")


def test_a_stalled_model_gives_no_pair():
    model, odom = along_x(np.full(6, 0.5), [0.2, 0.2, 0.0, 0.0, 0.0, 0.0])
    estimator = MetricScaleEstimator(min_pairs=3)
    feed(estimator, model, odom)
    state = estimator.state()
    assert state.pairs == 2
    assert state.reason == "odometry moves but the model does not for 4 keyframes: 2 of 3 pairs"


def test_keyframes_without_odometry():
    """No odometry: no pair, and the reason says so; a pair spans a keyframe without odometry."""
    model, odom = along_x([0.3, 0.3, 0.3], [0.1, 0.1, 0.1])
    estimator = MetricScaleEstimator(min_pairs=2, max_spread=0.5)
    estimator.add_keyframe(0, model[0], None)
    assert estimator.state().reason == "waiting for odometry: 0 of 2 pairs"
    estimator.add_keyframe(1, model[1], odom[1])
    estimator.add_keyframe(2, model[2], None)
    estimator.add_keyframe(3, model[3], odom[3])   # pairs with keyframe 1: 0.6 m over 0.2
    state = estimator.state()
    assert state.pairs == 1 and state.reason == "collecting pairs: 1 of 2 pairs"


def test_spread_above_max_spread_is_not_known():
    model, odom = along_x(np.ones(12), 1.0 / np.tile([3.0, 4.5], 6))
    estimator = MetricScaleEstimator(min_pairs=10, max_spread=0.05)
    feed(estimator, model, odom)
    state = estimator.state()
    expected_spread = np.std(np.log(np.tile([3.0, 4.5], 6)), ddof=1) / math.sqrt(12)
    assert not state.known and state.scale == 1.0
    assert state.spread == pytest.approx(expected_spread)
    assert state.reason == (f"spread {100 * expected_spread:.1f}% above max_spread 5.0% "
                            f"(estimate {math.sqrt(3.0 * 4.5):.4g} m per model unit from 12 pairs)")


# --- window switches and restarts ----------------------------------------------------------------

def test_break_pairs_keeps_the_estimate_and_no_pair_spans_the_switch():
    """At a window switch the model's positions jump (the new window's alignment); break_pairs
    keeps that jump out of every pair, and the estimate goes on from its window."""
    model, odom = along_x(np.full(12, 0.5), np.full(12, 0.5 / S_TRUE))
    after_model, after_odom = along_x(np.full(6, 0.5), np.full(6, 0.5 / S_TRUE), start_odom=6.5)
    after_model += 10.0
    for broken in (True, False):
        estimator = MetricScaleEstimator()
        feed(estimator, model, odom)
        assert estimator.state().pairs == 12
        if broken:
            estimator.break_pairs()
        feed(estimator, after_model, after_odom, start=len(model))
        state = estimator.state()
        if broken:   # the first keyframe after the switch starts a pair, 6 more close
            assert state.pairs == 18 and state.known
            assert state.scale == pytest.approx(S_TRUE, rel=1e-12) and state.spread < 1e-12
        else:        # the pair across the jump is in the window (clipped as an outlier)
            assert state.pairs == 19


def test_the_window_follows_a_new_scale_after_a_switch():
    """Only the newest window_pairs pairs count: after 20 pairs at 4.0 the old 3.7 is gone."""
    model, odom = along_x(np.full(20, 0.5), np.full(20, 0.5 / S_TRUE))
    after_model, after_odom = along_x(np.full(20, 0.5), np.full(20, 0.5 / 4.0), start_odom=10.5)
    estimator = MetricScaleEstimator(window_pairs=20, min_pairs=5)
    feed(estimator, model, odom)
    estimator.break_pairs()
    states = feed(estimator, after_model, after_odom, start=len(model), states=True)
    assert states[-1].pairs == 20 and states[-1].scale == pytest.approx(4.0, rel=1e-12)
    assert states[5].scale == pytest.approx(S_TRUE, rel=1e-12)   # 5 new of 20: still the majority's


def test_reset_forgets_everything():
    model, odom = along_x(np.full(12, 0.5), np.full(12, 0.5 / S_TRUE))
    estimator = MetricScaleEstimator()
    feed(estimator, model, odom, start=100)
    assert estimator.state().known
    with pytest.raises(ScaleInputError, match="call reset"):
        estimator.add_keyframe(5 * KEYFRAME_NS, model[0], odom[0])   # stamps went back: a restart
    estimator.reset()
    assert estimator.state() == MetricScale(False, 1.0, math.inf, 0, "collecting pairs: 0 of 10 pairs")
    feed(estimator, model[:3], odom[:3])   # old stamps are fine after the reset
    assert estimator.state().pairs == 2


# --- the three sources ---------------------------------------------------------------------------

def test_fixed_and_no_scale():
    fixed, none = make_scale_source("fixed", scale=2.5), make_scale_source("none", scale=2.5)
    model, odom = along_x([1.0], [0.1])
    for source in (fixed, none):
        first = source.state()
        source.add_keyframe(0, model[0], odom[0])
        source.add_keyframe(1, model[1], odom[1])
        source.break_pairs()
        source.reset()
        assert source.state() == first
    assert isinstance(fixed, FixedScale) and fixed.state() == MetricScale(True, 2.5, 0.0, 0, "")
    assert isinstance(none, NoScale)
    assert none.state() == MetricScale(False, 1.0, math.inf, 0,
                                       "scale_source is none: outputs are in model units")


def test_make_scale_source():
    estimator = make_scale_source("odometry", scale=9.0, window_pairs=20, min_motion_m=0.5)
    assert isinstance(estimator, MetricScaleEstimator)
    assert (estimator.window_pairs, estimator.min_motion_m, estimator.min_pairs) == (20, 0.5, 10)
    assert SCALE_SOURCES == ("none", "fixed", "odometry")
    with pytest.raises(ValueError, match="scale_source must be one of none, fixed, odometry, got 'lidar'"):
        make_scale_source("lidar")
    with pytest.raises(ValueError, match="scale must be finite and > 0"):
        make_scale_source("fixed", scale=0.0)


@pytest.mark.parametrize("args, message", [
    (dict(min_pairs=1), "need 2 <= min_pairs <= window_pairs"),
    (dict(min_pairs=60), "need 2 <= min_pairs <= window_pairs"),
    (dict(min_motion_m=0.0), "min_motion_m must be finite and > 0"),
    (dict(max_spread=math.nan), "max_spread must be finite and > 0"),
])
def test_bad_estimator_settings(args, message):
    with pytest.raises(ValueError, match=message):
        MetricScaleEstimator(**args)


def test_bad_keyframes():
    estimator = MetricScaleEstimator()
    with pytest.raises(ScaleInputError, match=r"model_position must have shape \[3\], got \[4\]"):
        estimator.add_keyframe(0, np.zeros(4), np.eye(4))
    with pytest.raises(ScaleInputError, match="odom_pose has non-finite values"):
        estimator.add_keyframe(0, np.zeros(3), np.full((4, 4), np.nan))
    estimator.add_keyframe(0, np.zeros(3), np.eye(4))   # the failed calls left no trace
    with pytest.raises(ScaleInputError, match="is not after the previous keyframe's"):
        estimator.add_keyframe(0, np.zeros(3), np.eye(4))
