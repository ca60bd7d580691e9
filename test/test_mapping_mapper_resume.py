"""Resume and new_window (tiny model, CPU): a run resumed from its map database after a clean end,
fed the following frames, writes byte for byte what one uninterrupted run that started a new
window at that frame writes; a run without a continuation goes on from its last pose; a refused
new_window changes nothing."""
import sqlite3

import numpy as np
import pytest

from lingbot_ros.mapping.mapper import Mapper

from helpers import assert_database_is_the_mapper, frame

pytestmark = pytest.mark.usefixtures("torch_single_thread")
FRAMES = 20


@pytest.fixture
def make_mapper(tiny_mapper, tmp_path):
    def make(database: str, **overrides) -> Mapper:
        return tiny_mapper(**{"warmup": False, "long_run_policy": "windowed", "window_size": 8, "overlap_size": 2,
                              "map_database": str(tmp_path / database), **overrides})
    return make


def stream():
    return [frame(6 * i, stamp_s=i * 0.1) for i in range(FRAMES)]


def files(directory, windows=True):
    names = ("map.ply", "trajectory.tum") + (("windows.csv",) if windows else ())
    return {name: (directory / name).read_bytes() for name in names}


def finished(mapper: Mapper, directory) -> dict:
    """End the input, save, close: the saved files."""
    mapper.finish()
    mapper.save(directory)
    mapper.close()
    return files(directory)


def uninterrupted(make_mapper, tmp_path, stop: int, feed=Mapper.process, **settings) -> tuple[dict, object]:
    """The reference: one run that takes a new window at frame ``stop``; its files and last status."""
    inputs = stream()
    whole = make_mapper("whole.db", **settings)
    for item in inputs[:stop]:
        feed(whole, item)
    assert whole.new_window().startswith("window ")
    for item in inputs[stop:]:
        feed(whole, item)
    return finished(whole, tmp_path / "whole"), whole.snapshot


# The window is 8 frames, the overlap 2: stopping at frame 5 or 11 leaves the window's last two
# frames final; at 7 or 13 one of them is provisional (the next window gives its final value).
@pytest.mark.parametrize("stop", [5, 7, 11, 13])
def test_a_resumed_run_continues_exactly_as_a_new_window_would(make_mapper, tmp_path, stop):
    want, _ = uninterrupted(make_mapper, tmp_path, stop)
    inputs = stream()
    first = make_mapper("parts.db")
    for item in inputs[:stop]:
        first.process(item)
    first.close()
    resumed = make_mapper("parts.db", resume=True)
    assert resumed.snapshot.state_text.startswith(f"resumed run 1 (clean) at frame {stop}: window ")
    assert_database_is_the_mapper(resumed)   # the new run holds the continued map and trajectory
    for item in inputs[stop:]:
        resumed.process(item)
    assert_database_is_the_mapper(resumed)
    assert finished(resumed, tmp_path / "resumed") == want


def test_a_resumed_run_that_ends_at_once_is_the_stored_run(make_mapper, tmp_path):
    first = make_mapper("map.db")
    for item in stream()[:7]:   # frame 6 provisional
        first.process(item)
    first.save(tmp_path / "first")
    first.close()
    resumed = make_mapper("map.db", resume=True)
    resumed.finish()   # no frame: the provisional frame keeps its stored value, now final
    assert_database_is_the_mapper(resumed)
    resumed.save(tmp_path / "resumed")
    resumed.close()
    assert files(tmp_path / "resumed") == files(tmp_path / "first")


def test_a_run_without_a_continuation_goes_on_from_its_last_pose(make_mapper, tmp_path):
    inputs = stream()
    first = make_mapper("map.db")
    for item in inputs[:10]:
        first.process(item)
    last_pose = first._store.internal_pose(9)
    first.close()
    conn = sqlite3.connect(tmp_path / "map.db")   # as a crash leaves it: no continuation written
    conn.execute("DELETE FROM continuations")
    conn.execute("DELETE FROM overlap_frames")
    conn.commit()
    conn.close()
    resumed = make_mapper("map.db", resume=True)
    assert "no overlap frames stored, a new stream continues from the last pose" in resumed.snapshot.state_text
    assert [p.key for p in resumed.saved_trajectory()] == list(range(10))
    outcome = resumed.process(inputs[10])
    for item in inputs[11:14]:
        outcome = resumed.process(item)
    assert outcome.new[0].index >= 11   # indices go on from the stored run's
    assert resumed.window_records()[-1].first_index == 10   # a new stream's window 0 starts there
    assert resumed._stream.placement.translation.tolist() == last_pose[:3, 3].tolist()
    resumed.close()


def crash(mapper: Mapper) -> None:
    """As a SIGKILL right after the writer's last commit leaves the file: the run not ended (the
    kill tests with real processes: test_mapping_map_database.py, test_ros_map_database.py)."""
    assert mapper.recorder.commit(), mapper.recorder.failure
    writer = mapper.recorder.writer
    writer._queue.put(None)   # the thread stops without the clean end's events
    writer._thread.join()
    mapper._store.close()


EVERY_FRAME = {"map_database_continuation_s": 1e-9}   # a continuation stored after every frame


@pytest.mark.parametrize("stop", [7, 13])
def test_a_run_resumed_after_a_crash_at_its_continuation_goes_on_as_a_new_window_would(make_mapper, tmp_path,
                                                                                        stop):
    want, _ = uninterrupted(make_mapper, tmp_path, stop)
    inputs = stream()
    first = make_mapper("parts.db", **EVERY_FRAME)
    for item in inputs[:stop]:
        first.process(item)
    crash(first)
    resumed = make_mapper("parts.db", resume=True, **EVERY_FRAME)
    assert resumed.snapshot.state_text.startswith(f"resumed run 1 (crashed) at frame {stop}: window ")
    for item in inputs[stop:]:
        resumed.process(item)
        assert_database_is_the_mapper(resumed)
    got = finished(resumed, tmp_path / "resumed")
    assert got["trajectory.tum"] == want["trajectory.tum"] and got["windows.csv"] == want["windows.csv"]
    # The map lacks one keyframe's points: the newest final keyframe is held out of the map until
    # the next one (a rollback may still take it out: store/map_store.py), so the crash took it.
    lost = vertices(want["map.ply"]) - vertices(got["map.ply"])
    assert 0 < lost <= 112 * 84 // 2**2   # at most one keyframe at map_points_stride 2


def vertices(ply: bytes) -> int:
    return int(ply.split(b"element vertex ")[1].split(b"\n")[0])


def test_a_run_resumed_from_an_older_continuation_aligns_to_its_frames(make_mapper, tmp_path):
    """The continuation is older than the crash (one stored early, then map_database_continuation_s
    not over): the frames after it keep their stored poses, and the new stream's frames are
    placed exactly as after a new window at the continuation that skipped those frames."""
    inputs = stream()
    first = make_mapper("map.db", map_database_continuation_s=1e6)   # the first one only
    for item in inputs[:13]:   # window 1 started at frame 8
        first.process(item)
    stored_poses = first.saved_trajectory().poses()
    crash(first)
    resumed = make_mapper("map.db", resume=True)
    # Phase 1 of 3 frames placed frames 0-2: the first continuation aligns to the last two.
    assert resumed.snapshot.state_text == ("resumed run 1 (crashed) at frame 13: window 2 aligns to its stored "
                                           "frames 1-2; waiting for images")
    resumed.process(inputs[13])   # with the two stored frames: phase 1, then the alignment
    error = resumed.window_records()[-1].overlap_error
    assert resumed.snapshot.state_text == ("tracking; resumed run 1 (crashed) at frame 13, window 2 aligned with "
                                           f"overlap error {error:.3g}")
    for item in inputs[14:]:
        resumed.process(item)
    trajectory = resumed.saved_trajectory()
    assert [p.key for p in trajectory] == list(range(FRAMES))
    np.testing.assert_array_equal(trajectory.poses()[:13], stored_poses)

    reference = make_mapper("reference.db")
    for item in inputs[:3]:
        reference.process(item)
    reference.new_window()
    for item in inputs[13:]:
        reference.process(item)
    np.testing.assert_array_equal(trajectory.poses()[13:], reference.saved_trajectory().poses()[3:])
    aligned = [(r.overlap_error, float(r.similarity.scale)) for r in resumed.window_records() if r.window == 2]
    assert aligned == [(r.overlap_error, float(r.similarity.scale)) for r in reference.window_records()
                       if r.window == 1]
    resumed.close()
    reference.close()


def test_a_continuation_whose_frame_was_rolled_back_is_not_used(make_mapper):
    inputs = stream()
    first = make_mapper("map.db", **EVERY_FRAME)
    for item in inputs[:10]:
        first.process(item)
    first.rollback_last_frame()   # frame 9, in the continuation stored after it
    crash(first)
    resumed = make_mapper("map.db", resume=True)
    assert ("1 of the frames its continuation aligns to were rolled back, a new stream continues from the "
            "last pose") in resumed.snapshot.state_text
    assert [p.key for p in resumed.saved_trajectory()] == list(range(9))
    resumed.close()


def test_an_odometry_run_resumes_with_each_stream_at_its_own_scale(make_mapper, tmp_path):
    settings = {"long_run_policy": "reset", "max_keyframes": 4, "scale_source": "odometry"}
    inputs = stream()
    first = make_mapper("map.db", **settings)
    for item in inputs[:12]:
        first.process(item)
    assert first.snapshot.restarts >= 2
    first.finish()
    first.save(tmp_path / "first")
    first.close()
    resumed = make_mapper("map.db", resume=True, **settings)
    assert "a new stream at its own scale continues from the last pose" in resumed.snapshot.state_text
    assert_database_is_the_mapper(resumed)
    resumed.save(tmp_path / "resumed")   # the stored streams, each converted once: the same files
    assert files(tmp_path / "resumed", windows=False) == \
        files(tmp_path / "first", windows=False)
    for item in inputs[12:]:
        resumed.process(item)
    assert_database_is_the_mapper(resumed)
    assert [p.key for p in resumed.saved_trajectory()] == list(range(FRAMES))
    resumed.close()


ODOMETRY = {"scale_source": "odometry", "scale_min_pairs": 2, "scale_min_motion_m": 0.1, "scale_max_spread": 10.0}


def odometry_pose(stamp_ns: int) -> np.ndarray:
    """The robot drives straight ahead at 1.5 m/s (odometry at the frame stamps and between)."""
    pose = np.eye(4)
    pose[0, 3] = 1.5 * stamp_ns / 1e9
    return pose


def fed(mapper: Mapper, item) -> None:
    for offset in (-50_000_000, 0):
        mapper.add_odometry(item.stamp_ns + offset, odometry_pose(item.stamp_ns + offset))
    mapper.process(item)


@pytest.mark.parametrize("stop", [7, 13])
def test_an_odometry_run_resumed_after_a_clean_end_goes_on_in_its_stream_at_its_scale(make_mapper, tmp_path, stop):
    """With scale_source odometry the stored stream goes on too: its scale estimate's pairs, the
    applied scale and the odometry the re-run frames read are part of the continuation."""
    want, last = uninterrupted(make_mapper, tmp_path, stop, feed=fed, **ODOMETRY)
    inputs = stream()
    first = make_mapper("parts.db", **ODOMETRY)
    for item in inputs[:stop]:
        fed(first, item)
    assert first.snapshot.scale_known, first.snapshot.scale_text   # the continuation carries a known scale
    first.close()
    resumed = make_mapper("parts.db", resume=True, **ODOMETRY)
    assert resumed.snapshot.state_text.startswith(f"resumed run 1 (clean) at frame {stop}: window ")
    assert_database_is_the_mapper(resumed)
    for item in inputs[stop:]:
        fed(resumed, item)
    assert resumed.snapshot.restarts == 0
    assert finished(resumed, tmp_path / "resumed") == want
    assert (resumed.snapshot.scale, resumed.snapshot.scale_spread, resumed.snapshot.scale_text) == \
        (last.scale, last.scale_spread, last.scale_text)


def test_resume_refuses_a_run_made_with_other_settings(make_mapper):
    first = make_mapper("map.db")
    for item in stream()[:6]:
        first.process(item)
    first.close()
    resumed = make_mapper("map.db", resume=True, map_voxel_size_m=0.1)
    assert "made with other map_voxel_size_m; a new map starts" in resumed.snapshot.state_text
    assert len(resumed.saved_trajectory()) == 0
    resumed.close()


def _npy(array) -> bytes:
    from lingbot_ros.mapping.database.blobs import array_blob
    return array_blob(np.asarray(array))


NAN_POSE = np.full(16, np.nan).tobytes()


@pytest.mark.parametrize("damage, why", [
    (("UPDATE continuations SET stream = X'00112233'",), "continuation: a stored record cannot be read"),
    (("UPDATE overlap_frames SET depth = X'0011'",), "continuation frame 0: a stored record cannot be read"),
    (("UPDATE frames SET pose = X'0011' WHERE idx = 3",), "frame 3: pose of 2 bytes, not 16 float64"),
    (("UPDATE runs SET settings = '[1, 2]'",), "settings: JSON list, not an object"),
    (("UPDATE runs SET settings = '{'",), "settings: not JSON"),
    (("UPDATE frames SET pose = ? WHERE idx = 2", (NAN_POSE,)), "frame 2: pose holds non-finite values"),
    (("UPDATE runs SET mount = ?", (_npy(np.full((4, 4), np.nan)),)), "mount: mount holds non-finite values"),
    (("UPDATE overlap_frames SET rgb = ? WHERE seq = 1", (_npy(np.zeros((20, 30, 3), np.uint8)),)),
     "continuation frame 1: image 30x20"),
], ids=["continuation", "overlap depth", "pose size", "settings list", "settings not JSON", "NaN pose",
        "NaN mount", "overlap image size"])
def test_a_damaged_record_starts_a_new_map_and_says_so(make_mapper, tmp_path, damage, why):
    first = make_mapper("map.db")
    for item in stream()[:6]:
        first.process(item)
    first.close()
    conn = sqlite3.connect(tmp_path / "map.db")
    conn.execute(*damage)
    conn.commit()
    conn.close()
    resumed = make_mapper("map.db", resume=True)   # never raises: the run is read or refused
    text = resumed.snapshot.state_text
    assert "resume: run 1 in" in text and "cannot be read" in text and "a new map starts" in text, text
    assert f"run 1: {why}" in text, text
    assert len(resumed.saved_trajectory()) == 0
    for item in stream()[:4]:
        resumed.process(item)
    assert [p.key for p in resumed.saved_trajectory()] == [0, 1, 2, 3]   # and it maps on
    resumed.close()


def test_new_window_is_refused_when_it_cannot_align_and_changes_nothing(make_mapper):
    mapper = make_mapper("map.db")
    with pytest.raises(ValueError, match="has not placed its last 2 frames"):
        mapper.new_window()   # nothing placed yet
    inputs = stream()
    for item in inputs[:2]:
        mapper.process(item)   # still buffering phase 1
    with pytest.raises(ValueError, match="has not placed"):
        mapper.new_window()
    assert not mapper._stream.windows.switch_due
    for item in inputs[2:6]:
        mapper.process(item)
    mapper.new_window()
    mapper.process(inputs[6])
    assert mapper._stream.windows.number == 1 and mapper.window_records()[-1].first_index == 4
    assert [p.key for p in mapper.saved_trajectory()] == list(range(7))   # the re-run frames are in once
    mapper.close()
    stream_mapper = make_mapper("other.db", long_run_policy="reset")
    with pytest.raises(ValueError, match="needs long_run_policy windowed"):
        stream_mapper.new_window()
    stream_mapper.close()
