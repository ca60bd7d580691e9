"""mapping/rig: a RigMapper over N cameras gives what N separate Mappers fed the same frames give.

A random program gives every camera, at every group, one action: no frame (absent from the
group), a frame, or a rollback of its newest frame. The rig runs every group's frames through its
cameras' Mappers with their model steps batched (one MultiStreamSession); the reference feeds
each camera's frames to a Mapper of its own. Every output of every frame (poses, depth,
confidence, points) must agree within 1e-5 of its scale (CPU float32), and every notice, refusal
and count alike. Frames are real (three sequences of ../shared/data), at the tiny fixture's
112-pixel width.
"""
import threading

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from lingbot_ros.cache import NothingToRollback
from lingbot_ros.mapping import factory
from lingbot_ros.mapping.files.export import read_ply, read_tum
from lingbot_ros.mapping.records import FAILED, InputFrame
from lingbot_ros.mapping.rig.cameras import check_cameras
from lingbot_ros.mapping.rig.grouping import MAX_CAMERAS
from lingbot_ros.mapping.rig.grouping import RigFrame
from lingbot_ros.mapping.rig.rig_mapper import RigMapper
from lingbot_ros.mapping.rig.scale import trajectory_scale
from lingbot_ros.mapping.settings import SettingsError
from lingbot_ros.mapping.store.trajectory import Trajectory

from helpers import GET_SHARED, mapper_of, missing, rig_bundle_of, tiny_settings

pytestmark = pytest.mark.usefixtures("torch_single_thread")

CAMERAS = ("front", "left", "back")
FRAMES = 24
# Variants of the tiny Mapper: the interval rule, one keyframe in two, the motion policy (stores,
# then keeps or rolls back), the windowed long-run policy with short windows.
VARIANTS = ({}, {"keyframe_interval": 2}, {"keyframe_policy": "motion"},
            {"long_run_policy": "windowed", "sliding_window": 4, "window_size": 6, "overlap_size": 3})


@pytest.fixture(scope="module")
def images(shared_data):
    """[camera][frame] RGB: courthouse, loop, courthouse backwards."""
    out = []
    for name, backwards in (("courthouse_jpg", False), ("loop_jpg", False), ("courthouse_jpg", True)):
        files = sorted(shared_data(name).glob("*.jpg"))
        if len(files) < FRAMES:
            missing(f"{FRAMES} images in {shared_data(name)}", GET_SHARED)
        files = files[::-1] if backwards else files
        out.append([np.asarray(Image.open(f).convert("RGB")) for f in files[:FRAMES]])
    return out


def assert_close(a, b, what):
    """|a - b| <= 1e-5 * (scale + |b|), scale = max |b| (test_stream_multi's tolerance)."""
    a = torch.as_tensor(np.asarray(a) if not isinstance(a, torch.Tensor) else a).double()
    b = torch.as_tensor(np.asarray(b) if not isinstance(b, torch.Tensor) else b).double()
    error = (a - b).abs() - 1e-5 * (b.abs().max() + b.abs())
    assert error.max() <= 0, f"{what}: max |a - b| {(a - b).abs().max():.3g}, max |b| {b.abs().max():.3g}"


def assert_same_outputs(got, expected, where):
    assert [(o.index, o.stamp_ns, o.is_keyframe, o.provisional, o.trusted) for o in got] == \
        [(o.index, o.stamp_ns, o.is_keyframe, o.provisional, o.trusted) for o in expected], where
    for a, b in zip(got, expected):
        for name in ("camera_pose", "base_pose"):
            assert_close(getattr(a, name), getattr(b, name), f"{where} frame {a.index} {name}")
        for name in ("pose_enc", "depth", "depth_conf", "world_points"):
            assert_close(getattr(a.result, name), getattr(b.result, name), f"{where} frame {a.index} {name}")


def assert_same_outcome(got, expected, where):
    for part in ("new", "final", "revised"):
        assert_same_outputs(getattr(got, part), getattr(expected, part), f"{where} {part}")
    assert [(n.kind, n.text) for n in got.notices] == [(n.kind, n.text) for n in expected.notices], where


def verdict(verb):
    """What a verb said: its text, or the type of the refusal it raised (both sides must agree)."""
    try:
        return verb()
    except NothingToRollback as error:
        return type(error)


class Pair:
    """A RigMapper over ``n`` cameras and the separate Mappers it must equal."""

    def __init__(self, fixture_files, n, **overrides):
        self.settings = tiny_settings(fixture_files, map_database="", **overrides)
        self.cameras = CAMERAS[:n]
        self.rig = RigMapper(self.settings, rig_bundle_of(self.settings, n), self.cameras)
        self.alone = {camera: mapper_of(self.settings) for camera in self.cameras}
        self.next = {camera: 0 for camera in self.cameras}    # each camera's next image

    def frame(self, images, camera, group) -> InputFrame:
        c = self.cameras.index(camera)
        k = self.next[camera]
        self.next[camera] += 1
        return InputFrame(rgb=images[c][k % FRAMES], stamp_ns=10**9 + group * 10**8 + c * 10**6)

    def group(self, frames: dict):
        got = self.rig.process([RigFrame(camera, frame) for camera, frame in frames.items()])
        assert list(got.outcomes) == list(frames)
        for camera, frame in frames.items():
            assert_same_outcome(got.outcomes[camera], self.alone[camera].process(frame), camera)

    def rollback(self, camera):
        assert verdict(lambda: self.rig.rollback_last_frame(camera)) == \
            verdict(self.alone[camera].rollback_last_frame), camera

    def finish(self):
        got = self.rig.finish()
        assert list(got.outcomes) == list(self.cameras)
        for camera in self.cameras:
            expected = self.alone[camera]
            assert_same_outcome(got.outcomes[camera], expected.finish(), f"{camera} finish")
            mine = self.rig.camera(camera)
            fields = ("state", "processed", "rejected", "failed", "restarts", "rolled_back", "keyframes", "window")
            assert [getattr(mine.snapshot, f) for f in fields] == [getattr(expected.snapshot, f) for f in fields]
            a, b = mine.saved_trajectory(), expected.saved_trajectory()
            assert a.stamps_ns().tolist() == b.stamps_ns().tolist()
            if len(b):
                assert_close(a.poses(), b.poses(), f"{camera} trajectory")

    def close(self):
        threads = self.rig._baton.threads
        self.rig.close()
        for mapper in self.alone.values():
            mapper.close()
        assert not any(thread.is_alive() for thread in threads), "a camera's worker thread outlived close()"


def run_program(pair, images, program):
    for group, actions in enumerate(program):
        frames = {}
        for camera, action in zip(pair.cameras, actions):
            if action == "frame":
                frames[camera] = pair.frame(images, camera, group)
        if frames:
            pair.group(frames)
        for camera, action in zip(pair.cameras, actions):
            if action == "rollback":
                pair.rollback(camera)
    pair.finish()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_rig_equals_separate_mappers(fixture_files, images, data):
    n = data.draw(st.integers(1, 3), "cameras")
    variant = data.draw(st.sampled_from(VARIANTS), "variant")
    actions = st.sampled_from(("absent", "frame", "frame", "frame", "rollback"))
    program = data.draw(st.lists(st.lists(actions, min_size=n, max_size=n), min_size=4, max_size=14), "program")
    pair = Pair(fixture_files, n, **variant)
    try:
        run_program(pair, images, program)
    finally:
        pair.close()


def test_one_batched_model_step_per_group(fixture_files, images, monkeypatch):
    """Past phase 1, a group of three cameras' frames is ONE MultiStreamSession.step of three frames;
    phase 1 too goes through one call per group (each stream buffers or runs its own batch)."""
    pair = Pair(fixture_files, 3)
    session, real, calls = pair.rig._baton.session, pair.rig._baton.session.step, []
    monkeypatch.setattr(session, "step", lambda frames: (calls.append([f.stream for f in frames]), real(frames))[1])
    try:
        run_program(pair, images, [("frame", "frame", "frame")] * 6 + [("frame", "absent", "frame")])
        assert calls == [[0, 1, 2]] * 6 + [[0, 2]]
    finally:
        pair.close()


@pytest.mark.parametrize("variant", [{}, {"keyframe_policy": "motion"}])
def test_a_rollback_of_one_camera(fixture_files, images, variant):
    """After phase 1 the front camera's newest frames are rolled back, one at a time (the motion
    policy's unstored frames are refused alike), the others' frames stand; every camera then goes
    on as its separate Mapper does."""
    pair = Pair(fixture_files, 3, **variant)
    try:
        both = ("frame", "frame", "frame")
        run_program(pair, images, [both] * 6 + [("rollback", "absent", "frame"), ("rollback", "frame", "absent")]
                    + [both] * 3)
        assert pair.rig.camera("front").snapshot.rolled_back == pair.alone["front"].snapshot.rolled_back
        if not variant:
            assert pair.rig.camera("front").snapshot.rolled_back == 2
    finally:
        pair.close()


def test_a_known_metric_scale_is_taken_as_is(fixture_files, images):
    """scale_source fixed: every camera's map is in metres already, the scale against the primary is 1."""
    settings = tiny_settings(fixture_files, map_database="", scale_source="fixed", scale=2.0)
    rig = RigMapper(settings, rig_bundle_of(settings, 2), ("front", "left"))
    try:
        for k in range(4):
            rig.process([RigFrame(c, InputFrame(rgb=images[i][k], stamp_ns=10**9 + k * 10**8))
                         for i, c in enumerate(("front", "left"))])
        assert rig.scales["left"].source == "metric" and rig.scales["left"].value == 1.0
    finally:
        rig.close()


def test_a_window_switch_in_one_camera_only(fixture_files, images):
    """Windowed: the front camera gets every group's frame and switches windows (its overlap frames
    run again in extra rounds); the left camera gets one in three and stays in its first window."""
    pair = Pair(fixture_files, 2, **VARIANTS[3])
    try:
        run_program(pair, images, [("frame", "frame" if g % 3 == 0 else "absent") for g in range(14)])
        assert pair.rig.camera("front").snapshot.window > 0
        assert pair.rig.camera("left").snapshot.window == 0
    finally:
        pair.close()


def test_a_failed_batched_step_restarts_every_camera_in_it(fixture_files, images, monkeypatch):
    pair = Pair(fixture_files, 2)
    try:
        for group in range(4):
            pair.group({camera: pair.frame(images, camera, group) for camera in pair.cameras})
        session, real = pair.rig._baton.session, pair.rig._baton.session.step

        def fails_once(frames):
            monkeypatch.setattr(session, "step", real)
            raise RuntimeError("CUDA out of memory (simulated)")

        monkeypatch.setattr(session, "step", fails_once)
        got = pair.rig.process([RigFrame(camera, pair.frame(images, camera, 4)) for camera in pair.cameras])
        for camera in pair.cameras:
            assert [n.kind for n in got.outcomes[camera].notices] == [FAILED], camera
            assert "CUDA out of memory (simulated)" in got.outcomes[camera].notices[0].text
            assert pair.rig.camera(camera).snapshot.restarts == 1
        # Both streams start again and map on.
        for group in range(5, 9):
            pair.rig.process([RigFrame(camera, pair.frame(images, camera, group)) for camera in pair.cameras])
        assert all(s.processed > 4 for s in pair.rig.snapshots.values())
    finally:
        pair.close()


def test_an_error_a_mapper_does_not_catch_reaches_the_caller_after_every_camera_ran(fixture_files, images,
                                                                                   monkeypatch):
    pair = Pair(fixture_files, 2)
    try:
        monkeypatch.setattr(pair.rig.camera("front"), "process", lambda frame: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            pair.rig.process([RigFrame(camera, pair.frame(images, camera, 0)) for camera in pair.cameras])
        assert pair.rig.camera("left").next_index == 1   # its frame ran all the same
        monkeypatch.undo()
        pair.rig.process([RigFrame("front", pair.frame(images, "front", 1))])   # the rig goes on
        assert pair.rig.camera("front").next_index == 1
    finally:
        pair.close()


def test_a_camera_that_changes_its_image_size_affects_its_own_stream_only(fixture_files, images):
    """The streams of one pool share one model input size: a camera whose images change to another
    aspect ratio restarts and its frames fail (said in its notices) while the others map on, equal
    to their separate Mappers."""
    pair = Pair(fixture_files, 2)
    try:
        for group in range(5):
            pair.group({camera: pair.frame(images, camera, group) for camera in pair.cameras})
        for group in range(5, 8):
            front = pair.frame(images, "front", group)
            tall = InputFrame(rgb=np.ascontiguousarray(images[1][group][:, :300]), stamp_ns=10**9 + group * 10**8)
            got = pair.rig.process([RigFrame("front", front), RigFrame("left", tall)])
            assert_same_outcome(got.outcomes["front"], pair.alone["front"].process(front), "front")
            assert FAILED in [n.kind for n in got.outcomes["left"].notices]
            assert "share one image size" in " ".join(n.text for n in got.outcomes["left"].notices)
        assert pair.rig.camera("front").snapshot.failed == 0
    finally:
        pair.close()


def test_warm_up_runs_every_camera_and_leaves_no_trace(fixture_files, images):
    pair = Pair(fixture_files, 2)
    try:
        assert pair.rig.warm_up() > 0
        for mapper in pair.alone.values():
            mapper.warm_up()
        assert all(s.processed == 0 and s.keyframes == 0 for s in pair.rig.snapshots.values())
        run_program(pair, images, [("frame", "frame")] * 5)
    finally:
        pair.close()


def test_the_one_map_and_a_camera_fed_the_primarys_frames_has_scale_one(fixture_files, images, tmp_path):
    """Two cameras fed the same frames: the second's scale against the primary is 1, and the rig's
    map is the primary's (the union of two equal maps, voxelised once)."""
    settings = tiny_settings(fixture_files, map_database="", map_voxel_size_m=0.05)
    rig = RigMapper(settings, rig_bundle_of(settings, 2), ("front", "copy"), primary="front")
    try:
        assert rig.scales["copy"].value is None   # nothing matched yet
        for k in range(10):
            frame = InputFrame(rgb=images[0][k], stamp_ns=10**9 + k * 10**8)
            rig.process([RigFrame("front", frame), RigFrame("copy", frame)])
        rig.finish()
        scale = rig.scales["copy"]
        assert scale.known and scale.value == pytest.approx(1.0, rel=1e-6), scale
        assert scale.matched_poses == 10 and "10 base poses" in scale.text
        xyz, rgb = rig.map_points()
        single, _ = rig.camera("front").map_points()
        # The copy's points are the primary's up to the batched step's rounding (~1e-6: the two
        # streams' rows of one call), so a point on a voxel's face may land in the next voxel:
        # the union holds every voxel of the primary's map, and a few more at most; the voxels
        # such a point left or joined have another mean, the others the primary's point.
        voxel = settings.map_voxel_size_m
        keys = {tuple(k): p for k, p in zip(np.floor(xyz / voxel).astype(np.int64), xyz)}
        single_keys = [tuple(k) for k in np.floor(single / voxel).astype(np.int64)]
        assert len(single) > 0 and all(k in keys for k in single_keys)
        few = max(2, len(single) // 1000)
        assert len(xyz) - len(single) <= few
        moved = np.abs(np.array([keys[k] for k in single_keys]) - single).max(axis=1) > 1e-5 * np.abs(single).max()
        assert moved.sum() <= 2 * few, f"{moved.sum()} of {len(single)} voxels moved"
        saved = rig.save(tmp_path)
        ply_xyz, ply_rgb = read_ply(saved.ply_path)
        assert len(ply_xyz) == len(xyz) and (ply_rgb == rgb).all()
        for camera in ("front", "copy"):
            trajectory = read_tum(tmp_path / f"trajectory_{camera}.tum")
            assert trajectory.stamps_ns().tolist() == [10**9 + k * 10**8 for k in range(10)]
            np.testing.assert_allclose(trajectory.poses(), rig.camera(camera).saved_trajectory().poses(), atol=1e-6)
        assert (tmp_path / "preview.png").exists() and not (tmp_path / "trajectory.tum").exists()
    finally:
        rig.close()


def test_the_map_is_the_union_of_the_cameras_maps_at_the_primarys_scale(fixture_files, images):
    settings = tiny_settings(fixture_files, map_database="", map_voxel_size_m=0.05)
    rig = RigMapper(settings, rig_bundle_of(settings, 2), ("front", "left"), primary="left")
    try:
        for k in range(10):
            rig.process([RigFrame(camera, InputFrame(rgb=images[c][k], stamp_ns=10**9 + k * 10**8 + c * 10**6))
                         for c, camera in enumerate(("front", "left"))])
        rig.finish()
        scales = rig.scales
        assert scales["left"].value == 1.0 and scales["left"].source == "primary"
        assert scales["front"].known, scales["front"]
        xyz, _ = rig.map_points()
        parts = [rig.camera("front").map_points()[0] * np.float32(scales["front"].value),
                 rig.camera("left").map_points()[0]]
        # One point per voxel of 5 cm holding any camera's (scaled) points, and no other: the voxels
        # the rig's points lie in are those of the cameras' points (a mean of a voxel's points lies in
        # it; float rounding may move one onto a face).
        union = np.concatenate(parts)
        assert max(len(p) for p in parts) <= len(xyz) <= len(union)
        assert len(voxels(xyz) ^ voxels(union)) <= 1e-3 * len(xyz)
    finally:
        rig.close()


def voxels(points, size=0.05):
    return set(map(tuple, np.floor(points / np.float32(size)).astype(np.int64).tolist()))


def test_trajectory_scale_recovers_a_known_factor():
    """Stamp-matched base positions of a camera at 1/2.5 of the primary's scale, sampled 3 ms later
    (interpolated between the primary's poses): the estimate is 2.5."""
    rng = np.random.default_rng(4)
    path = np.cumsum(rng.normal(size=(40, 3)), axis=0)
    stamps = 10**9 + np.arange(40) * 10**8
    primary, other = Trajectory(), Trajectory()
    for i in range(40):
        primary.append(int(stamps[i]), pose_at(path[i]))
    for i in range(39):
        t = 0.03
        other.append(int(stamps[i] + 3 * 10**6), pose_at(((1 - t) * path[i] + t * path[i + 1]) / 2.5))
    scale = trajectory_scale(primary, other)
    assert scale.value == pytest.approx(2.5, rel=1e-9) and scale.matched_poses == 39
    short = Trajectory()
    for entry in list(other)[:3]:
        short.append(entry.stamp_ns, entry.pose)
    assert trajectory_scale(primary, short).value is None
    far = Trajectory()   # stamps the primary's poses do not bracket
    for entry in other:
        far.append(entry.stamp_ns + 10**12, entry.pose)
    assert trajectory_scale(primary, far).value is None


def pose_at(position):
    pose = np.eye(4)
    pose[:3, 3] = position
    return pose


@pytest.mark.parametrize("cameras, primary, says", [
    (["front", "front"], None, "must name each camera once; repeated: ['front']"),
    ([], None, "must name at least one camera"),
    (["front", ""], None, "a camera name must be a non-empty string"),
    (["front", "a/b"], None, "camera name 'a/b' must start with a letter"),
    ([f"cam{i}" for i in range(100)], None, f"at most {MAX_CAMERAS} cameras"),
    (["front", "back"], "left", "primary_camera 'left' is not one of cameras (front, back)"),
    ("front", None, "a list of names"),
])
def test_a_hostile_rig_is_refused_with_what_to_change(fixture_files, cameras, primary, says, monkeypatch):
    with pytest.raises(SettingsError) as refused:
        check_cameras(cameras, primary)
    assert says in str(refused.value)
    settings = tiny_settings(fixture_files, map_database="")
    if primary is not None:   # the RigMapper's (factory.build_rig takes no primary)
        with pytest.raises(SettingsError) as refused:
            RigMapper(settings, rig_bundle_of(settings, len(cameras)), cameras, primary)
        assert says in str(refused.value)
        return
    monkeypatch.setattr(factory, "load_model", lambda *_: pytest.fail("the model loaded for a refused rig"))
    with pytest.raises(SettingsError) as refused:   # where a rig is built too, before the model loads
        factory.build_rig(settings, cameras)
    assert says in str(refused.value)


def test_close_after_a_verb_cut_short_joins_every_camera_thread(fixture_files, images, monkeypatch):
    """A signal in the rig's thread during the batched step (run raises it mid-round, workers
    parked): close() still ends every camera's verb and thread."""
    pair = Pair(fixture_files, 2, num_scale_frames=1, scale_frames=1)
    monkeypatch.setattr(pair.rig._baton, "_step", lambda parked: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        pair.rig.process([RigFrame(camera, pair.frame(images, camera, 0)) for camera in pair.cameras])
    pair.close()   # asserts that no worker thread outlives it


def test_close_joins_every_camera_thread(fixture_files):
    settings = tiny_settings(fixture_files, map_database="")
    before = threading.active_count()
    rig = RigMapper(settings, rig_bundle_of(settings, 3), CAMERAS)
    threads = rig._baton.threads
    assert all(thread.is_alive() for thread in threads)
    rig.close()
    rig.close()   # twice is harmless
    assert not any(thread.is_alive() for thread in threads)
    assert threading.active_count() <= before
