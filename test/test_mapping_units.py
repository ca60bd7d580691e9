"""mapping/: unprojection, point selection, voxel map, trajectory, PLY / TUM export, the axes into map."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lingbot_ros.mapping.files.export import PlyFormatError, read_ply, read_tum, write_ply, write_tum
from lingbot_ros.mapping.store.trajectory import Trajectory
from lingbot_ros.mapping.placement.conversion import R_MAP_FROM_OPTICAL, Placement
from lingbot_ros.mapping.placement.geometry import quaternion_to_rotation, rotation_to_quaternion
from lingbot_ros.mapping.store.voxel_map import VoxelMap, VoxelRangeError
from lingbot_ros.mapping.store.points import depth_to_points, image_to_rgb_uint8, select_points
from lingbot_ros.mapping.stamps import ns_from_text, seconds_text


def random_c2w(rng):
    q = rng.normal(size=4)
    c2w = np.eye(4)
    c2w[:3, :3] = quaternion_to_rotation(q)
    c2w[:3, 3] = rng.normal(size=3)
    return c2w


def naive_points(depth, intrinsic, c2w):
    """Spec section 12, one pixel at a time."""
    height, width = depth.shape
    out = np.zeros((height, width, 3))
    fx, fy, cx, cy = intrinsic[0, 0], intrinsic[1, 1], intrinsic[0, 2], intrinsic[1, 2]
    for v in range(height):
        for u in range(width):
            d = depth[v, u]
            x_cam = np.array([d * (u - cx) / fx, d * (v - cy) / fy, d])
            out[v, u] = c2w[:3, :3] @ x_cam + c2w[:3, 3]
    return out


@pytest.fixture
def frame():
    rng = np.random.default_rng(0)
    height, width = 7, 9
    depth = rng.uniform(0.5, 5.0, size=(height, width))
    intrinsic = np.array([[11.0, 0, width / 2], [0, 13.0, height / 2], [0, 0, 1]])
    return depth, intrinsic, random_c2w(rng)


def test_depth_to_points_matches_per_pixel_loop(frame):
    depth, intrinsic, c2w = frame
    expected = naive_points(depth, intrinsic, c2w)
    np.testing.assert_allclose(depth_to_points(depth, intrinsic, c2w), expected, atol=1e-12)
    # [3, 4] extrinsic and [H, W, 1] depth are accepted too.
    np.testing.assert_allclose(depth_to_points(depth[..., None], intrinsic, c2w[:3]), expected,
                               atol=1e-12)


def test_depth_to_points_torch_matches_numpy(frame):
    depth, intrinsic, c2w = frame
    out = depth_to_points(torch.from_numpy(depth).float(), torch.from_numpy(intrinsic).float(),
                          torch.from_numpy(c2w[:3]).float())
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), naive_points(depth, intrinsic, c2w), atol=1e-4)


def test_depth_to_points_identity_pose_principal_point():
    """At the principal pixel the point is (0, 0, depth) in the camera = world frame."""
    depth = np.full((5, 5), 2.0)
    intrinsic = np.array([[4.0, 0, 2], [0, 4.0, 3], [0, 0, 1]])
    points = depth_to_points(depth, intrinsic, np.eye(4))
    np.testing.assert_allclose(points[3, 2], [0, 0, 2])     # row v=3=cy, column u=2=cx
    np.testing.assert_allclose(points[3, 4], [1, 0, 2])     # u - cx = 2 -> x = 2 * 2 / 4


def test_depth_to_points_rejects_bad_shapes(frame):
    depth, intrinsic, c2w = frame
    with pytest.raises(ValueError, match="depth"):
        depth_to_points(depth[None], intrinsic, c2w)
    with pytest.raises(ValueError, match="extrinsic"):
        depth_to_points(depth, intrinsic, c2w[:2])


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_select_points_matches_naive_filter(library):
    rng = np.random.default_rng(1)
    points = rng.normal(size=(6, 8, 3))
    points[0, 0, 1] = np.nan                       # non-finite points are never kept
    colors = rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    conf = rng.uniform(1.0, 3.0, size=(6, 8))
    conf[0, 0] = 10.0
    expected_xyz, expected_rgb = [], []
    for v in range(0, 6, 2):
        for u in range(0, 8, 2):
            if conf[v, u] >= 1.5 and np.isfinite(points[v, u]).all():
                expected_xyz.append(points[v, u])
                expected_rgb.append(colors[v, u])
    if library == "torch":
        points, colors, conf = map(torch.from_numpy, (points, colors, conf))
    xyz, rgb = select_points(points, colors, conf, min_confidence=1.5, stride=2)
    assert xyz.dtype == np.float32 and rgb.dtype == np.uint8
    np.testing.assert_allclose(xyz, np.array(expected_xyz), rtol=1e-6)
    np.testing.assert_array_equal(rgb, np.array(expected_rgb))


def test_select_points_without_confidence_keeps_all():
    points = np.ones((3, 4, 3))
    xyz, rgb = select_points(points, np.zeros((3, 4, 3), np.uint8), None, 99.0)
    assert xyz.shape == (12, 3) and rgb.shape == (12, 3)


def test_image_to_rgb_uint8_numpy_and_torch_agree():
    image = np.random.default_rng(2).uniform(-0.1, 1.1, size=(3, 4, 5)).astype(np.float32)
    out = image_to_rgb_uint8(image)
    assert out.shape == (4, 5, 3) and out.dtype == np.uint8
    assert out[1, 2, 0] == round(min(max(image[0, 1, 2], 0), 1) * 255)
    np.testing.assert_array_equal(image_to_rgb_uint8(torch.from_numpy(image)).numpy(), out)


# ---------------------------------------------------------------------------- voxel map

def naive_voxel_means(points, colors, voxel_size):
    groups = {}
    for p, c in zip(points, colors):
        key = tuple(np.floor(p / voxel_size).astype(int))
        groups.setdefault(key, []).append((p, c))
    return {k: (np.mean([p for p, _ in v], axis=0), np.mean([c for _, c in v], axis=0))
            for k, v in groups.items()}


def test_voxel_map_one_point_per_voxel_with_means():
    rng = np.random.default_rng(3)
    voxel = 0.25
    batches = [(rng.uniform(-1, 1, size=(300, 3)), rng.integers(0, 256, size=(300, 3),
                                                                dtype=np.uint8))
               for _ in range(3)]
    vmap = VoxelMap(voxel_size_m=voxel)
    for points, colors in batches:
        vmap.insert(points, colors)
    expected = naive_voxel_means(np.concatenate([b[0] for b in batches]),
                                 np.concatenate([b[1] for b in batches]), voxel)
    xyz, rgb = vmap.points()
    assert xyz.dtype == np.float32 and rgb.dtype == np.uint8
    assert len(vmap) == len(xyz) == len(expected)
    keys = [tuple(k) for k in np.floor(xyz / voxel).astype(int)]
    assert len(set(keys)) == len(keys)               # one point per voxel
    for key, p, c in zip(keys, xyz, rgb):
        mean_p, mean_c = expected[key]
        np.testing.assert_allclose(p, mean_p, atol=1e-6)
        # Means are kept in float32: a colour mean of exactly x.5 may round either way.
        assert np.abs(c.astype(float) - mean_c).max() <= 0.5 + 1e-4


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(-5, 5), st.integers(-5, 5), st.integers(-5, 5)),
                min_size=1, max_size=40),
       st.integers(1, 4))
def test_voxel_map_counts_voxels_like_a_set(cells, num_batches):
    """Whatever the batching, the map holds exactly the set of occupied voxels."""
    points = np.array(cells, dtype=np.float64) * 0.1 + 0.05   # voxel centres, voxel 0.1
    colors = np.zeros_like(points, dtype=np.uint8)
    vmap = VoxelMap(0.1)
    for chunk, chunk_colors in zip(np.array_split(points, num_batches),
                                   np.array_split(colors, num_batches)):
        vmap.insert(chunk, chunk_colors)
    assert len(vmap) == len(set(cells))
    np.testing.assert_allclose(np.sort(vmap.points()[0], axis=0),
                               np.sort(np.unique(points, axis=0), axis=0), atol=1e-6)


def test_voxel_map_max_points_drops_least_recently_updated():
    vmap = VoxelMap(1.0, max_points=4)
    red = np.array([[255, 0, 0]], np.uint8)
    for x in range(4):                                 # voxels 0..3, inserted in order
        vmap.insert(np.array([[x + 0.5, 0.5, 0.5]]), red)
    vmap.insert(np.array([[0.5, 0.5, 0.5]]), red)      # touch voxel 0 again: now the newest
    vmap.insert(np.array([[10.5, 0.5, 0.5]]), red)     # a fifth voxel: the stalest (1) goes
    assert len(vmap) == 4
    assert sorted(vmap.points()[0][:, 0].tolist()) == [0.5, 2.5, 3.5, 10.5]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 30), st.lists(st.integers(1, 60), min_size=1, max_size=8),
       st.integers(0, 2**31))
def test_voxel_map_bounded_keeps_latest_insert(max_points, batch_sizes, seed):
    """Never more than max_points; the latest insert's voxels survive when they fit alone."""
    rng = np.random.default_rng(seed)
    vmap = VoxelMap(1.0, max_points=max_points)
    for size in batch_sizes:
        points = rng.integers(-4, 4, size=(size, 3)) + 0.5
        vmap.insert(points, np.zeros((size, 3), np.uint8))
        assert len(vmap) <= max_points
        xyz = vmap.points()[0]
        assert len(xyz) == len(vmap)
        occupied = {tuple(v) for v in np.floor(xyz).astype(int)}
        latest = {tuple(v) for v in np.floor(points).astype(int)}
        if len(latest) <= max_points:
            assert latest <= occupied
        else:
            assert len(vmap) >= max_points - max_points // 16 and occupied <= latest


def test_voxel_map_storage_stops_growing_at_max_points():
    rng = np.random.default_rng(6)
    vmap = VoxelMap(0.1, max_points=500)
    sizes = []
    for _ in range(40):
        vmap.insert(rng.uniform(-5, 5, size=(200, 3)), np.zeros((200, 3), np.uint8))
        sizes.append(vmap.nbytes())
    assert 500 - 500 // 16 <= len(vmap) <= 500     # a full map drops a sixteenth at once
    assert sizes[-1] == sizes[10] and sizes[-1] < 500 * 100


def test_voxel_map_single_insert_larger_than_budget_keeps_spread_subset():
    grid = np.stack(np.meshgrid(*[np.arange(10)] * 3, indexing="ij"), -1).reshape(-1, 3) + 0.5
    vmap = VoxelMap(1.0, max_points=100)
    vmap.insert(grid, np.zeros_like(grid, dtype=np.uint8))
    xyz, _ = vmap.points()
    assert len(vmap) == len(xyz) == 100
    # The survivors cover every slab of the grid, not just one corner of it.
    for axis in range(3):
        assert len(np.unique(np.floor(xyz[:, axis]))) == 10


def test_voxel_map_clear_skips_non_finite_and_checks_range():
    vmap = VoxelMap(0.5)
    vmap.insert(np.array([[0.1, 0.1, 0.1], [np.inf, 0, 0]]), np.zeros((2, 3), np.uint8))
    assert len(vmap) == 1
    vmap.clear()
    assert len(vmap) == 0 and vmap.points()[0].shape == (0, 3)
    with pytest.raises(VoxelRangeError, match="voxel_size_m"):
        vmap.insert(np.array([[1e9, 0, 0]]), np.zeros((1, 3), np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        vmap.insert(np.zeros((1, 3)), np.zeros((1, 3)))


# ---------------------------------------------------------------------- trajectory, export

unit_quaternions = st.tuples(*[st.floats(-1, 1) for _ in range(4)]).filter(
    lambda q: np.linalg.norm(q) > 1e-3)


@settings(max_examples=200, deadline=None)
@given(unit_quaternions)
def test_quaternion_round_trip(q):
    rotation = quaternion_to_rotation(np.array(q))
    np.testing.assert_allclose(rotation @ rotation.T, np.eye(3), atol=1e-9)
    q_back = rotation_to_quaternion(rotation)
    assert q_back[3] >= 0 and np.isclose(np.linalg.norm(q_back), 1.0)
    expected = np.array(q) / np.linalg.norm(q)
    # q and -q are the same rotation; compare up to that sign.
    assert min(np.abs(q_back - expected).max(), np.abs(q_back + expected).max()) < 1e-7
    np.testing.assert_allclose(quaternion_to_rotation(q_back), rotation, atol=1e-9)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_quaternion_of_half_turns(axis):
    """Trace -1: the naive w-first formula divides by zero here."""
    rotation = -np.eye(3)
    rotation[axis, axis] = 1
    expected = np.zeros(4)
    expected[axis] = 1
    np.testing.assert_allclose(np.abs(rotation_to_quaternion(rotation)), expected, atol=1e-12)


def test_trajectory_bounded_length():
    trajectory = Trajectory(max_length=3)
    for i in range(5):
        trajectory.append(i, np.eye(4)[:3])
    assert len(trajectory) == 3
    np.testing.assert_array_equal(trajectory.stamps_ns(), [2, 3, 4])
    with pytest.raises(TypeError):   # stamps are integer nanoseconds: float seconds are refused
        trajectory.append(1.5, np.eye(4))
    assert trajectory.poses().shape == (3, 4, 4)


def test_tum_round_trip(tmp_path):
    rng = np.random.default_rng(4)
    trajectory = Trajectory()
    for i in range(6):
        trajectory.append(1_700_000_000 * 10**9 + i * 10**8 + 1_234, random_c2w(rng))
    path = tmp_path / "trajectory.tum"
    write_tum(path, trajectory)
    lines = path.read_text().splitlines()
    assert len(lines) == 6 and all(len(line.split()) == 8 for line in lines)
    # seconds with microsecond digits, exact from the integer nanoseconds
    assert [line.split()[0] for line in lines[:2]] == ["1700000000.000001", "1700000000.100001"]
    back = read_tum(path)
    np.testing.assert_array_equal(back.stamps_ns(), (trajectory.stamps_ns() + 500) // 1000 * 1000)
    np.testing.assert_allclose(back.poses(), trajectory.poses(), atol=1e-7)


def test_seconds_text_and_back_are_exact():
    for ns, text6 in [(0, "0.000000"), (1_700_000_000_099_999_999, "1700000000.100000"),
                      (123_456_789, "0.123457"), (-1_500_000_000, "-1.500000"), (1_499, "0.000001")]:
        assert seconds_text(ns, 6) == text6
        assert ns_from_text(seconds_text(ns)) == ns
    assert seconds_text(1_700_000_000_100_000_000) == "1700000000.100000000"   # no float noise
    assert ns_from_text("1305031102.175304") == 1_305_031_102_175_304_000 and ns_from_text("1e3") == 10**12
    for bad in ("abc", "nan", "inf"):
        with pytest.raises(ValueError):
            ns_from_text(bad)


def test_ply_header_and_round_trip(tmp_path):
    rng = np.random.default_rng(5)
    xyz = rng.normal(size=(50, 3)).astype(np.float32)
    rgb = rng.integers(0, 256, size=(50, 3), dtype=np.uint8)
    path = tmp_path / "map.ply"
    write_ply(path, xyz, rgb)
    data = path.read_bytes()
    header, body = data.split(b"end_header\n", 1)
    assert header.decode().splitlines() == [
        "ply", "format binary_little_endian 1.0", "comment written by lingbot_ros",
        "element vertex 50", "property float x", "property float y", "property float z",
        "property uchar red", "property uchar green", "property uchar blue"]
    assert len(body) == 50 * 15
    # Independent parse of the first record: 3 little-endian float32 then 3 bytes.
    np.testing.assert_array_equal(np.frombuffer(body[:12], "<f4"), xyz[0])
    assert tuple(body[12:15]) == tuple(rgb[0])
    xyz_back, rgb_back = read_ply(path)
    np.testing.assert_array_equal(xyz_back, xyz)
    np.testing.assert_array_equal(rgb_back, rgb)
    path.write_bytes(data[:-1])
    with pytest.raises(PlyFormatError, match="bytes of vertex data"):
        read_ply(path)


def test_ply_empty_cloud(tmp_path):
    write_ply(tmp_path / "empty.ply", np.zeros((0, 3)), np.zeros((0, 3), np.uint8))
    xyz, rgb = read_ply(tmp_path / "empty.ply")
    assert xyz.shape == (0, 3) and rgb.shape == (0, 3)


# ---------------------------------------------------- Placement: the optical axes into map

def rot_x(angle):
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])


def test_identity_model_pose_is_identity_in_map():
    np.testing.assert_allclose(Placement().camera_pose(np.eye(4))[:3, 3], 0)
    # The optical axes of the first camera seen from map: z (forward) = map x, x (right) = -y,
    # y (down) = -z.
    pose = Placement().camera_pose(np.eye(4))
    np.testing.assert_allclose(pose[:3, :3], R_MAP_FROM_OPTICAL)


def test_camera_moving_forward_moves_along_map_x():
    extrinsic = np.eye(4)
    extrinsic[:3, 3] = [0.5, -0.2, 2.0]          # right 0.5, up 0.2, forward 2 (optical axes)
    pose = Placement().camera_pose(extrinsic)
    np.testing.assert_allclose(pose[:3, 3], [2.0, -0.5, 0.2])   # forward, right = -left, up


def test_points_and_poses_use_the_same_conversion():
    extrinsic = np.eye(4)
    extrinsic[:3, :3] = rot_x(0.3)
    extrinsic[:3, 3] = [1, 2, 3]
    point_cam = np.array([0.1, -0.4, 5.0])
    point_world = extrinsic[:3, :3] @ point_cam + extrinsic[:3, 3]
    pose = Placement().camera_pose(extrinsic)
    np.testing.assert_allclose(Placement().points(point_world[None])[0],
                               pose[:3, :3] @ point_cam + pose[:3, 3])


def test_pitching_the_camera_down_points_its_optical_axis_down_in_map():
    extrinsic = np.eye(4)
    extrinsic[:3, :3] = rot_x(-np.pi / 2)        # optical z turns towards optical +y (down)
    pose = Placement().camera_pose(extrinsic)
    optical_z_in_map = pose[:3, :3] @ [0, 0, 1]
    np.testing.assert_allclose(optical_z_in_map, [0, 0, -1], atol=1e-12)
