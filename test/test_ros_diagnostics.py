"""Health over a sliding window (ros/health.py) with a fake clock, and the /diagnostics array."""
import pytest

from lingbot_ros.mapping.records import TRACKING, MapperSnapshot
from lingbot_ros.ros.diagnostics import Counters
from lingbot_ros.ros.health import ERROR, OK, STALE, WARN, Facts, Health, Limits

from helpers import need_module

LIMITS = Limits(diagnostics_window_s=3.0, stale_after_s=3.0)
ACTIVE = Facts("active")


class Camera:
    """Cumulative counts as the node's counters would hold them, advanced one tick at a time."""

    def __init__(self, health=None, limits=LIMITS):
        self.health, self.limits = health or Health(), limits
        self.totals = dict.fromkeys(("received", "processed", "dropped", "rejected", "failed",
                                     "camera_info_rejected"), 0)
        self.last_image_s = None

    def tick(self, t: float, facts: Facts = ACTIVE, received=10, processed=None, **extra):
        """Advance to time ``t``: ``received`` new images (all processed unless said), plus the
        ``extra`` increments; return the report of the diagnostics tick at ``t``."""
        self.totals["received"] += received
        self.totals["processed"] += received if processed is None else processed
        for name, count in extra.items():
            self.totals[name] += count
        if received:
            self.last_image_s = t
        facts = Facts(facts.lifecycle, facts.random_weights, facts.configure_error, self.last_image_s,
                      refusals=facts.refusals)
        return self.health.update(t, dict(self.totals), facts, self.limits)


def test_levels_are_diagnostic_status_levels():
    msg = need_module("diagnostic_msgs.msg")
    assert [bytes([level]) for level in (OK, WARN, ERROR, STALE)] == [
        msg.DiagnosticStatus.OK, msg.DiagnosticStatus.WARN, msg.DiagnosticStatus.ERROR, msg.DiagnosticStatus.STALE]


def test_window_counts_and_rates_from_cumulative_samples():
    camera = Camera()
    assert camera.tick(0.0).window.duration_s == 0.0   # the first sample is its own baseline
    for t in (1.0, 2.0):
        report = camera.tick(t)
        assert not report.window.full and report.window.duration_s == t
    report = camera.tick(3.0)
    # Baseline: the sample at 0 (the newest at or before 3 - 3); 30 images since then.
    assert report.window.full and report.window.duration_s == 3.0
    assert report.window.counts["received"] == 30 and report.window.rate_hz("received") == 10.0
    assert report.window.totals["received"] == 40
    report = camera.tick(4.5, received=15)
    # Baseline now the sample at 1 (0 is older than the newest sample at or before 1.5).
    assert report.window.duration_s == 3.5 and report.window.counts["received"] == 35
    assert report.window.rate_hz("processed") == 10.0
    assert report.level == OK and report.reasons == []


def test_a_drop_warns_for_one_window_then_ok_again():
    camera = Camera()
    for t in (0.0, 1.0):
        assert camera.tick(t).level == OK
    report = camera.tick(2.0, processed=8, dropped=2)   # two frames dropped between t=1 and t=2
    assert report.level == WARN
    assert report.message("tracking") == (
        "2 frames dropped in the last 2.0 s (processed 9.00 Hz of 10.00 Hz received); tracking")
    # The window still holds the drop while its baseline (newest sample <= t - 3) is before t=2.
    assert camera.tick(3.0).level == WARN
    report = camera.tick(4.0)
    assert report.level == WARN and report.window.counts["dropped"] == 2
    report = camera.tick(5.0)
    assert report.level == OK and report.window.counts["dropped"] == 0
    assert report.message("tracking") == "tracking"


def test_a_model_failure_is_an_error_then_ok_and_outranks_a_drop():
    camera = Camera()
    camera.tick(0.0)
    report = camera.tick(1.0, processed=8, failed=1, dropped=1)
    assert report.level == ERROR
    assert [level for level, _ in report.reasons] == [ERROR, WARN]
    assert report.message("restarted: model error").startswith(
        "model failed on 1 frame in the last 1.0 s (stream restarted); 1 frame dropped")
    for t in (2.0, 3.0):
        assert camera.tick(t).level == ERROR
    assert camera.tick(4.0).level == OK


def test_bad_input_warns():
    camera = Camera()
    camera.tick(0.0)
    report = camera.tick(1.0, processed=8, rejected=2, camera_info_rejected=1)
    assert report.level == WARN
    assert report.reasons == [(WARN, "bad input in the last 1.0 s: 2 image(s) and 1 camera_info rejected")]
    # With the reasons of the newest refusals (of the inputs refused in the window), as odometry's.
    refusals = {"rejected": "image skipped: image: zero stamp (an unset header)",
                "camera_info_rejected": "camera_info: non-finite K"}
    camera = Camera()
    camera.tick(0.0)
    report = camera.tick(1.0, Facts("active", refusals=refusals), rejected=1)
    assert report.reasons == [(WARN, "bad input in the last 1.0 s: 1 image(s) and 0 camera_info rejected (newest: "
                                     "image skipped: image: zero stamp (an unset header))")]


def test_stale_without_images_then_ok_when_they_come_back():
    camera = Camera()
    camera.tick(0.0)
    camera.tick(1.0)                                  # the last image arrives at t=1
    assert camera.tick(2.0, received=0).level == OK
    report = camera.tick(3.9, received=0)
    assert report.level == OK and report.quiet_s == pytest.approx(2.9)
    report = camera.tick(4.0, received=0)
    assert report.level == STALE and report.frequency.level == STALE
    assert report.reasons == [(STALE, "no image for 3.0 s")]
    assert camera.tick(9.0, received=0).level == STALE
    report = camera.tick(10.0, received=5)
    assert report.level == OK and report.quiet_s == 0.0


def test_stale_counts_from_activation_before_the_first_image():
    camera = Camera()
    camera.tick(0.0, facts=Facts("inactive"), received=0)
    assert camera.tick(10.0, received=0).level == OK          # active from t=10, no image yet
    assert camera.tick(12.9, received=0).level == OK
    assert camera.tick(13.0, received=0).level == STALE


def test_stale_is_off_with_zero_and_while_inactive():
    camera = Camera(limits=Limits(diagnostics_window_s=3.0, stale_after_s=0.0))
    camera.tick(0.0)
    assert camera.tick(100.0, received=0).level == OK
    camera = Camera()
    camera.tick(0.0, facts=Facts("inactive"), received=0)
    report = camera.tick(100.0, facts=Facts("inactive"), received=0)
    assert report.level == OK and report.quiet_s is None
    assert report.frequency.level == OK and report.frequency.message == "inactive: not subscribed to images"


def test_random_weights_are_an_error_in_every_state():
    camera = Camera()
    for t, lifecycle in ((0.0, "active"), (5.0, "active"), (10.0, "inactive")):
        report = camera.tick(t, facts=Facts(lifecycle, random_weights=True))
        assert report.level == ERROR
        assert report.reasons[0][1].startswith("random-weight model (no checkpoint)")


def test_a_failed_configure_is_an_error_until_one_succeeds():
    health = Health()
    zeros = {}
    failed = Facts("unconfigured", configure_error="configure failed: RuntimeError: warm-up ran out of memory")
    report = health.update(0.0, zeros, failed, LIMITS)
    assert report.level == ERROR
    assert report.message("unconfigured") == "configure failed: RuntimeError: warm-up ran out of memory; unconfigured"
    assert health.update(1.0, zeros, Facts("unconfigured"), LIMITS).level == OK


def test_the_window_restarts_with_the_lifecycle_state_and_at_a_new_configure():
    camera = Camera()
    camera.tick(0.0)
    assert camera.tick(1.0, processed=5, dropped=5).level == WARN
    # Deactivated: the window restarts, so the active span's drops no longer count.
    report = camera.tick(2.0, facts=Facts("inactive"), received=0)
    assert report.level == OK and report.window.duration_s == 0.0
    # A new configure: the counts start again at 0; the history restarts instead of going negative.
    report = camera.health.update(3.0, {"received": 1}, Facts("inactive"), LIMITS)
    assert report.window.duration_s == 0.0 and report.window.counts["received"] == 0


def test_falling_behind_without_drops_warns_once_the_window_is_full():
    camera = Camera()
    camera.tick(0.0)
    for t in (1.0, 2.0):
        assert camera.tick(t, processed=5).level == OK   # window not full yet
    report = camera.tick(3.0, processed=5)
    assert report.level == WARN
    assert report.reasons == [(WARN, "falling behind: processed 5.00 Hz of 10.00 Hz received")]
    # One frame short of the input is an in-flight frame, not a backlog.
    camera = Camera()
    camera.tick(0.0)
    for t in (1.0, 2.0, 3.0):
        report = camera.tick(t, received=1, processed=0 if t == 3.0 else 1)
    assert report.level == OK


@pytest.mark.parametrize("received, level, message", [
    (10, OK, "desired frequency met: 10.00 Hz"),
    (9, OK, "desired frequency met: 9.00 Hz"),
    (8, WARN, "frequency too low: 8.00 Hz, expected 10 Hz (at least 9.00)"),
    (12, WARN, "frequency too high: 12.00 Hz, expected 10 Hz (at most 11.00)"),
])
def test_input_frequency_against_the_expected_rate(received, level, message):
    camera = Camera(limits=Limits(diagnostics_window_s=2.0, expected_rate_hz=10.0, rate_tolerance=0.1))
    camera.tick(0.0)
    camera.tick(1.0, received=received)
    report = camera.tick(2.0, received=received)
    frequency = report.frequency
    assert (frequency.level, frequency.message) == (level, message)
    assert frequency.values == {
        "Events in window": str(2 * received), "Events since startup": str(10 + 2 * received),
        "Duration of window (s)": "2.000000", "Actual frequency (Hz)": f"{received:.6f}",
        "Target frequency (Hz)": "10.000000", "Minimum acceptable frequency (Hz)": "9.000000",
        "Maximum acceptable frequency (Hz)": "11.000000"}
    assert report.level == level
    if level == WARN:
        assert report.reasons == [(WARN, "input " + message)]


def test_input_frequency_is_only_reported_without_an_expected_rate_or_a_full_window():
    camera = Camera(limits=Limits(diagnostics_window_s=2.0, expected_rate_hz=10.0))
    camera.tick(0.0)
    report = camera.tick(1.0, received=3)
    assert (report.frequency.level, report.frequency.message) == (OK, "measuring (1.0 s so far)")
    camera = Camera(limits=Limits(diagnostics_window_s=2.0))
    camera.tick(0.0)
    camera.tick(1.0, received=3)
    frequency = camera.tick(2.0, received=3).frequency
    assert (frequency.level, frequency.message) == (OK, "3.00 Hz (expected_rate_hz not set)")
    assert "Target frequency (Hz)" not in frequency.values


def test_counters_record_the_newest_image_and_the_latency_totals():
    now = [5.0]
    counters = Counters(clock=lambda: now[0])
    assert counters.last_received_s is None
    counters.add("received")
    now[0] = 7.5
    counters.add("dropped")
    assert counters.last_received_s == 5.0
    counters.frame_done(10.0)
    counters.frame_done(30.0)
    snapshot = counters.snapshot()
    assert snapshot["received"] == 1 and snapshot["dropped"] == 1
    assert (snapshot["latency_ms_total"], snapshot["latency_frames"]) == (40.0, 2)


def test_diagnostic_array_has_the_health_status_and_the_frequency_status():
    need_module("diagnostic_msgs.msg")
    from builtin_interfaces.msg import Time

    from lingbot_ros.ros.status import diagnostic_array, totals

    counters = Counters()
    for _ in range(12):
        counters.add("received")
    counters.add("dropped", 2)
    counters.add("rejected")
    counters.frame_done(20.0)
    snapshot = MapperSnapshot(state=TRACKING, state_text="tracking", processed=8, rejected=1, failed=0)
    health = Health()
    health.update(0.0, totals(None, Counters().snapshot()), Facts("active"), LIMITS)
    report = health.update(2.0, totals(snapshot, counters.snapshot()), Facts("active", last_image_s=2.0), LIMITS)
    array = diagnostic_array(Time(sec=3), "map_node", "/map_node", report, snapshot, counters, "cpu", "",
                             {"model": "tiny"})
    main, frequency = array.status
    assert (main.name, frequency.name) == ("map_node: LingBot-Map", "map_node: image input frequency")
    assert main.level == bytes([WARN]) and main.hardware_id == "/map_node"
    assert main.message == ("2 frames dropped in the last 2.0 s (processed 4.00 Hz of 6.00 Hz received); "
                            "bad input in the last 2.0 s: 2 image(s) and 0 camera_info rejected; tracking: tracking")
    values = {kv.key: kv.value for kv in main.values}
    assert values["frames_received"] == "12" and values["frames_rejected"] == "2"
    assert values["frames_dropped_in_window"] == "2" and values["input_rate_hz"] == "6.00"
    assert values["latency_ms_mean"] == "20.0" and values["seconds_since_image"] == "0.0"
    assert values["model"] == "tiny" and values["cache_keyframes"] == "0"
    assert frequency.level == bytes([OK])
    assert {kv.key: kv.value for kv in frequency.values}["Events in window"] == "12"

    # Unconfigured: no Mapper, the lifecycle state as the message.
    report = Health().update(0.0, totals(None, Counters().snapshot()), Facts("unconfigured"), LIMITS)
    main, frequency = diagnostic_array(Time(), "map_node", "/map_node", report, None, Counters(), "cpu",
                                       "unconfigured: no model loaded", {}).status
    assert main.level == bytes([OK]) and main.message == "unconfigured: no model loaded"
    assert "cache_keyframes" not in {kv.key for kv in main.values}
    assert frequency.message == "unconfigured: not subscribed to images"
