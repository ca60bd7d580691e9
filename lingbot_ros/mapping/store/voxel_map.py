"""A coloured point map downsampled to one point per voxel, with bounded memory."""
from __future__ import annotations

import numpy as np

# Voxel indices are packed into one int64 key, 21 bits per axis (biased to be non-negative), so
# that looking a batch up in the map is a searchsorted on one flat sorted array.
_AXIS_BITS = 21
_AXIS_BIAS = 1 << (_AXIS_BITS - 1)
# Multiplier of a multiplicative hash (2^64 / golden ratio): scatters neighbouring keys, so that
# ties in the drop order fall on a spatially even subset.
_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


class VoxelRangeError(ValueError):
    """A point lies further from the origin than the packed voxel index can represent."""


class VoxelMap:
    """Accumulates coloured points; keeps one point per cubic voxel of side ``voxel_size_m``.

    Each occupied voxel holds the running mean of the positions and of the colours of every
    point that fell into it, and how many points that was.

    Bounded memory: with ``max_points`` set, an insert that would create more voxels than fit
    first removes the voxels updated least recently (a sixteenth of ``max_points`` more than it
    needs, so that a full map pays for the drop once per many inserts) (recency counts inserts, so a region the
    camera sees again stays); voxels updated by the insert itself are never removed for its new
    ones. If the new voxels of a single insert still do not fit, only a subset of them is added.
    Ties (voxels of the same recency, or the new voxels of one insert) are broken by a hash of
    the voxel index, so what survives is spread evenly over space rather than one corner of it.

    Storage: about 56 bytes per voxel, in rows that removed voxels free for new ones, so memory
    stays at ``max_points`` rows. An insert costs O(batch log batch + M) with small constants
    (the O(M) parts are 1-D copies of the sorted key index), not a re-sort of the map.

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
        """Forget every point and release the storage."""
        # Index of the occupied voxels, sorted by key: [M] each.
        self._sorted_keys = np.empty(0, np.int64)
        self._sorted_rows = np.empty(0, np.int64)    # storage row of each sorted key
        # Storage rows [capacity]; rows below _num_rows are occupied or listed in _free_rows.
        self._mean_xyz = np.empty((0, 3), np.float32)  # metres (model units)
        self._mean_rgb = np.empty((0, 3), np.float32)  # 0..255
        self._count = np.empty(0, np.int64)            # points merged into the voxel
        self._last_insert = np.empty(0, np.int64)      # number of the insert that last updated it
        self._free_rows = np.empty(0, np.int64)
        self._num_rows = 0
        self._num_inserts = 0

    def copy(self) -> "VoxelMap":
        """An independent map with the same voxels (inserts into one do not reach the other)."""
        other = VoxelMap(self.voxel_size_m, self.max_points)
        for name, value in vars(self).items():
            setattr(other, name, value.copy() if isinstance(value, np.ndarray) else value)
        return other

    def resampled(self, voxel_size_m: float) -> "VoxelMap":
        """A new map of the same bound at pitch ``voxel_size_m`` holding these points."""
        other = VoxelMap(voxel_size_m, self.max_points)
        if len(self):
            other.insert(*self.points())
        return other

    def __len__(self) -> int:
        return len(self._sorted_keys)

    # Everything an insert reads or changes: state() and from_state() store and restore a map exactly.
    _STATE = ("_sorted_keys", "_sorted_rows", "_mean_xyz", "_mean_rgb", "_count", "_last_insert", "_free_rows",
              "_num_rows", "_num_inserts")

    def state(self) -> dict[str, np.ndarray]:
        """The map's arrays and counters (for the map database's checkpoints)."""
        return {name: np.asarray(getattr(self, name)) for name in self._STATE}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Become the map ``state()`` described (same voxel size and bound assumed)."""
        for name in self._STATE:
            value = state[name]
            setattr(self, name, int(value) if value.ndim == 0 else value.copy())

    def nbytes(self) -> int:
        """Bytes of numpy storage held (grows until ``max_points`` rows, then stays)."""
        arrays = (self._sorted_keys, self._sorted_rows, self._mean_xyz,
                  self._mean_rgb, self._count, self._last_insert, self._free_rows)
        return sum(a.nbytes for a in arrays)

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

        # Reduce the batch to one entry per voxel: [K] sorted unique keys and their sums.
        keys = self._pack(np.floor(points_xyz / self.voxel_size_m).astype(np.int64))
        batch_keys, batch_of_point = np.unique(keys, return_inverse=True)
        batch_sum_xyz = _sum_rows(batch_of_point, points_xyz, len(batch_keys))
        batch_sum_rgb = _sum_rows(batch_of_point, colors, len(batch_keys))
        batch_count = np.bincount(batch_of_point, minlength=len(batch_keys))

        # Voxels already in the map: update their running means in place.
        at = np.searchsorted(self._sorted_keys, batch_keys)
        exists = at < len(self._sorted_keys)
        exists[exists] = self._sorted_keys[at[exists]] == batch_keys[exists]
        self._merge(self._sorted_rows[at[exists]], batch_sum_xyz[exists], batch_sum_rgb[exists],
                    batch_count[exists])

        new = ~exists
        new_keys, new_count = batch_keys[new], batch_count[new]
        new_sum_xyz, new_sum_rgb = batch_sum_xyz[new], batch_sum_rgb[new]
        if self.max_points is not None and len(self) + len(new_keys) > self.max_points:
            overflow = len(self) + len(new_keys) - self.max_points
            untouched = len(self) - int(exists.sum())
            # Dropping costs a pass over the map: a full map drops a sixteenth more than needed at
            # once, so that the next inserts fit without one (amortised, not once per insert).
            self._drop_least_recent(min(overflow + self.max_points // 16, untouched))
            excess = overflow - min(overflow, untouched)
            if excess > 0:  # this insert alone brings too many: keep a spread subset of them
                keep = np.sort(np.argpartition(_scatter(new_keys), excess - 1)[excess:])
                new_keys, new_count = new_keys[keep], new_count[keep]
                new_sum_xyz, new_sum_rgb = new_sum_xyz[keep], new_sum_rgb[keep]
        self._add(new_keys, new_sum_xyz, new_sum_rgb, new_count)

    def points(self, every: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(xyz float32 [M, 3] in metres, rgb uint8 [M, 3])``, one point per voxel;
        ``every``: only every such voxel in key order (an even sample, at the sample's cost)."""
        rows = self._sorted_rows[::every]
        if every > 1:   # gathered in storage order: a sample's rows are scattered, a sort is cheaper than the misses
            rows = np.sort(rows)
        rgb = np.clip(np.round(self._mean_rgb[rows]), 0, 255).astype(np.uint8)
        return self._mean_xyz[rows].copy(), rgb

    def _merge(self, rows, sum_xyz, sum_rgb, count) -> None:
        """Fold batch sums into existing rows (``rows`` unique): mean += (sum - n*mean) / total."""
        total = self._count[rows] + count
        for mean, batch_sum in ((self._mean_xyz, sum_xyz), (self._mean_rgb, sum_rgb)):
            old = mean[rows].astype(np.float64)
            mean[rows] = old + (batch_sum - count[:, None] * old) / total[:, None]
        self._count[rows] = total
        self._last_insert[rows] = self._num_inserts

    def _add(self, keys, sum_xyz, sum_rgb, count) -> None:
        """Store new voxels (``keys`` sorted, none in the map yet)."""
        rows = self._allocate_rows(len(keys))
        self._mean_xyz[rows] = sum_xyz / count[:, None]
        self._mean_rgb[rows] = sum_rgb / count[:, None]
        self._count[rows] = count
        self._last_insert[rows] = self._num_inserts
        at = np.searchsorted(self._sorted_keys, keys)
        self._sorted_keys = np.insert(self._sorted_keys, at, keys)
        self._sorted_rows = np.insert(self._sorted_rows, at, rows)

    def _drop_least_recent(self, num_drop: int) -> None:
        if num_drop <= 0:
            return
        rows = self._sorted_rows
        # One int64 order key: recency in the high 32 bits, the key's hash in the low 32.
        order_key = (self._last_insert[rows] << 32) | (_scatter(self._sorted_keys) >> 32)
        if num_drop < len(rows):
            drop_at = np.argpartition(order_key, num_drop - 1)[:num_drop]
        else:
            drop_at = np.arange(len(rows))
        self._free_rows = np.concatenate([self._free_rows, rows[drop_at]])
        self._count[rows[drop_at]] = 0
        self._sorted_keys = np.delete(self._sorted_keys, drop_at)
        self._sorted_rows = np.delete(self._sorted_rows, drop_at)

    def _allocate_rows(self, num_rows: int) -> np.ndarray:
        """``[num_rows]`` storage rows: freed rows first, then fresh ones (storage doubles)."""
        reused = self._free_rows[:num_rows]
        self._free_rows = self._free_rows[num_rows:]
        fresh = num_rows - len(reused)
        needed = self._num_rows + fresh
        if needed > len(self._count):
            capacity = max(needed, 2 * len(self._count))
            if self.max_points is not None:
                capacity = max(needed, min(capacity, self.max_points))
            grow = capacity - len(self._count)
            self._mean_xyz = np.concatenate([self._mean_xyz, np.zeros((grow, 3), np.float32)])
            self._mean_rgb = np.concatenate([self._mean_rgb, np.zeros((grow, 3), np.float32)])
            self._count = np.concatenate([self._count, np.zeros(grow, np.int64)])
            self._last_insert = np.concatenate([self._last_insert, np.zeros(grow, np.int64)])
        rows = np.concatenate([reused, np.arange(self._num_rows, needed)])
        self._num_rows = needed
        return rows

    @staticmethod
    def _pack(index_ijk: np.ndarray) -> np.ndarray:
        """``[N, 3]`` int64 voxel indices -> ``[N]`` int64 keys (order-preserving per axis)."""
        if len(index_ijk) and (index_ijk.min() < -_AXIS_BIAS or index_ijk.max() >= _AXIS_BIAS):
            raise VoxelRangeError(
                f"voxel index out of range +-{_AXIS_BIAS} (|index| up to "
                f"{int(np.abs(index_ijk).max())}); increase voxel_size_m or drop outlier points")
        biased = index_ijk + _AXIS_BIAS
        return (biased[:, 0] << (2 * _AXIS_BITS)) | (biased[:, 1] << _AXIS_BITS) | biased[:, 2]


def _scatter(keys: np.ndarray) -> np.ndarray:
    """Hash of packed keys as non-negative int64 (the top 63 bits of a multiplicative hash)."""
    return ((keys.view(np.uint64) * _HASH_MULTIPLIER) >> np.uint64(1)).view(np.int64)


def _sum_rows(group: np.ndarray, values: np.ndarray, num_groups: int) -> np.ndarray:
    """Per-group column sums: ``[N]`` group ids, ``[N, C]`` values -> ``[num_groups, C]``."""
    return np.stack([np.bincount(group, weights=values[:, c], minlength=num_groups)
                     for c in range(values.shape[1])], axis=1)
