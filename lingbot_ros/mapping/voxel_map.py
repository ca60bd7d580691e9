"""A coloured point map downsampled to one point per voxel, with bounded memory."""
from __future__ import annotations

import numpy as np

# Voxel indices are packed into one int64 key, 21 bits per axis (biased to be non-negative), so
# that merging a batch into the map is a sort + searchsorted on a flat array.
_AXIS_BITS = 21
_AXIS_BIAS = 1 << (_AXIS_BITS - 1)
# Multiplier of a multiplicative hash (2^64 / golden ratio): scatters neighbouring keys, used to
# drop a spatially even subset when one insert alone would overflow max_points.
_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


class VoxelRangeError(ValueError):
    """A point lies further from the origin than the packed voxel index can represent."""


class VoxelMap:
    """Accumulates coloured points; keeps one point per cubic voxel of side ``voxel_size_m``.

    Each occupied voxel stores the running mean of the positions and of the colours of every
    point that fell into it. Memory is about 72 bytes per occupied voxel.

    Bounded memory: with ``max_points`` set, after each :meth:`insert` the voxels that were
    updated least recently are dropped until at most ``max_points`` remain (recency counts
    inserts, so a region the camera sees again stays). Voxels last updated by the same insert
    are ordered by a hash of their index, so if a single insert alone overflows the budget a
    spatially even subset of it survives rather than one corner.

    Voxel indices must lie within +-2^20 per axis (about +-52 km at 5 cm voxels).
    """

    def __init__(self, voxel_size_m: float, max_points: int | None = None):
        if not voxel_size_m > 0:
            raise ValueError(f"voxel_size_m must be > 0, got {voxel_size_m}")
        if max_points is not None and max_points < 1:
            raise ValueError(f"max_points must be >= 1 or None, got {max_points}")
        self.voxel_size_m = float(voxel_size_m)
        self.max_points = max_points
        self.clear()

    def clear(self) -> None:
        """Forget every point."""
        self._keys = np.empty(0, np.int64)              # [M] packed voxel index, sorted ascending
        self._sum_xyz = np.empty((0, 3), np.float64)    # [M, 3] sum of positions (m)
        self._sum_rgb = np.empty((0, 3), np.float64)    # [M, 3] sum of colours (0..255)
        self._count = np.empty(0, np.int64)             # [M] points merged into the voxel
        self._last_insert = np.empty(0, np.int64)       # [M] insert number of the last update
        self._num_inserts = 0

    def __len__(self) -> int:
        return len(self._keys)

    def insert(self, points_xyz: np.ndarray, colors_rgb_uint8: np.ndarray) -> None:
        """Merge points into the map.

        Args:
            points_xyz: ``[N, 3]`` world positions in metres (model units). Points with a
                non-finite coordinate are skipped.
            colors_rgb_uint8: ``[N, 3]`` uint8 RGB.

        Raises:
            VoxelRangeError: a point's voxel index does not fit; increase ``voxel_size_m`` or
                filter the outliers (e.g. with a confidence threshold) before inserting.
        """
        points_xyz = np.asarray(points_xyz, dtype=np.float64)
        colors = np.asarray(colors_rgb_uint8)
        if points_xyz.ndim != 2 or points_xyz.shape[1] != 3:
            raise ValueError(f"points_xyz must be [N, 3], got shape {points_xyz.shape}")
        if colors.shape != points_xyz.shape or colors.dtype != np.uint8:
            raise ValueError(f"colors_rgb_uint8 must be uint8 {points_xyz.shape}, "
                             f"got {colors.dtype} {colors.shape}")
        finite = np.isfinite(points_xyz).all(axis=1)
        points_xyz, colors = points_xyz[finite], colors[finite].astype(np.float64)
        self._num_inserts += 1
        if len(points_xyz) == 0:
            return

        # Reduce the batch to one entry per voxel first: [K] unique keys and their sums.
        keys = self._pack(np.floor(points_xyz / self.voxel_size_m).astype(np.int64))
        batch_keys, batch_of_point = np.unique(keys, return_inverse=True)
        batch_sum_xyz = _sum_rows(batch_of_point, points_xyz, len(batch_keys))
        batch_sum_rgb = _sum_rows(batch_of_point, colors, len(batch_keys))
        batch_count = np.bincount(batch_of_point, minlength=len(batch_keys))

        # Voxels already in the map: add in place.
        slot = np.searchsorted(self._keys, batch_keys)
        exists = slot < len(self._keys)
        exists[exists] = self._keys[slot[exists]] == batch_keys[exists]
        old = slot[exists]
        self._sum_xyz[old] += batch_sum_xyz[exists]
        self._sum_rgb[old] += batch_sum_rgb[exists]
        self._count[old] += batch_count[exists]
        self._last_insert[old] = self._num_inserts

        # New voxels: insert at their sorted position (np.insert keeps the keys sorted because
        # the new keys are sorted and `slot` is where each belongs in the old array).
        new, at = ~exists, slot[~exists]
        self._keys = np.insert(self._keys, at, batch_keys[new])
        self._sum_xyz = np.insert(self._sum_xyz, at, batch_sum_xyz[new], axis=0)
        self._sum_rgb = np.insert(self._sum_rgb, at, batch_sum_rgb[new], axis=0)
        self._count = np.insert(self._count, at, batch_count[new])
        self._last_insert = np.insert(self._last_insert, at, self._num_inserts)

        if self.max_points is not None and len(self._keys) > self.max_points:
            self._drop_least_recent(len(self._keys) - self.max_points)

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(xyz float32 [M, 3] in metres, rgb uint8 [M, 3])``, one point per voxel."""
        count = self._count[:, None]
        xyz = (self._sum_xyz / count).astype(np.float32)
        rgb = np.clip(np.round(self._sum_rgb / count), 0, 255).astype(np.uint8)
        return xyz, rgb

    def _drop_least_recent(self, num_drop: int) -> None:
        scatter = self._keys.view(np.uint64) * _HASH_MULTIPLIER   # wraps mod 2^64 on purpose
        order = np.lexsort((scatter, self._last_insert))          # last key is the primary one
        keep = np.ones(len(self._keys), bool)
        keep[order[:num_drop]] = False
        self._keys, self._count = self._keys[keep], self._count[keep]
        self._sum_xyz, self._sum_rgb = self._sum_xyz[keep], self._sum_rgb[keep]
        self._last_insert = self._last_insert[keep]

    @staticmethod
    def _pack(index_ijk: np.ndarray) -> np.ndarray:
        """``[N, 3]`` int64 voxel indices -> ``[N]`` int64 keys (order-preserving per axis)."""
        if len(index_ijk) and (index_ijk.min() < -_AXIS_BIAS or index_ijk.max() >= _AXIS_BIAS):
            raise VoxelRangeError(
                f"voxel index out of range +-{_AXIS_BIAS} (|index| up to "
                f"{int(np.abs(index_ijk).max())}); increase voxel_size_m or drop outlier points")
        biased = index_ijk + _AXIS_BIAS
        return (biased[:, 0] << (2 * _AXIS_BITS)) | (biased[:, 1] << _AXIS_BITS) | biased[:, 2]


def _sum_rows(group: np.ndarray, values: np.ndarray, num_groups: int) -> np.ndarray:
    """Per-group column sums: ``[N]`` group ids, ``[N, C]`` values -> ``[num_groups, C]``."""
    return np.stack([np.bincount(group, weights=values[:, c], minlength=num_groups)
                     for c in range(values.shape[1])], axis=1)
