"""The node's health over a sliding time window: a level and its reasons, for /diagnostics.

Policy only, no ROS import. At each diagnostics tick the node hands over its cumulative counts
(since configure); the window's counts are the differences to the newest sample that is at
least ``diagnostics_window_s`` old, so one bad frame sets the level for one window, not forever:

    samples   s0    s1    s2    s3    s4    s5    s6          (one per tick)
    counts     0     0     2     2     2     2     2          (dropped, cumulative)
                          ^ two drops between s1 and s2
    at s4 (window 2.5 ticks): baseline s1, 2 dropped in the window -> WARN
    at s5:                    baseline s2, 0 dropped                -> OK again

The window covers one lifecycle state only (it restarts when the state changes, and when the
counts go back to 0 at a new configure), so rates measured while inactive never count against
an active node.
"""
from __future__ import annotations

import collections
import dataclasses

# diagnostic_msgs/DiagnosticStatus levels (bytes there).
OK, WARN, ERROR, STALE = 0, 1, 2, 3
# The order of reasons in a message, worst first: a broken model outweighs missing images.
SEVERITY = (ERROR, STALE, WARN, OK)

COUNTS = ("received", "processed", "dropped", "rejected", "failed", "camera_info_rejected",
          "odometry_received", "odometry_rejected", "tf_rejected", "callback_errors", "latency_ms_total", "latency_frames")


@dataclasses.dataclass(frozen=True)
class Limits:
    """The node's health parameters (NodeSettings fields of the same names)."""

    diagnostics_window_s: float = 5.0
    stale_after_s: float = 3.0          # 0 = never stale
    expected_rate_hz: float = 0.0       # 0 = unknown: the input rate is only reported
    rate_tolerance: float = 0.1

    @classmethod
    def of(cls, cfg) -> "Limits":
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class Facts:
    """What the node knows besides its counts, at one tick."""

    lifecycle: str                      # lifecycle state label: active, inactive, unconfigured, ...
    random_weights: bool = False        # the loaded model has no checkpoint
    configure_error: str = ""           # why the last configure failed ('' after a good one)
    last_image_s: float | None = None   # monotonic time of the newest image received
    tf_conflict: str = ""               # the TF output stopped: another publisher owns its child frame
    callback_error: str = ""            # the newest exception the safety net caught (a bug)
    input_warnings: tuple = ()          # standing input problems: a QoS mismatch, no odometry (topic named)
    map_database_error: str = ""        # the run is not (or no longer) stored in the map database
    refusals: dict = dataclasses.field(default_factory=dict)   # counter -> newest refusal's reason


@dataclasses.dataclass(frozen=True)
class Window:
    """Counts over the window (``counts``) and since configure (``totals``)."""

    duration_s: float
    counts: dict
    totals: dict
    full: bool                          # spans at least diagnostics_window_s

    def rate_hz(self, name: str) -> float:
        return self.counts[name] / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def latency_ms_mean(self) -> float:
        frames = self.counts["latency_frames"]
        return self.counts["latency_ms_total"] / frames if frames else 0.0


@dataclasses.dataclass(frozen=True)
class Frequency:
    """The image input frequency, reported as diagnostic_updater's FrequencyStatus does."""

    level: int
    message: str
    values: dict


@dataclasses.dataclass(frozen=True)
class Report:
    level: int
    reasons: list                       # [(level, text)], worst first; empty when all is well
    window: Window
    frequency: Frequency
    quiet_s: float | None               # seconds without an image while active, else None

    def message(self, state_text: str) -> str:
        """The reasons, worst first, then what the node is doing."""
        return "; ".join([text for _, text in self.reasons] + [state_text])


class Health:
    """Samples of cumulative counts, one per diagnostics tick, and the report of each tick."""

    def __init__(self):
        self._samples: collections.deque = collections.deque()   # (time_s, counts), oldest first
        self._lifecycle = ""
        self._active_since: float | None = None

    def update(self, now_s: float, totals: dict, facts: Facts, limits: Limits) -> Report:
        window = self._sample(now_s, totals, facts.lifecycle, limits.diagnostics_window_s)
        active = facts.lifecycle == "active"
        quiet_s = None
        if active:
            last = facts.last_image_s
            quiet_s = max(now_s - max(self._active_since, last if last is not None else self._active_since), 0.0)
        frequency = input_frequency(window, facts.lifecycle, limits, quiet_s)
        reasons = _reasons(window, facts, limits, quiet_s, frequency)
        level = reasons[0][0] if reasons else OK
        return Report(level, reasons, window, frequency, quiet_s)

    def _sample(self, now_s: float, totals: dict, lifecycle: str, window_s: float) -> Window:
        totals = {name: totals.get(name, 0) for name in COUNTS}
        newest = self._samples[-1][1] if self._samples else None
        if lifecycle != self._lifecycle or (newest and any(totals[k] < newest[k] for k in COUNTS)):
            self._samples.clear()
            self._lifecycle = lifecycle
            self._active_since = now_s if lifecycle == "active" else None
        self._samples.append((now_s, totals))
        # Keep one sample at or before the window's start: the baseline.
        while len(self._samples) > 1 and self._samples[1][0] <= now_s - window_s:
            self._samples.popleft()
        start, baseline = self._samples[0]
        counts = {name: totals[name] - baseline[name] for name in COUNTS}
        return Window(now_s - start, counts, totals, start <= now_s - window_s)


def input_frequency(window: Window, lifecycle: str, limits: Limits, quiet_s: float | None) -> Frequency:
    """Received images per second over the window, against expected_rate_hz within
    rate_tolerance (the acceptable band is expected * (1 -/+ tolerance)); WARN outside it once
    the window is full, STALE while active without images for stale_after_s."""
    rate = window.rate_hz("received")
    values = {"Events in window": str(window.counts["received"]),
              "Events since startup": str(window.totals["received"]),
              "Duration of window (s)": f"{window.duration_s:.6f}",
              "Actual frequency (Hz)": f"{rate:.6f}"}
    expected, tolerance = limits.expected_rate_hz, limits.rate_tolerance
    low, high = expected * (1 - tolerance), expected * (1 + tolerance)
    if expected > 0:
        values.update({"Target frequency (Hz)": f"{expected:.6f}",
                       "Minimum acceptable frequency (Hz)": f"{low:.6f}",
                       "Maximum acceptable frequency (Hz)": f"{high:.6f}"})
    if lifecycle != "active":
        return Frequency(OK, f"{lifecycle}: not subscribed to images", values)
    if _stale(limits, quiet_s):
        return Frequency(STALE, f"no image for {quiet_s:.1f} s", values)
    if not window.full or expected <= 0:
        measured = f"{rate:.2f} Hz" if window.full else f"measuring ({window.duration_s:.1f} s so far)"
        return Frequency(OK, measured if expected > 0 else f"{measured} (expected_rate_hz not set)", values)
    if rate < low:
        return Frequency(WARN, f"frequency too low: {rate:.2f} Hz, expected {expected:g} Hz "
                               f"(at least {low:.2f})", values)
    if rate > high:
        return Frequency(WARN, f"frequency too high: {rate:.2f} Hz, expected {expected:g} Hz "
                               f"(at most {high:.2f})", values)
    return Frequency(OK, f"desired frequency met: {rate:.2f} Hz", values)


def _stale(limits: Limits, quiet_s: float | None) -> bool:
    return quiet_s is not None and limits.stale_after_s > 0 and quiet_s >= limits.stale_after_s


def _reasons(window: Window, facts: Facts, limits: Limits, quiet_s: float | None,
             frequency: Frequency) -> list:
    counts, span = window.counts, f"in the last {window.duration_s:.1f} s"
    reasons = []
    if facts.configure_error:
        reasons.append((ERROR, facts.configure_error))
    if facts.tf_conflict:
        reasons.append((ERROR, facts.tf_conflict))
    if facts.random_weights:
        reasons.append((ERROR, "random-weight model (no checkpoint): poses, depth and map are not a "
                               "reconstruction; set the 'checkpoint' parameter"))
    if counts["failed"]:
        reasons.append((ERROR, f"model failed on {_frames(counts['failed'])} {span} (stream restarted)"))
    if counts["callback_errors"]:
        reasons.append((ERROR, f"{counts['callback_errors']} callback exception(s) {span} (a bug, the node "
                               f"went on): {facts.callback_error}"))
    if _stale(limits, quiet_s):
        reasons.append((STALE, f"no image for {quiet_s:.1f} s"))
    if counts["dropped"]:
        reasons.append((WARN, f"{_frames(counts['dropped'])} dropped {span} (processed "
                              f"{window.rate_hz('processed'):.2f} Hz of {window.rate_hz('received'):.2f} Hz "
                              f"received)"))
    bad = counts["rejected"] + counts["camera_info_rejected"]
    if bad:
        newest = "; ".join(facts.refusals[name] for name in ("rejected", "camera_info_rejected")
                           if counts[name] and facts.refusals.get(name))
        reasons.append((WARN, f"bad input {span}: {counts['rejected']} image(s) and "
                              f"{counts['camera_info_rejected']} camera_info rejected"
                              + (f" (newest: {newest})" if newest else "")))
    for counter, what in (("odometry_rejected", "odometry"), ("tf_rejected", "TF")):
        if counts[counter]:
            reasons.append((WARN, f"{counts[counter]} {what} message(s) refused {span}: "
                                  f"{facts.refusals.get(counter, '')}"))
    reasons.extend((WARN, text) for text in facts.input_warnings)
    behind = counts["received"] - counts["processed"]
    if (window.full and not counts["dropped"] and not bad and behind > 1
            and counts["processed"] < (1 - limits.rate_tolerance) * counts["received"]):
        reasons.append((WARN, f"falling behind: processed {window.rate_hz('processed'):.2f} Hz of "
                              f"{window.rate_hz('received'):.2f} Hz received"))
    if frequency.level == WARN:
        reasons.append((WARN, "input " + frequency.message))
    if facts.map_database_error:
        reasons.append((WARN, f"map database: {facts.map_database_error} (mapping goes on in memory)"))
    return sorted(reasons, key=lambda reason: SEVERITY.index(reason[0]))


def _frames(count: int) -> str:
    return f"{count} frame{'s' if count != 1 else ''}"
