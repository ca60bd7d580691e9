"""Metric scale in the Mapper: a fixed scale and one estimated against synthetic odometry of
known scale reach every output (poses, points, map, depth), and the status says when it is not
known yet."""
import dataclasses

import numpy as np
import pytest
from PIL import Image

from lingbot_ros.mapping.placement.metric_scale import MetricScale
from lingbot_ros.mapping.records import InputFrame
from lingbot_ros.mapping.placement.metric_scale import applied_scale
from lingbot_ros.mapping.store.voxel_map import VoxelMap

from helpers import GET_SHARED, mapper_of, missing, tiny_settings

pytestmark = pytest.mark.usefixtures("torch_single_thread")


@pytest.fixture(scope="module")
def base(fixture_files, shared_data):
    folder = shared_data("loop_jpg")
    files = sorted(folder.glob("*.jpg"))[:40]
    if len(files) < 40:
        missing(f"40 images in {folder}", GET_SHARED)
    settings = tiny_settings(fixture_files, sliding_window=4, map_points_stride=4, long_run_policy="none")
    frames = [InputFrame(rgb=np.asarray(Image.open(f).convert("RGB")), stamp_ns=10**9 + i * 10**8)
              for i, f in enumerate(files)]
    return settings, frames


def run(settings, frames, odometry=None):
    mapper = mapper_of(settings)
    outputs = []
    for frame in frames:
        if odometry is not None:
            mapper.add_odometry(frame.stamp_ns, odometry[frame.stamp_ns])
        outputs += mapper.process(frame).new
    return mapper, outputs


def test_a_fixed_scale_multiplies_every_metric_output(base):
    settings, frames = base
    plain, plain_out = run(settings, frames[:8])
    # Voxels are metres once the scale is known: twice the scale and twice the voxel size make
    # the same voxels, so the map is exactly twice the plain one.
    scaled, scaled_out = run(dataclasses.replace(settings, scale_source="fixed", scale=2.0,
                                                 map_voxel_size_m=2 * settings.map_voxel_size_m), frames[:8])
    assert not plain.snapshot.scale_known and scaled.snapshot.scale_known and scaled.snapshot.scale == 2.0
    for a, b in zip(plain_out, scaled_out):
        np.testing.assert_allclose(b.camera_pose[:3, 3], 2 * a.camera_pose[:3, 3], rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(b.camera_pose[:3, :3], a.camera_pose[:3, :3], atol=1e-9)
        np.testing.assert_allclose(b.depth.numpy(), 2 * a.depth.numpy(), rtol=1e-6)
        np.testing.assert_allclose(b.points(0.0, 4)[0], 2 * a.points(0.0, 4)[0], rtol=1e-5, atol=1e-6)
    for got, want in zip(scaled.map_points(), plain.map_points()):
        np.testing.assert_array_equal(got, want * (2 if got.dtype == np.float32 else 1))


@pytest.mark.parametrize("scale", [0.5, 2.0, 8.0])
def test_voxels_are_metres_once_the_scale_is_known(base, scale):
    """Regression: the voxel pitch stayed in model units (fixed scale 0.1 / 1 / 10 gave 0.007 /
    0.07 / 0.7 m voxels for map_voxel_size_m 0.05). The map equals a naive one made of the final
    keyframes' map-frame points in voxels of map_voxel_size_m (powers of two: exact floats)."""
    settings, frames = base
    mapper, outputs = run(dataclasses.replace(settings, scale_source="fixed", scale=scale), frames[:8])
    reference = VoxelMap(settings.map_voxel_size_m)
    for output in outputs:
        if output.is_keyframe:
            reference.insert(*output.points(settings.min_confidence, settings.map_points_stride))
    assert len(reference.points()[0]) > 0   # two empty maps would be equal too
    for got, want in zip(mapper.map_points(), reference.points(), strict=True):
        np.testing.assert_array_equal(got, want)


def synthetic_odometry(settings, frames, noise_m: float = 0.001):
    """The robot's odometry: the model's own path, metric (s_true), in an odom frame of its own,
    with ``noise_m`` noise; s_true makes a step ~0.15 m, so pairs close every ~2 keyframes."""
    _, model_run = run(settings, frames)
    centres = np.stack([o.internal_pose[:3, 3] for o in model_run])
    step = np.median(np.linalg.norm(np.diff(centres, axis=0), axis=1))
    s_true = 0.15 / step
    rng = np.random.default_rng(0)
    yaw = 0.7
    rotation = np.array([[np.cos(yaw), -np.sin(yaw), 0], [np.sin(yaw), np.cos(yaw), 0], [0, 0, 1]])
    odometry = {}
    for output, centre in zip(model_run, centres):
        pose = np.eye(4)
        pose[:3, :3] = rotation
        pose[:3, 3] = rotation @ (s_true * centre) + [5.0, -2.0, 0.0] + rng.normal(0, noise_m, 3)
        odometry[output.stamp_ns] = pose
    return odometry, s_true


def test_the_scale_is_estimated_from_odometry_within_two_percent(base):
    settings, frames = base
    odometry, s_true = synthetic_odometry(settings, frames)
    estimated = dataclasses.replace(settings, scale_source="odometry", scale_min_motion_m=0.1, scale_max_spread=0.05)
    mapper, outputs = run(estimated, frames, odometry)
    snapshot = mapper.snapshot
    assert snapshot.scale_known, snapshot.scale_text
    assert abs(snapshot.scale - s_true) / s_true < 0.02, (snapshot.scale, s_true)
    # Before it was known, the outputs were in model units (scale 1); after, in metres.
    first, last = outputs[0], outputs[-1]
    np.testing.assert_allclose(first.camera_pose[:3, 3], first.internal_pose[:3, 3], rtol=1e-12)
    # (the scale of its time: one keyframe before the final estimate)
    np.testing.assert_allclose(last.camera_pose[:3, 3], snapshot.scale * last.internal_pose[:3, 3], rtol=0.005)


@pytest.mark.parametrize("step", [0.0, 0.01])
def test_a_known_scale_moves_the_map_by_bounded_steps_or_not_at_all(base, step):
    """Regression: with slightly inconsistent odometry the whole map rescaled at every keyframe
    once the scale was known. Now it follows the estimate by at most ``scale_update_step`` per
    keyframe, only beyond that much difference, and 0 freezes it at the first known value."""
    settings, frames = base
    odometry, _ = synthetic_odometry(settings, frames, noise_m=0.01)
    estimated = dataclasses.replace(settings, scale_source="odometry", scale_min_motion_m=0.1,
                                    scale_max_spread=0.1, scale_update_step=step)
    mapper, outputs = run(estimated, frames, odometry)
    applied = [o.conversion.metric.scale for o in outputs if o.conversion.metric.known]
    assert applied and mapper.snapshot.scale_known and mapper.snapshot.scale == applied[-1]
    ratios = np.array(applied[1:]) / np.array(applied[:-1])
    assert np.all(np.abs(np.log(ratios)) <= np.log1p(step) + 1e-12), ratios
    # This odometry moves the estimate beyond 1% after it is known: followed in a bounded step,
    # or not at all when frozen.
    assert len(set(applied)) == (1 if step == 0.0 else 2), applied


def test_applied_scale_takes_the_first_estimate_then_follows_in_bounded_steps():
    known = MetricScale(known=True, scale=2.0, spread=0.01, pairs=10, reason="")
    unknown = MetricScale(known=False, scale=1.0, spread=float("inf"), pairs=3, reason="collecting pairs")
    assert applied_scale(unknown, known, 0.01) is known                      # the first known estimate
    assert applied_scale(known, dataclasses.replace(known, scale=2.015), 0.01) is known   # within the step
    moved = applied_scale(known, dataclasses.replace(known, scale=3.0, spread=0.02), 0.01)
    assert moved.known and moved.scale == pytest.approx(2.02) and moved.spread == 0.02
    assert applied_scale(known, dataclasses.replace(known, scale=1.0), 0.01).scale == pytest.approx(2.0 / 1.01)
    assert applied_scale(known, dataclasses.replace(known, scale=3.0), 0.0) is known     # frozen
    assert applied_scale(known, unknown, 0.01) is known                      # a lost estimate keeps it


def test_until_odometry_arrives_the_status_says_why(base):
    settings, frames = base
    mapper, _ = run(dataclasses.replace(settings, scale_source="odometry"), frames[:6])
    assert not mapper.snapshot.scale_known and "waiting for odometry" in mapper.snapshot.scale_text


def test_a_restart_that_keeps_the_map_keeps_each_stream_at_its_own_scale(base):
    """Regression: a restart that keeps the map (an image size change) between two odometry
    scales wrote the first stream at the second's scale (x2.63 right after the restart). Each
    stream is converted into map once, at its own scale, when it ends."""
    settings, frames = base
    _, model_run = run(settings, frames)
    centres = np.stack([o.internal_pose[:3, 3] for o in model_run])
    s_true = 0.15 / np.median(np.linalg.norm(np.diff(centres, axis=0), axis=1))
    odometry = {}
    for output, centre in zip(model_run, centres):
        pose = np.eye(4)
        pose[:3, 3] = s_true * centre
        odometry[output.stamp_ns] = pose
    estimated = dataclasses.replace(settings, scale_source="odometry", scale_min_motion_m=0.1, scale_max_spread=0.05)
    mapper, _ = run(estimated, frames, odometry)
    assert mapper.snapshot.scale_known and abs(mapper.snapshot.scale / s_true - 1) < 0.02
    xyz, rgb = mapper.map_points()
    trajectory = mapper.saved_trajectory()
    smaller = frames[-1].rgb[::2, ::2].copy()
    outcome = mapper.process(InputFrame(rgb=smaller, stamp_ns=frames[-1].stamp_ns + 10**8))
    assert "image size changed" in outcome.notices[0].text and not mapper.snapshot.scale_known
    after_xyz, after_rgb = mapper.map_points()
    np.testing.assert_array_equal(after_xyz, xyz)
    np.testing.assert_array_equal(after_rgb, rgb)
    np.testing.assert_array_equal(mapper.saved_trajectory().poses(), trajectory.poses())
