"""mapping/placement/odometry.py: the odometry buffer and pose interpolation."""
import math
import sys
import threading

import numpy as np
import pytest

from lingbot_ros.mapping.placement.odometry import OdometryBuffer, interpolate_pose

MS = 1_000_000   # nanoseconds per millisecond


def pose(yaw=0.0, xyz=(0.0, 0.0, 0.0)):
    """T_odom_base: a rotation by ``yaw`` about z, then ``xyz``."""
    out = np.eye(4)
    c, s = math.cos(yaw), math.sin(yaw)
    out[:2, :2] = [[c, -s], [s, c]]
    out[:3, 3] = xyz
    return out


def test_halfway_between_two_samples():
    """A quarter turn about z and 2 m along x over one second: at 0.5 s, 45 degrees and 1 m."""
    buffer = OdometryBuffer(max_gap_s=1.0)
    buffer.add(0, pose(0.0, (0.0, 0.0, 0.0)))
    buffer.add(1000 * MS, pose(math.pi / 2, (2.0, 0.0, 4.0)))
    half = math.sqrt(0.5)
    expected = np.array([[half, -half, 0, 1.0], [half, half, 0, 0], [0, 0, 1, 2.0], [0, 0, 0, 1]])
    np.testing.assert_allclose(buffer.at(500 * MS), expected, atol=1e-12)
    quarter = buffer.at(250 * MS)   # slerp is uniform in angle: 22.5 degrees at a quarter
    np.testing.assert_allclose(quarter, pose(math.pi / 8, (0.5, 0.0, 1.0)), atol=1e-12)


def test_slerp_takes_the_shorter_way_round():
    """From +170 to -170 degrees about z is 20 degrees through 180, not 340 through 0."""
    start, end = pose(math.radians(170)), pose(math.radians(-170))
    np.testing.assert_allclose(interpolate_pose(start, end, 0.5), pose(math.pi), atol=1e-12)
    np.testing.assert_allclose(interpolate_pose(start, end, 0.25), pose(math.radians(175)), atol=1e-12)


def test_nearly_equal_rotations_blend_without_dividing_by_zero():
    start, end = pose(0.0), pose(1e-9, (1.0, 0.0, 0.0))
    np.testing.assert_allclose(interpolate_pose(start, end, 0.5), pose(5e-10, (0.5, 0.0, 0.0)), atol=1e-15)
    np.testing.assert_allclose(interpolate_pose(start, start, 0.3), np.eye(4), atol=1e-15)


def test_exact_stamps_and_the_ends():
    buffer = OdometryBuffer(max_extrapolation_s=0.05)
    assert buffer.at(0) is None and len(buffer) == 0
    first, last = pose(0.1, (1.0, 2.0, 3.0)), pose(0.2, (2.0, 2.0, 3.0))
    buffer.add(1000 * MS, first)
    assert buffer.at(1000 * MS) is not None and buffer.at(1051 * MS) is None
    np.testing.assert_array_equal(buffer.at(1050 * MS), first)   # one sample: held within 50 ms
    buffer.add(1100 * MS, last)
    np.testing.assert_array_equal(buffer.at(1000 * MS), first)
    np.testing.assert_array_equal(buffer.at(950 * MS), first)    # before the first: held
    np.testing.assert_array_equal(buffer.at(1150 * MS), last)    # after the newest: held
    assert buffer.at(949 * MS) is None and buffer.at(1151 * MS) is None


def test_no_interpolation_across_a_gap():
    """Samples 2 s apart (a dropout, max_gap_s=0.5): near a sample it is held, between them None."""
    buffer = OdometryBuffer(max_gap_s=0.5, max_extrapolation_s=0.05)
    buffer.add(0, pose(0.0, (0.0, 0.0, 0.0)))
    buffer.add(2000 * MS, pose(0.0, (4.0, 0.0, 0.0)))
    assert buffer.at(1000 * MS) is None
    np.testing.assert_array_equal(buffer.at(30 * MS), pose())
    np.testing.assert_array_equal(buffer.at(1960 * MS), pose(0.0, (4.0, 0.0, 0.0)))
    buffer.add(400 * MS, pose(0.0, (0.8, 0.0, 0.0)))   # 0.4 s apart: interpolated again
    np.testing.assert_allclose(buffer.at(200 * MS), pose(0.0, (0.4, 0.0, 0.0)), atol=1e-12)


def test_out_of_order_and_duplicate_samples():
    buffer = OdometryBuffer()
    for stamp in (300, 100, 200, 0):
        assert buffer.add(stamp * MS, pose(0.0, (stamp / 100, 0.0, 0.0)))
    assert not buffer.add(200 * MS, pose(0.0, (99.0, 0.0, 0.0)))   # same stamp: the first is kept
    assert len(buffer) == 4
    for stamp in (0, 50, 150, 250, 300):
        np.testing.assert_allclose(buffer.at(stamp * MS)[0, 3], stamp / 100, atol=1e-12)


def test_bounded_by_age_and_count():
    buffer = OdometryBuffer(max_age_s=1.0, max_samples=10_000)
    for k in range(301):   # 100 Hz for 3 s
        buffer.add(k * 10 * MS, pose(0.0, (k, 0.0, 0.0)))
    assert len(buffer) == 101   # 2.0 s .. 3.0 s
    assert buffer.at(1949 * MS) is None and buffer.at(2000 * MS)[0, 3] == 200
    assert not buffer.add(1500 * MS, pose())   # older than the newest by more than max_age_s
    assert buffer.add(2505 * MS, pose(0.0, (250.5, 0.0, 0.0)))   # late, but within the age

    counted = OdometryBuffer(max_age_s=100.0, max_samples=50)
    for k in range(200):
        counted.add(k * MS, pose(0.0, (k, 0.0, 0.0)))
    assert len(counted) == 50 and counted.at(150 * MS)[0, 3] == 150 and counted.at(99 * MS) is None


def test_the_stored_copy():
    buffer = OdometryBuffer()
    sample = pose(0.0, (1.0, 0.0, 0.0))
    buffer.add(0, sample)
    sample[0, 3] = 5.0                  # the caller reusing its array changes nothing stored
    held = buffer.at(0)
    held[0, 3] = 7.0                    # nor does changing what at() returned
    assert buffer.at(0)[0, 3] == 1.0


def test_a_stream_that_went_back_starts_anew_only_when_the_caller_says_so():
    buffer = OdometryBuffer(max_age_s=1.0)
    buffer.add(0, pose(0.0, (1.0, 0.0, 0.0)))
    buffer.add(100 * MS, pose(0.0, (2.0, 0.0, 0.0)))
    looped = pose(0.0, (9.0, 0.0, 0.0))
    assert not buffer.add(-10 * 10 ** 9, looped)   # older than the newest by more than max_age_s
    assert len(buffer) == 2
    assert not buffer.add(100 * MS, looped, went_back_ok=True)   # within the age: a held stamp, kept
    np.testing.assert_array_equal(buffer.at(100 * MS), pose(0.0, (2.0, 0.0, 0.0)))
    assert buffer.add(-10 * 10 ** 9, looped, went_back_ok=True)   # the previous loop's samples go
    assert len(buffer) == 1 and buffer.at(0) is None
    np.testing.assert_array_equal(buffer.at(-10 * 10 ** 9), looped)


@pytest.mark.parametrize("args, message", [
    (dict(max_age_s=0.0), "max_age_s must be finite and > 0"),
    (dict(max_gap_s=math.inf), "max_gap_s must be finite and > 0"),
    (dict(max_extrapolation_s=-0.1), "max_extrapolation_s must be finite and >= 0"),
    (dict(max_samples=1), "max_samples must be >= 2"),
])
def test_bad_settings(args, message):
    with pytest.raises(ValueError, match=message):
        OdometryBuffer(**args)


def test_bad_poses():
    buffer = OdometryBuffer()
    with pytest.raises(ValueError, match=r"must be \[4, 4\] T_odom_base, got shape \(3, 4\)"):
        buffer.add(0, np.eye(4)[:3])
    with pytest.raises(ValueError, match="non-finite"):
        buffer.add(0, np.full((4, 4), np.nan))
    assert len(buffer) == 0


def test_a_writer_thread_and_a_reader():
    """Samples of a robot at x = t (metres, t in seconds) and yaw = t / 10 come at 1 kHz from a
    thread, out of order by pairs, while the trimming evicts the oldest; every pose the reader
    gets is on that trajectory. A torn read (one sample's stamp with another's pose, an index
    gone stale) is rare even without the lock (a few in ten thousand reads when this was written),
    so this checks consistency more than it proves the lock."""
    buffer = OdometryBuffer(max_age_s=0.2, max_samples=150, max_extrapolation_s=0.0)
    done = threading.Event()
    newest = [None]   # the newest stamp written
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)

    def write():
        for k in range(0, 4000, 2):
            for j in (k + 1, k):
                buffer.add(j * MS, pose(j / 10_000, (j / 1000, 0.0, 0.0)))
            newest[0] = (k + 1) * MS
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    rng = np.random.default_rng(0)
    checked = 0
    try:
        while not done.is_set() or checked < 100:
            if newest[0] is None:
                continue
            stamp = int(newest[0] - rng.uniform(0, 0.25) * 1e9)
            got = buffer.at(stamp)
            if got is not None:
                t = stamp / 1e9
                np.testing.assert_allclose(got, pose(t / 10, (t, 0.0, 0.0)), atol=1e-9)
                checked += 1
    finally:
        writer.join()
        sys.setswitchinterval(switch_interval)
    assert len(buffer) == 150
