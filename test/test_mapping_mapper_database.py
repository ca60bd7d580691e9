"""The Mapper writing its map database (tiny model, CPU): after every verb the committed database
says what the Mapper holds (trajectory, map, windows, conversion), a cleanly ended run exports
byte for byte what save() wrote, and a database that cannot be written changes nothing else."""
import filecmp
import functools
import random
import threading

import numpy as np
import pytest

from lingbot_ros.cache import NothingToRollback
from lingbot_ros.mapping.database import schema as mdb
from lingbot_ros.mapping.files.export import write_map_files
from lingbot_ros.mapping.database.recorder import NoRecorder
from lingbot_ros.mapping.store.map_store import MapStore

from helpers import assert_database_is_the_mapper, frame, stored_run

pytestmark = pytest.mark.usefixtures("torch_single_thread")


@pytest.fixture
def make_mapper(tiny_mapper, tmp_path):
    return functools.partial(tiny_mapper, warmup=False, long_run_policy="windowed", window_size=6, overlap_size=2,
                             map_database=str(tmp_path / "map.db"))


@pytest.mark.parametrize("seed, overrides", [
    (1, {}),
    (2, {"keyframe_interval": 2, "scale_source": "fixed", "scale": 2.5}),
    (3, {"long_run_policy": "reset", "max_keyframes": 4, "max_trajectory_poses": 7}),
    # Restarts that keep the map, each stream at its own scale: the finished part is stored too.
    (4, {"long_run_policy": "reset", "max_keyframes": 4, "scale_source": "odometry"}),
])
def test_the_database_says_what_the_mapper_holds_after_every_verb(make_mapper, seed, overrides):
    rng = random.Random(seed)
    mapper = make_mapper(**overrides)
    shift = 0
    verbs = []
    for _ in range(30):
        verb = rng.choices(["frame", "rollback", "reset", "flush"], weights=[10, 3, 1, 1])[0]
        verbs.append(verb)
        if verb == "frame":
            shift += 6
            mapper.process(frame(shift))
        elif verb == "rollback":
            try:
                mapper.rollback_last_frame()
            except NothingToRollback:
                pass
        elif verb == "reset":
            mapper.reset("test")
        else:
            mapper.flush()
        assert_database_is_the_mapper(mapper)
    mapper.finish()
    assert_database_is_the_mapper(mapper)
    assert "rollback" in verbs and "reset" in verbs
    mapper.close()


@pytest.mark.parametrize("overrides", [{}, {"long_run_policy": "reset", "max_keyframes": 4,
                                             "scale_source": "odometry"}], ids=["windowed", "odometry"])
def test_a_clean_end_exports_what_save_wrote(make_mapper, tmp_path, overrides):
    mapper = make_mapper(**overrides)
    for shift in range(0, 96, 6):
        mapper.process(frame(shift))
    if overrides:
        assert mapper.snapshot.restarts >= 2   # the finished part holds two streams or more
    else:
        mapper.rollback_last_frame()
    mapper.save(tmp_path / "saved")   # mid-window: provisional frames in the map and trajectory
    mapper.close()
    run = stored_run(mapper)
    assert run.info.ending == mdb.CLEAN
    write_map_files(tmp_path / "exported", run.xyz, run.rgb, run.trajectory, run.windows)
    for name in ("map.ply", "trajectory.tum") + (() if overrides else ("windows.csv",)):
        assert filecmp.cmp(tmp_path / "saved" / name, tmp_path / "exported" / name, shallow=False), name


def test_a_database_that_cannot_be_written_changes_nothing_else(make_mapper, tmp_path):
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"not a database" * 64)
    results = []
    for database in (str(corrupt), ""):
        mapper = make_mapper(map_database=database)
        for shift in range(0, 60, 6):
            mapper.process(frame(shift, stamp_s=shift / 60))
        mapper.finish()
        results.append(mapper.snapshot)
        mapper.save(tmp_path / f"save{len(results)}")
        mapper.close()
    assert "corrupt" in results[0].map_database_error or "not a database" in results[0].map_database_error
    assert results[1].map_database == "off" and not results[1].map_database_error
    for name in ("map.ply", "trajectory.tum", "windows.csv"):
        assert filecmp.cmp(tmp_path / "save1" / name, tmp_path / "save2" / name, shallow=False), name
    assert corrupt.read_bytes() == b"not a database" * 64


def test_a_refusal_after_the_first_snapshot_is_in_the_snapshot_without_a_frame(tiny_mapper):
    """The writer thread opens the file (and may refuse it) after the Mapper's first snapshot; the
    snapshot says so at once, not only after the next frame (a node waiting for images told nothing)."""
    recorder, unused = NoRecorder(), tiny_mapper(warmup=False)
    unused.close()
    mapper = type(unused)(unused.settings, unused.bundle, recorder=recorder)   # its model, a recorder of ours
    recorder.text, recorder.failure = "not stored: refused", "refused"   # as MapWriter._fail, on its thread
    assert (mapper.snapshot.map_database, mapper.snapshot.map_database_error) == ("not stored: refused", "refused")
    assert mapper.snapshot.state_text == "waiting for images"
    mapper.close()


class _Conversion:
    """I is map (what end_stream reads of a conversion)."""

    @staticmethod
    def points(xyz):
        return xyz

    @staticmethod
    def base_pose(pose):
        return pose


class _SlowRecorder(NoRecorder):
    """A recorder that holds the finished part it was handed until told to read it."""

    def __init__(self):
        self.handed, self.read = [], []

    def stream_ended(self, finished_map, finished_poses):
        self.handed.append((finished_map, finished_poses, len(finished_map), len(finished_poses)))
        self.read.append(threading.Event())
        return self.read[-1]


def _stream(store: MapStore, first: int, count: int, rng) -> None:
    for index in range(first, first + count):
        store.add_pose(index, 10**9 + index, np.eye(4))
        store.hold(index, (rng.normal(size=(50, 3)).astype(np.float32) * 5, np.full((50, 3), 9, np.uint8)))


def test_the_finished_part_goes_to_the_recorder_uncopied_and_is_changed_only_once_read():
    """A restart that keeps the map used to copy the whole finished map on the frame loop (a full
    one took 263-329 ms) for the map database's writer; now the writer reads the store's own
    objects and the store copies only if it must change them before the writer got to them."""
    rng = np.random.default_rng(0)
    recorder = _SlowRecorder()
    store = MapStore(0.5, 10_000, 1_000, recorder)
    _stream(store, 0, 4, rng)
    store.end_stream(_Conversion())
    (first_map, first_poses, voxels, poses), = recorder.handed
    assert store._finished_map is first_map                      # handed over as it is
    _stream(store, 4, 4, rng)
    store.end_stream(_Conversion())   # the writer has not read the first one yet: a copy changes
    assert (len(first_map), len(first_poses)) == (voxels, poses)   # what the writer reads did not move
    second_map = recorder.handed[1][0]
    assert second_map is not first_map and len(second_map) > voxels and len(recorder.handed[1][1]) == 8
    recorder.read[1].set()            # read: the next end changes the store's objects in place
    _stream(store, 8, 2, rng)
    store.end_stream(_Conversion())
    assert recorder.handed[2][0] is second_map
    unread = recorder.handed[2]
    store.clear()                     # new objects: the unread ones stay as handed
    assert (len(unread[0]), len(unread[1])) == unread[2:] and store.num_points() == 0
    xyz, _ = store.points(_Conversion())
    assert len(xyz) == 0
