"""mapping/store/map_builder.py: inserts staged until released, then applied in order off the caller's thread."""
import numpy as np

from lingbot_ros.mapping.store.map_builder import MapBuilder
from lingbot_ros.mapping.store.voxel_map import VoxelMap


def cloud(seed, n=50):
    rng = np.random.default_rng(seed)
    return rng.random((n, 3), dtype=np.float32), rng.integers(0, 255, (n, 3), dtype=np.uint8)


def test_staged_inserts_wait_for_release_and_equal_synchronous_inserts():
    builder, reference = MapBuilder(VoxelMap(0.05, 10_000)), VoxelMap(0.05, 10_000)
    clouds = [cloud(seed) for seed in range(4)]
    builder.insert(*clouds[0])
    builder.insert(*clouds[1])
    builder._queue.join()
    assert len(builder) == 0                  # staged: the thread has nothing yet
    builder.release()
    builder._queue.join()
    assert len(builder) > 0
    builder.insert(*clouds[2])
    builder.insert(*clouds[3])
    for xyz, rgb in clouds:
        reference.insert(xyz, rgb)
    got = builder.map                         # a read releases what is staged and waits
    for a, b in zip(got.points(), reference.points()):
        np.testing.assert_array_equal(a, b)
    builder.close()


def test_close_applies_what_is_staged():
    builder = MapBuilder(VoxelMap(0.05, 10_000))
    builder.insert(*cloud(7))
    builder.close()
    assert len(builder) > 0
