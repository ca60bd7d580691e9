"""The map database's stored values: numpy arrays as .npy / .npz blobs, raw float64 poses and the
scalar columns, read back checked (type, shape, finite, in range), a damaged record refused with a
MapDatabaseError or a ValueError that names it. SQLite keeps any value in any column, so a
column's type is checked too, not only its blobs.
"""
from __future__ import annotations

import io
import zipfile

import numpy as np


# A stored coordinate (pose, mount, origin, window translation) or scale beyond it is damaged:
# no robot maps that far, and the conversions' products (scale up to 1e6, a mount, a window's
# similarity) stay finite, even as float32.
MAX_MAGNITUDE = 1e9


class MapDatabaseError(Exception):
    """The database cannot be used (held by another process, read-only, corrupt, newer schema,
    disk full); the text says which, for status and diagnostics."""


# What numpy raises on bytes that are not the .npy / .npz it wrote (a damaged record).
_UNREADABLE = (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile)


def array_blob(array: np.ndarray) -> bytes:
    """An array as .npy bytes (dtype and shape kept exactly)."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def blob_array(blob: bytes) -> np.ndarray:
    try:
        return np.load(io.BytesIO(blob), allow_pickle=False)
    except _UNREADABLE as error:
        raise MapDatabaseError(f"a stored record cannot be read ({type(error).__name__}: {error})") from None


def arrays_blob(arrays: dict) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def blob_arrays(blob: bytes) -> dict:
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except _UNREADABLE as error:
        raise MapDatabaseError(f"a stored record cannot be read ({type(error).__name__}: {error})") from None


def checked_array(blob: bytes, shape: tuple, what: str, bound: float | None = None) -> np.ndarray:
    """A stored float array of ``shape`` (-1: any length), finite (and within +-``bound``);
    ValueError naming ``what``."""
    array = blob_array(blob) if isinstance(blob, bytes) else np.asarray(blob)
    if array.ndim != len(shape) or any(want not in (-1, got) for want, got in zip(shape, array.shape)):
        raise ValueError(f"{what} has shape {array.shape}, not {shape}")
    if not np.issubdtype(array.dtype, np.number) or not np.isfinite(array).all():
        raise ValueError(f"{what} holds non-finite values" if np.issubdtype(array.dtype, np.number)
                         else f"{what} is of type {array.dtype}, not numbers")
    if bound is not None and array.size and np.abs(array).max() > bound:
        raise ValueError(f"{what} holds values beyond +-{bound:g} (largest {np.abs(array).max():.3g})")
    return array


def pose_matrix(blob: bytes, what: str = "pose") -> np.ndarray:
    """A stored [4, 4] float64 pose (raw bytes), finite, within MAX_MAGNITUDE; ValueError naming ``what``."""
    if not isinstance(blob, bytes) or len(blob) != 128:
        raise ValueError(f"{what} of {len(blob) if isinstance(blob, bytes) else type(blob).__name__} bytes, "
                         "not 16 float64")
    return checked_array(np.frombuffer(blob, np.float64).reshape(4, 4), (4, 4), what, MAX_MAGNITUDE)


def integer(value, what: str) -> int:
    """A stored integer column (an index, a stamp, a count); ValueError naming ``what``."""
    if type(value) is not int:
        raise ValueError(f"{what} {value!r} is not an integer")
    return value


def scale_value(value, what: str = "scale") -> float:
    """A stored scale (metres per model unit, a window's similarity): a number in
    [1 / MAX_MAGNITUDE, MAX_MAGNITUDE]; ValueError naming ``what``."""
    if type(value) not in (int, float) or not 1 / MAX_MAGNITUDE <= value <= MAX_MAGNITUDE:
        raise ValueError(f"{what} {value!r} is not a positive number up to {MAX_MAGNITUDE:g}")
    return float(value)


def voxel_map_blob(voxel_map) -> bytes:
    """A voxel map's state and pitch (a map checkpoint, an ended stream's map)."""
    return arrays_blob(dict(voxel_map.state(), voxel_size_m=np.float64(voxel_map.voxel_size_m)))


def poses_blob(trajectory) -> bytes:
    """A trajectory's keys, stamps and poses (an ended stream's, in map)."""
    entries = list(trajectory)
    return arrays_blob({"keys": np.array([e.key for e in entries], np.int64).reshape(-1),
                        "stamps_ns": np.array([e.stamp_ns for e in entries], np.int64).reshape(-1),
                        "poses": np.array([e.pose for e in entries], np.float64).reshape(-1, 4, 4)})
