"""Metric scale: metres per model unit, estimated from the robot's odometry or given.

The model's translations are up to an unknown factor. Between two keyframes the robot base moves
``|dp_model|`` model units in the map frame and ``|dp_odom|`` metres in the odom frame; lengths do
not depend on the frame, so each such pair gives one ratio ``|dp_odom| / |dp_model|``. A pair
closes once the odometry has moved ``min_motion_m`` since its first keyframe, so a slow robot
still gives pairs, and standing still or turning in place gives none:

    keyframe                    k0    k1    k2    k3    k4    k5    k6    k7
    odometry motion (m) since         0.3   0.1   0.25  0.3   0.0   0.0   0.4
      the pair's first keyframe
    pair closed (min 0.2 m)           k0-k1       k1-k3 k3-k4             k4-k7

The estimate is a clipped mean of the newest ``window_pairs`` log-ratios: pairs further than
three robust standard deviations (MAD) from their median are outliers (a bad model frame spoils
the two pairs it ends and starts). ``spread`` is the estimate's relative standard error, the
pairs taken as independent: where the noise is on positions rather than on displacements,
neighbouring pairs' errors partly cancel (their displacements add up), and the spread errs high.

Three sources share one interface (``add_keyframe``, ``break_pairs``, ``reset``, ``state``), so
the caller treats ``scale_source`` none, fixed and odometry alike.
"""
from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np

SCALE_SOURCES = ("none", "fixed", "odometry")

# A normal distribution's standard deviation is 1.4826 times its median absolute deviation.
_MAD_TO_STD = 1.4826
_OUTLIER_STDS = 3.0
# Inlier band floor for (near) noise-free ratios, whose MAD can be zero or rounding-sized.
_MIN_BAND = 1e-9
# What the newest keyframe did, as state().reason words it.
_COLLECTING = "collecting pairs"
_NO_ODOMETRY = "waiting for odometry"
_NOT_MOVING = "robot not moving (standing still or turning in place)"
_MODEL_STILL = "odometry moves but the model does not"


class ScaleInputError(ValueError):
    """A keyframe the estimator cannot take (malformed, or not after the previous keyframe)."""


@dataclass(frozen=True)
class MetricScale:
    """What metric outputs are scaled by, and how well it is known.

    ``scale``: metres per model unit, the factor for every model-unit output; 1.0 (model units)
    unless ``known``. ``spread``: relative 1-sigma uncertainty of the estimate (0.01 = 1%), also
    of a candidate not yet accepted; 0 for a fixed scale, inf without an estimate. ``pairs``:
    keyframe pairs in the estimate's window. ``reason``: why the scale is not known ("" if it is).
    """

    known: bool
    scale: float
    spread: float
    pairs: int
    reason: str


class ScaleSource(Protocol):
    def add_keyframe(self, stamp_ns: int, model_position, odom_pose) -> None: ...
    def break_pairs(self) -> None: ...
    def reset(self) -> None: ...
    def state(self) -> MetricScale: ...
    def stored(self) -> dict: ...
    def restore(self, arrays: dict) -> None: ...


class MetricScaleEstimator:
    """``scale_source: odometry``. Defaults, and why:

    ``window_pairs=50``: at 0.2 m or more a pair, ten metres of driving or more; the standard
    error is about a seventh of one pair's noise, and the window still follows a scale that
    drifts over a long run (window alignment errors add up).
    ``min_pairs=10``: below that a median and MAD are themselves too noisy to reject outliers.
    ``min_motion_m=0.2``: odometry noise of a few millimetres and model position noise of about
    a centimetre are a few percent of 0.2 m; shorter displacements are mostly noise.
    ``min_model_motion=1e-3`` (model units: "metres up to an unknown scale", so 0.2 m is 0.01
    units or more for any scale up to 20): catches a stalled model, not slow motion.
    ``max_spread=0.02``: known once the 1-sigma error is 2% (the bar of the scale's tests); a
    full window then accepts a noise of up to about 14% per pair.
    """

    def __init__(self, window_pairs: int = 50, min_pairs: int = 10, min_motion_m: float = 0.2,
                 min_model_motion: float = 1e-3, max_spread: float = 0.02):
        if not pairs_fit(min_pairs, window_pairs):
            raise ValueError(f"need 2 <= min_pairs <= window_pairs, got min_pairs={min_pairs}, "
                             f"window_pairs={window_pairs}")
        for name, value in (("min_motion_m", min_motion_m), ("min_model_motion", min_model_motion),
                            ("max_spread", max_spread)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value}")
        self.window_pairs, self.min_pairs = int(window_pairs), int(min_pairs)
        self.min_motion_m, self.min_model_motion = float(min_motion_m), float(min_model_motion)
        self.max_spread = float(max_spread)
        self.reset()

    def reset(self) -> None:
        """Forget everything: the stream restarted, its model units are new."""
        self._log_ratios: deque[float] = deque(maxlen=self.window_pairs)
        self._fit: tuple[float, float] | None = None   # (scale, spread) of _log_ratios, cached
        self._last_stamp_ns: int | None = None
        self.break_pairs()

    def break_pairs(self) -> None:
        """The next keyframe starts a new pair (a window switch: no pair may span the jump);
        the window of pairs and the estimate stay."""
        self._start: tuple[np.ndarray, np.ndarray] | None = None   # (model, odom) positions
        self._event = _COLLECTING   # what the newest keyframe did, for state().reason
        self._repeats = 0           # keyframes in a row that did it

    def add_keyframe(self, stamp_ns: int, model_position, odom_pose) -> None:
        """One keyframe: ``model_position`` [3] the robot base in the map frame (model units),
        ``odom_pose`` [4, 4] ``T_odom_base`` at the keyframe's stamp, or None if not known."""
        stamp_ns = int(stamp_ns)
        if self._last_stamp_ns is not None and stamp_ns <= self._last_stamp_ns:
            raise ScaleInputError(f"keyframe stamp {stamp_ns} ns is not after the previous "
                                  f"keyframe's ({self._last_stamp_ns} ns); call reset() when the "
                                  "stream restarts")
        model = _finite(model_position, (3,), "model_position")
        odom = None if odom_pose is None else _finite(odom_pose, (4, 4), "odom_pose")[:3, 3]
        self._last_stamp_ns = stamp_ns
        event = self._pair(model, odom)
        self._repeats = self._repeats + 1 if event == self._event else 1
        self._event = event

    def _pair(self, model: np.ndarray, odom: np.ndarray | None) -> str:
        """Close a pair with this keyframe where there is one to close; what happened."""
        if odom is None:   # keep the pair's start: a pair may span keyframes without odometry
            return _NO_ODOMETRY
        if self._start is None:
            self._start = (model, odom)
            return _COLLECTING
        model_motion = float(np.linalg.norm(model - self._start[0]))
        odom_motion_m = float(np.linalg.norm(odom - self._start[1]))
        if odom_motion_m < self.min_motion_m:   # keep the start: slow motion adds up
            return _NOT_MOVING
        self._start = (model, odom)
        if model_motion < self.min_model_motion:
            return _MODEL_STILL
        self._log_ratios.append(math.log(odom_motion_m / model_motion))
        self._fit = None
        return _COLLECTING

    def stored(self) -> dict:
        """What a resumed stream continues from at a window switch (which breaks the open pair):
        the window of pairs and the newest keyframe's stamp, as arrays (database/resume.py)."""
        return {"scale_log_ratios": np.array(self._log_ratios, np.float64),
                "scale_last_stamp_ns": np.array([-1 if self._last_stamp_ns is None else self._last_stamp_ns],
                                                np.int64)}

    def restore(self, arrays: dict) -> None:
        self.reset()
        self._log_ratios.extend(arrays["scale_log_ratios"].tolist())
        last = int(arrays["scale_last_stamp_ns"][0])
        self._last_stamp_ns = None if last < 0 else last

    def state(self) -> MetricScale:
        pairs = len(self._log_ratios)
        if self._fit is None and pairs:
            self._fit = _clipped_mean(np.array(self._log_ratios))
        scale, spread = self._fit if pairs else (1.0, math.inf)
        if pairs < self.min_pairs:
            what = self._event
            if self._repeats > 1 and self._event != _COLLECTING:
                what += f" for {self._repeats} keyframes"
            return MetricScale(False, 1.0, spread, pairs, f"{what}: {pairs} of {self.min_pairs} pairs")
        if spread > self.max_spread:
            return MetricScale(False, 1.0, spread, pairs,
                               f"spread {100 * spread:.1f}% above max_spread {100 * self.max_spread:.1f}% "
                               f"(estimate {scale:.4g} m per model unit from {pairs} pairs)")
        return MetricScale(True, scale, spread, pairs, "")


class _ConstantScale:
    """A scale that no keyframe changes."""

    def __init__(self, state: MetricScale):
        self._state = state

    def add_keyframe(self, stamp_ns: int, model_position, odom_pose) -> None:
        """Ignored: a constant scale learns nothing."""

    def break_pairs(self) -> None:
        """Nothing to break."""

    def reset(self) -> None:
        """The scale outlives the stream."""

    def state(self) -> MetricScale:
        return self._state

    def stored(self) -> dict:
        return {}   # the settings say it all

    def restore(self, arrays: dict) -> None:
        """Nothing to restore."""


class FixedScale(_ConstantScale):
    """``scale_source: fixed``: the user's metres per model unit, known from the start."""

    def __init__(self, scale: float):
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be finite and > 0 (metres per model unit), got {scale}")
        super().__init__(MetricScale(True, float(scale), 0.0, 0, ""))


class NoScale(_ConstantScale):
    """``scale_source: none``: outputs stay in model units, and the state says so."""

    def __init__(self):
        super().__init__(MetricScale(False, 1.0, math.inf, 0,
                                     "scale_source is none: outputs are in model units"))


def pairs_fit(min_pairs: int, window_pairs: int) -> bool:
    """The estimate's median and MAD need two pairs, and its window must hold ``min_pairs``."""
    return 2 <= min_pairs <= window_pairs


def make_scale_source(name: str, scale: float = 1.0, **estimator_args) -> ScaleSource:
    """The source for ``scale_source`` ``name``; ``scale`` is read by "fixed" only, and
    ``estimator_args`` (``MetricScaleEstimator``'s) by "odometry" only."""
    if name == "none":
        return NoScale()
    if name == "fixed":
        return FixedScale(scale)
    if name == "odometry":
        return MetricScaleEstimator(**estimator_args)
    raise ValueError(f"scale_source must be one of {', '.join(SCALE_SOURCES)}, got {name!r}")


def _clipped_mean(log_ratios: np.ndarray) -> tuple[float, float]:
    """(scale, relative standard error) of the log-ratios within the outlier band of their median."""
    center = np.median(log_ratios)
    band = max(_OUTLIER_STDS * _MAD_TO_STD * float(np.median(np.abs(log_ratios - center))), _MIN_BAND)
    inliers = log_ratios[np.abs(log_ratios - center) <= band]
    assert inliers.size > 0, "at least half the values lie within one MAD of the median"
    # On logs the standard error is relative: d(exp x) / exp x = dx.
    spread = float(inliers.std(ddof=1) / math.sqrt(inliers.size)) if inliers.size >= 2 else math.inf
    return math.exp(float(inliers.mean())), spread


def _finite(value, shape: tuple[int, ...], name: str) -> np.ndarray:
    array = np.array(value, dtype=np.float64)   # a copy: the caller may reuse its array
    if array.shape != shape:
        raise ScaleInputError(f"{name} must have shape {list(shape)}, got {list(array.shape)}")
    if not np.isfinite(array).all():
        raise ScaleInputError(f"{name} has non-finite values; pass odom_pose=None or skip the keyframe")
    return array


def applied_scale(applied: MetricScale, estimate: MetricScale, step: float) -> MetricScale:
    """The scale outputs use after a new ``estimate``; ``applied`` itself when it stays.

    The first known estimate is taken as it is. After that a known scale never moves the whole
    map by the estimate's noise at every keyframe: it follows only an estimate more than ``step``
    (relative) away, by at most ``step`` per keyframe, and ``step`` 0 freezes it. An estimate
    that loses its confidence (the spread grew) leaves the known scale as it was.
    """
    if not applied.known:
        return estimate if (estimate.known, estimate.scale) != (applied.known, applied.scale) else applied
    if not estimate.known or step == 0.0:
        return applied
    ratio = estimate.scale / applied.scale
    if abs(math.log(ratio)) <= math.log1p(step):
        return applied
    factor = 1.0 + step if ratio > 1.0 else 1.0 / (1.0 + step)
    return dataclasses.replace(estimate, scale=applied.scale * factor)
