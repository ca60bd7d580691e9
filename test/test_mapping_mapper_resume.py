"""Resume and new_window (tiny model, CPU): a run resumed from its map database after a clean end,
fed the following frames, writes byte for byte what one uninterrupted run that started a new
window at that frame writes; a run without a continuation goes on from its last pose; a refused
new_window changes nothing."""
import sqlite3

import pytest

from lingbot_ros.mapping import factory
from lingbot_ros.mapping.mapper import Mapper
from lingbot_ros.mapping.settings import MapperSettings

from helpers import assert_database_is_the_mapper, frame

pytestmark = pytest.mark.usefixtures("torch_single_thread")
FRAMES = 20


@pytest.fixture
def make_mapper(fixture_files, tmp_path):
    def make(database: str, **overrides) -> Mapper:
        settings = MapperSettings(**{**fixture_files, "device": "cpu", "image_width": 112, "warmup": False,
                                     "num_scale_frames": 3, "scale_frames": 3, "sliding_window": 2,
                                     "min_confidence": 0.0, "map_points_stride": 2,
                                     "long_run_policy": "windowed", "window_size": 8, "overlap_size": 2,
                                     "map_database": str(tmp_path / database), **overrides})
        return Mapper(settings, factory.build(settings))
    return make


def stream():
    return [frame(6 * i, stamp_s=i * 0.1) for i in range(FRAMES)]


def files(directory, windows=True):
    names = ("map.ply", "trajectory.tum") + (("windows.csv",) if windows else ())
    return {name: (directory / name).read_bytes() for name in names}


# The window is 8 frames, the overlap 2: stopping at frame 5 or 11 leaves the window's last two
# frames final; at 7 or 13 one of them is provisional (the next window gives its final value).
@pytest.mark.parametrize("stop", [5, 7, 11, 13])
def test_a_resumed_run_continues_exactly_as_a_new_window_would(make_mapper, tmp_path, stop):
    inputs = stream()
    whole = make_mapper("whole.db")
    for item in inputs[:stop]:
        whole.process(item)
    assert whole.new_window().startswith("window ")
    for item in inputs[stop:]:
        whole.process(item)
    whole.finish()
    whole.save(tmp_path / "whole")
    whole.close()

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
    resumed.finish()
    resumed.save(tmp_path / "resumed")
    resumed.close()
    assert files(tmp_path / "resumed") == files(tmp_path / "whole")


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


def test_resume_refuses_a_run_made_with_other_settings(make_mapper):
    first = make_mapper("map.db")
    for item in stream()[:6]:
        first.process(item)
    first.close()
    resumed = make_mapper("map.db", resume=True, map_voxel_size_m=0.1)
    assert "made with other map_voxel_size_m; a new map starts" in resumed.snapshot.state_text
    assert len(resumed.saved_trajectory()) == 0
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
