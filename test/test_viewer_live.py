"""The live view (lingbot_ros/viewer) against a real Mapper on courthouse frames and real viser
websocket clients: what it samples, and that nothing a browser does (a port in use, a hundred
reloads, a client gone mid-update) changes what mapping computes. The page in a real browser:
test_viewer_browser.py."""
import asyncio
import re
import socket
import threading

import numpy as np
import pytest
import viser
import websockets

from lingbot_ros.io.sources import open_source
from lingbot_ros.mapping.placement.conversion import MapConversion
from lingbot_ros.mapping.store.map_store import MapStore
from lingbot_ros.mapping.store.map_view import ViewCamera, sample_path, stride
from lingbot_ros.mapping.mapper import Mapper
from lingbot_ros.mapping.placement.metric_scale import MetricScale
from lingbot_ros.mapping.records import InputFrame
from lingbot_ros.mapping.settings import SettingsError
from lingbot_ros.mapping.placement.geometry import quaternion_to_rotation
from lingbot_ros.mapping.records import MapperOutput
from lingbot_ros.mapping.store.voxel_map import VoxelMap
from lingbot_ros.viewer.live_view import LiveView, ViewerError

from helpers import free_port

pytestmark = pytest.mark.usefixtures("torch_single_thread")
FRAMES = 10


@pytest.fixture
def make_mapper(tiny_mapper):
    """The tiny CPU Mapper (conftest) with this file's window, voxel and long-run settings."""
    def make(**overrides) -> Mapper:
        return tiny_mapper(**{"sliding_window": 4, "map_voxel_size_m": 0.02, "long_run_policy": "reset",
                              "warmup": False, **overrides})
    return make


@pytest.fixture(scope="module")
def courthouse(shared_data):
    source = open_source(str(shared_data("courthouse_jpg")), rate_hz=10.0)
    frames = []
    for item in source:
        frames.append(InputFrame(rgb=item.rgb, stamp_ns=item.stamp_ns))
        if len(frames) == FRAMES:
            return frames
    return frames


def run(mapper, frames, viewer=None, between=None, outputs=None):
    """The offline tool's loop; ``between(i)`` runs after frame i (a browser's doing); the new
    outputs are added to ``outputs``."""
    for i, item in enumerate(frames):
        outcome = mapper.process(item)
        if viewer is not None:
            viewer.update(mapper, outcome)
        if between is not None:
            between(i)
        if outputs is not None:
            outputs.extend(outcome.new)
    outcome = mapper.finish()
    if viewer is not None:
        viewer.update(mapper, outcome, refresh=True)
    if outputs is not None:
        outputs.extend(outcome.new)
    return mapper.saved_trajectory().poses(), mapper.map_points()


def test_sampling_helpers_against_a_naive_reference():
    for total, budget in ((0, 5), (5, 5), (6, 5), (100, 7), (7, 100)):
        every = stride(total, budget)
        kept = list(range(total))[::every]
        assert len(kept) <= max(budget, 1) and (every == 1 or len(list(range(total))[::every - 1]) > budget)
        path = np.arange(total * 3, dtype=float).reshape(-1, 3)
        sampled = sample_path(path, budget)
        assert len(sampled) <= budget and (total == 0 or (sampled[-1] == path[-1]).all())
        assert len(sampled) == len(path) or len(sampled) >= budget // 2


@pytest.mark.parametrize("earlier, live, max_poses, budget", [
    (0, 0, 10, 5), (0, 7, 10, 3), (5, 0, 10, 3), (5, 7, 10, 3), (13, 7, 9, 4), (100, 37, 120, 7), (3, 3, 100, 100),
    (50, 50, 60, 1), (0, 200, 200, 7), (17, 0, 5, 2), (1000, 999, 5000, 10)])
def test_the_views_path_is_sample_path_of_the_trajectory(earlier, live, max_poses, budget):
    """MapStore.view_path picks from the trajectory without listing it (the list cost the frame
    loop 0.3 s at 100,000 poses): the same poses as sample_path over newest_poses."""
    rng = np.random.default_rng(earlier + live)
    conversion = MapConversion(MetricScale(True, 2.0, 0.0, 10, ""), rigid(rng), rng.normal(size=3), rng.normal(size=3))
    store = MapStore(0.05, 10, max_poses, recorder=None)
    for i in range(earlier):
        store._finished_poses.append(i, rigid(rng), key=i)
    for i in range(live):
        store.add_pose(10_000 + i, 10_000 + i, rigid(rng))
    entries = store.newest_poses(max_poses, conversion)
    expected = [entry.pose @ np.linalg.inv(conversion.camera_base) if conv is None else conv.camera_pose(entry.pose)
                for entry, conv in (entries[i] for i in sample_path(np.arange(len(entries)), budget))]
    positions, total = store.view_path(conversion, budget)
    assert total == len(entries) and len(positions) == len(expected)
    np.testing.assert_allclose(positions, np.array([pose[:3, 3] for pose in expected]).reshape(-1, 3), atol=1e-9)
    store.close()


def rigid(rng) -> np.ndarray:
    pose = np.eye(4)
    pose[:3, :3] = quaternion_to_rotation(rng.normal(size=4))
    pose[:3, 3] = rng.normal(size=3)
    return pose


def test_view_leaves_the_held_keyframe_undoable(make_mapper, courthouse):
    mapper = make_mapper()
    for item in courthouse:
        mapper.process(item)
    view = mapper.view(point_budget=10**6, pose_budget=100).result(timeout=30)
    assert view.poses == FRAMES and len(view.xyz) == view.map_points > 0
    assert "its points left the map" in mapper.rollback_last_frame()   # map_points() would have merged them


def test_view_is_an_even_sample_of_the_map(make_mapper, courthouse):
    mapper = make_mapper()
    for item in courthouse:
        mapper.process(item)
    mapper.finish()
    xyz, rgb = mapper.map_points()
    view = mapper.view(point_budget=500, pose_budget=4).result(timeout=30)
    assert view.map_points == len(xyz) > 500 and len(view.xyz) == len(xyz[::stride(len(xyz), 500)]) <= 500
    # Every shown point is a map point with its colour.
    found = dict(zip(map(tuple, xyz.round(5).tolist()), map(tuple, rgb.tolist())))
    assert all(found[tuple(p)] == tuple(c) for p, c in zip(view.xyz.round(5).tolist(), view.rgb.tolist()))
    assert view.poses == len(mapper.saved_trajectory()) == FRAMES and len(view.camera_positions) == 4
    # The path is the camera's (not the base's: the mount differs), the newest among the sample.
    entry, conversion = mapper.path_poses(1)[0]
    np.testing.assert_allclose(view.camera_positions[-1], conversion.camera_pose(entry.pose)[:3, 3], atol=1e-9)
    assert view.units == "model units" and view.voxel_size == 0.02


def test_the_map_is_sampled_on_the_map_builders_thread_and_the_caller_never_waits(make_mapper, courthouse,
                                                                                  monkeypatch):
    """Issue 30: the once-a-second sample cost the frame loop 20-60 ms on a large map. The loop
    only hands the read over: view() returns while the map builder is still inserting, and the
    sample, read after those inserts, holds them."""
    gate, readers = threading.Event(), []
    insert, points = VoxelMap.insert, VoxelMap.points
    monkeypatch.setattr(VoxelMap, "insert", lambda self, *a: (gate.wait(30), insert(self, *a))[1])
    monkeypatch.setattr(VoxelMap, "points", lambda self, *a: (readers.append(threading.current_thread().name),
                                                               points(self, *a))[1])
    mapper = make_mapper()
    for item in courthouse:
        mapper.process(item)   # the inserts wait for the gate on the map builder's thread
    future = mapper.view(point_budget=10**6, pose_budget=100)
    assert not future.done() and readers == []
    gate.set()
    view = future.result(timeout=30)
    assert readers and set(readers) == {"lingbot_map_builder"}
    assert view.poses == FRAMES and len(view.xyz) == view.map_points > 0
    held = mapper._store._held[1][0]   # the newest keyframe's points, held out of the map (undoable)
    assert view.map_points == len(mapper._store.live_map) + len(held)
    mapper.close()


def test_a_windowed_runs_provisional_points_are_made_on_the_map_builders_thread(make_mapper, courthouse,
                                                                               monkeypatch):
    """The provisional keyframes' points read model outputs (a wait for the device on CUDA): the
    frame loop picks them, the map builder's thread makes them, and the view holds them as
    map_points() does."""
    makers = []
    internal_points = MapperOutput.internal_points
    monkeypatch.setattr(MapperOutput, "internal_points", lambda self, *a: (
        makers.append(threading.current_thread().name), internal_points(self, *a))[1])
    mapper = make_mapper(long_run_policy="windowed", window_size=8, overlap_size=4)
    for item in courthouse:
        mapper.process(item)
    assert mapper.stream.windows.provisional(), "the run ends inside a window's overlap"
    makers.clear()
    view = mapper.view(point_budget=10**6, pose_budget=100).result(timeout=30)
    assert makers and set(makers) == {"lingbot_map_builder"}
    # The parts' points: the voxels, the held keyframe's and the provisional keyframes' own.
    s = mapper.settings
    provisional = mapper.stream.windows.provisional_points(s.min_confidence, s.map_points_stride)
    held = mapper.store._held[1][0] if mapper.store._held is not None else ()
    assert view.map_points == len(mapper.store.live_map) + len(held) + sum(len(xyz) for xyz, _ in provisional)
    mapper.close()


def test_the_node_parameters_are_checked_with_what_to_change():
    from lingbot_ros.ros import params

    for values, message in (({"viewer_port": 80}, "'viewer_port' must be 0 (off) or at least 1024"),
                            ({"viewer_port": 70000}, "'viewer_port' must be <= 65535"),
                            ({"viewer_point_budget": 0}, "'viewer_point_budget' must be >= 1")):
        with pytest.raises(SettingsError, match=re.escape(message)):
            params.split(values)
    assert params.split({})[1].viewer_port == 0   # off by default


def test_a_port_in_use_is_refused_clearly():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ViewerError, match=f"127.0.0.1:{port}: in use; pick another port"):
            LiveView(port)


def test_a_connection_closed_before_its_request_logs_nothing(caplog):
    """A browser's preconnect closed unused (or a tab closed while connecting), before any page
    was served: no traceback on the mapping terminal."""
    viewer = LiveView(free_port())
    try:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", int(viewer.url.rsplit(":", 1)[1])), timeout=5):
                pass
        threading.Event().wait(1.0)   # the server's handshake gives up on each
    finally:
        viewer.close()
    assert not [record for record in caplog.records if record.name.startswith("websockets")], caplog.text


def test_without_viser_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "viser", None)
    with pytest.raises(ViewerError, match=r"needs viser.*pip install 'viser==1\.1\.1'"):
        LiveView(free_port())


def test_a_slow_drawing_never_holds_the_frame_loop_and_the_newest_wins(make_mapper, courthouse, monkeypatch):
    viewer = LiveView(free_port(), point_budget=300)
    release, drawn = threading.Event(), []
    original = viewer._draw

    def stuck(pending):   # the first draw waits until mapping is done; later ones draw
        release.wait(60)
        drawn.append(pending)
        original(pending)

    monkeypatch.setattr(viewer, "_draw", stuck)
    try:
        run(make_mapper(), courthouse, viewer)   # would never end if an update waited for a draw
        release.set()
        assert viewer.settle(30) and not viewer.error
    finally:
        viewer.close()
    # The first update was being drawn; all the later ones were taken together, newest values only.
    assert len(drawn) == 2 and drawn[1].view.result().poses == FRAMES


async def _browse(port: int, reloads: int, done: list) -> None:
    """A browser's worst: ``reloads`` page loads (connect, take the scene, leave), every other one
    dropped without a close (a tab killed mid-update)."""
    for i in range(reloads):
        async with websockets.connect(f"ws://127.0.0.1:{port}", subprotocols=[f"viser-v{viser.__version__}"],
                                      max_size=None) as connection:
            await connection.recv()
            if i % 2:
                connection.transport.abort()
        done.append(i)


def test_a_hundred_reloads_and_dropped_clients_do_not_change_mapping(make_mapper, courthouse):
    reference_poses, (reference_xyz, reference_rgb) = run(make_mapper(), courthouse)
    port, done = free_port(), []
    viewer = LiveView(port, point_budget=300)
    browser = threading.Thread(target=lambda: asyncio.run(_browse(port, 100, done)), daemon=True)

    def alongside(i):   # the browser runs beside mapping: ten reloads per frame on average
        if i == 0:
            browser.start()
    try:
        outputs = []
        poses, (xyz, rgb) = run(make_mapper(), courthouse, viewer, between=alongside, outputs=outputs)
        browser.join(120)
        assert viewer.settle(30) and not viewer.error
    finally:
        viewer.close()
    assert len(done) == 100
    # The scene (viser's handles) holds the final map's sample, every pose and the newest camera.
    view = viewer.shown
    assert view.map_points == len(xyz) and len(view.xyz) == len(xyz[::stride(len(xyz), 300)])
    np.testing.assert_array_equal(viewer.nodes["/map"].points, view.xyz)
    np.testing.assert_array_equal(viewer.nodes["/map"].colors, view.rgb)
    assert viewer.nodes["/trajectory"].points.shape == (FRAMES - 1, 2, 3)
    np.testing.assert_allclose(viewer.nodes["/camera"].position, view.camera_positions[-1],
                               atol=1e-6)
    # The camera's node, made once and set in place since, has the newest camera's frustum.
    camera, newest = viewer.nodes["/camera"], ViewCamera.of_output(outputs[-1])
    assert camera.fov == pytest.approx(newest.fov_y) and camera.aspect == pytest.approx(newest.aspect)
    np.testing.assert_allclose(camera.wxyz, viser.transforms.SO3.from_matrix(newest.pose[:3, :3]).wxyz, atol=1e-6)
    np.testing.assert_array_equal(poses, reference_poses)
    np.testing.assert_array_equal(xyz, reference_xyz)
    np.testing.assert_array_equal(rgb, reference_rgb)
