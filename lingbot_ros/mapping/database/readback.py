"""A stored run back as what ``Mapper.save`` writes: the map in ``map``, the base trajectory, the windows.

The stored map is replayed from its checkpoint and inserts into a VoxelMap of the run's voxel
pitch and bound, and the conversion into ``map`` is the run's last (its metric scale, camera mount
and origins) as a frames.MapConversion, the one conversion the Mapper uses; so a run that ended
cleanly exports byte for byte what a save at its end wrote.

A run stored by an older version may lack a setting added since (``camera_mount``, say): the
setting's default stands in (``setting``) and ``defaulted`` names those, for the tools to say so.
"""
from __future__ import annotations

import dataclasses
import math
import sqlite3

import numpy as np
import torch

from ..files.colmap import KeyframeImage
from ..windows.live import WindowRecord
from .run_info import RunInfo
from .blobs import MAX_MAGNITUDE, MapDatabaseError
from .blobs import blob_array, blob_arrays, checked_array, integer, pose_matrix, scale_value
from ...io.compressed_image import decode_compressed
from ..placement.conversion import MapConversion
from ..placement.geometry import rigid_inverse
from ..placement.metric_scale import MetricScale
from ..placement.geometry import parse_mount
from ..settings import MapperSettings
from ..windows.similarity import Similarity
from ..store.trajectory import Trajectory
from ..store.voxel_map import VoxelMap, VoxelRangeError


# The stored settings read back here, each with the default a run that lacks it is read with.
_READ = ("camera_mount", "map_voxel_size_m", "max_map_points", "max_trajectory_poses", "long_run_policy")
_DEFAULTS = {field.name: field.default for field in dataclasses.fields(MapperSettings) if field.name in _READ}


def setting(info: RunInfo, name: str):
    """A stored setting of the run, or its default where the run did not store it."""
    return info.settings.get(name, _DEFAULTS[name])


def defaulted(info: RunInfo) -> list[str]:
    """The settings read back that the run did not store (their defaults are used)."""
    return [name for name in _READ if name not in info.settings]


@dataclasses.dataclass
class StoredRun:
    info: RunInfo
    xyz: np.ndarray                 # [N, 3] float32 in map
    rgb: np.ndarray                 # [N, 3] uint8
    trajectory: Trajectory          # T_map_base per frame, in order
    windows: list[WindowRecord] | None   # None: not a windowed run (no windows.csv)
    camera_positions: np.ndarray    # [F, 3] camera centres in map (for the preview)


def conversion(info: RunInfo) -> MapConversion:
    """The run's last conversion into map."""
    mount = info.mount if info.mount is not None else parse_mount(setting(info, "camera_mount"))
    origins = info.origins if info.origins is not None else np.zeros(6)
    metric = MetricScale(info.scale_known, float(info.scale), 0.0, 0, "")
    return MapConversion(metric, rigid_inverse(mount), origins[:3].copy(), origins[3:].copy(),
                         estimated=info.settings.get("scale_source") == "odometry")


def _refuse(refused: list | None, text: str) -> None:
    """A damaged record: told in ``refused`` and skipped by the caller, or (None) raised."""
    if refused is None:
        raise MapDatabaseError(text)
    refused.append(text)


def read_record(refused: list | None, record: str, read):
    """``read()``, or None where the record is damaged (``_refuse``)."""
    try:
        return read()
    except _DAMAGED as error:
        _refuse(refused, f"{record}: {error}")
        return None


# What reading a damaged record raises (a blob of another size or shape, non-finite values, a
# voxel map state that does not hold together, points beyond the voxel index's range).
_DAMAGED = (MapDatabaseError, ValueError, KeyError, IndexError, TypeError)


def _points(xyz_blob, rgb_blob) -> tuple[np.ndarray, np.ndarray]:
    xyz, rgb = blob_array(xyz_blob), blob_array(rgb_blob)
    if xyz.ndim != 2 or xyz.shape[1:] != (3,) or not np.issubdtype(xyz.dtype, np.floating):
        raise ValueError(f"points of shape {xyz.shape} and type {xyz.dtype}, not [N, 3] floats")
    if rgb.shape != xyz.shape or rgb.dtype != np.uint8:
        raise ValueError(f"colours of shape {rgb.shape} and type {rgb.dtype}, not [{len(xyz)}, 3] uint8")
    if not np.isfinite(xyz).all():
        raise ValueError("non-finite points")
    return xyz, rgb


def _insert(voxel_map: VoxelMap, points) -> VoxelMap:
    try:
        with np.errstate(invalid="ignore", over="ignore"):
            voxel_map.insert(*points)
    except VoxelRangeError as error:
        raise ValueError(f"points beyond the map's range ({error})") from None
    return voxel_map


def _restored(state: dict, voxel_size: float, max_points: int) -> VoxelMap:
    """A voxel map from a stored state, checked: its points come out and are finite."""
    voxel_map = VoxelMap(float(checked_array(state["voxel_size_m"], (), "voxel size")) if "voxel_size_m" in state
                         else voxel_size, max_points)
    voxel_map.restore(state)
    checked_array(voxel_map.points()[0], (-1, 3), "map state")
    return voxel_map


def replay_voxel_map(conn: sqlite3.Connection, run: int, voxel_size: float, max_points: int,
                     provisional_as_final: bool = False, refused: list | None = None,
                     beyond: list | None = None) -> tuple[VoxelMap, list]:
    """The run's voxel map from its checkpoint and later inserts, and its provisional points
    (``provisional_as_final``: merged like the others, as a resumed run takes them). A damaged
    record is skipped and told in ``refused`` (None: MapDatabaseError). An insert beyond the voxel
    index's range is skipped as the live map skipped it, and told in ``beyond`` if given."""
    voxel_map = VoxelMap(voxel_size, max_points)
    row = conn.execute("SELECT upto_seq, state FROM map_checkpoints WHERE run = ?", (run,)).fetchone()
    upto = 0
    if row is not None:
        upto = row[0]
        # The pitch the map had then (metres once the scale was known) is in the state.
        restored = read_record(refused, f"run {run}: map checkpoint", lambda: _restored(blob_arrays(row[1]), voxel_size,
                                                                                   max_points))
        voxel_map = restored if restored is not None else voxel_map
    provisional = []
    for seq, xyz, rgb, is_provisional in conn.execute(
            "SELECT seq, xyz, rgb, provisional FROM map_inserts WHERE run = ? AND (seq > ? OR provisional = 1) "
            "ORDER BY seq", (run, upto)):
        points = read_record(refused, f"run {run}: map insert {seq}", lambda: _points(xyz, rgb))
        if points is None:
            continue
        if is_provisional and not provisional_as_final:
            provisional.append(points)
            continue
        try:
            with np.errstate(invalid="ignore", over="ignore"):   # what VoxelRangeError then says
                voxel_map.insert(*points)
        except VoxelRangeError as error:   # the live map raised on this insert and went on the same way
            if beyond is not None:
                beyond.append(f"run {run}: map insert {seq}: points beyond the map's range ({error})")
    return voxel_map, provisional


def replay_map(conn: sqlite3.Connection, info: RunInfo, refused: list | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The run's map (internal frame), provisional points included as ``Mapper.map_points`` does."""
    voxel_map, provisional = replay_voxel_map(conn, info.id, setting(info, "map_voxel_size_m"),
                                              setting(info, "max_map_points"), refused=refused, beyond=refused)
    if provisional:
        voxel_map = voxel_map.copy()
        for points in provisional:
            read_record(refused, f"run {info.id}: provisional map insert", lambda: _insert(voxel_map, points))
    return voxel_map.points()


def _finished(state: dict, poses: dict, max_points: int, max_poses: int) -> tuple[VoxelMap, Trajectory]:
    voxel_map = _restored(state, 0.0, max_points)
    keys, stamps = poses["keys"], poses["stamps_ns"]
    if not (np.issubdtype(keys.dtype, np.integer) and np.issubdtype(stamps.dtype, np.integer)):
        raise ValueError(f"keys of type {keys.dtype} and stamps of type {stamps.dtype}, not integers")
    matrices = checked_array(poses["poses"], (len(keys), 4, 4), "poses", MAX_MAGNITUDE)
    if stamps.shape != keys.shape:
        raise ValueError(f"{len(stamps)} stamps for {len(keys)} poses")
    trajectory = Trajectory(max_poses)
    for key, stamp_ns, pose in zip(keys.tolist(), stamps.tolist(), matrices):
        trajectory.append(stamp_ns, pose, key=key)
    return voxel_map, trajectory


def load_finished(conn: sqlite3.Connection, run: int, max_points: int, max_poses: int,
                  refused: list | None = None) -> tuple[VoxelMap, Trajectory] | None:
    """The run's finished part (scale_source odometry: streams ended by a restart that kept the
    map), in map, as MapStore holds it; None if it has none (or it is damaged: ``refused``)."""
    row = conn.execute("SELECT map_state, poses FROM finished_streams WHERE run = ?", (run,)).fetchone()
    if row is None:
        return None
    return read_record(refused, f"run {run}: finished streams",
                 lambda: _finished(blob_arrays(row[0]), blob_arrays(row[1]), max_points, max_poses))


def stored_poses(conn: sqlite3.Connection, run: int, refused: list | None = None) -> list[tuple[int, int, np.ndarray]]:
    """The run's frames as (index, stamp_ns, T_I_camera), in order; a damaged pose is skipped (``refused``)."""
    out = []
    for index, stamp_ns, blob in conn.execute("SELECT idx, stamp_ns, pose FROM frames WHERE run = ? ORDER BY idx",
                                              (run,)):
        frame = read_record(refused, f"run {run}: frame {index}", lambda: (
            integer(index, "index"), integer(stamp_ns, "stamp"), pose_matrix(blob)))
        if frame is not None:
            out.append(frame)
    return out


def _window(row) -> WindowRecord:
    window, first, scale, rotation, translation, error = row
    if not isinstance(rotation, bytes) or not isinstance(translation, bytes) or len(rotation) != 72 \
            or len(translation) != 24:
        raise ValueError("rotation or translation of another size than 9 and 3 float64")
    if error is not None and type(error) not in (int, float):   # NaN (no overlap) is stored as NULL
        raise ValueError(f"overlap error {error!r} is not a number")
    similarity = Similarity(torch.tensor(scale_value(scale), dtype=torch.float64),
                            torch.from_numpy(checked_array(np.frombuffer(rotation, np.float64), (9,), "rotation",
                                                           MAX_MAGNITUDE).reshape(3, 3).copy()),
                            torch.from_numpy(checked_array(np.frombuffer(translation, np.float64), (3,),
                                                           "translation", MAX_MAGNITUDE).copy()))
    return WindowRecord(integer(window, "window"), integer(first, "first index"), similarity,
                        float("nan") if error is None else float(error))


def stored_windows(conn: sqlite3.Connection, run: int, refused: list | None = None) -> list[WindowRecord]:
    out = []
    for seq, *row in conn.execute("SELECT seq, window, first_index, scale, rotation, translation, overlap_error "
                                  "FROM windows WHERE run = ? ORDER BY seq", (run,)):
        record = read_record(refused, f"run {run}: window record {seq}", lambda: _window(row))
        if record is not None:
            out.append(record)
    return out


def check_settings(info: RunInfo) -> None:
    """The run's own records (settings, conversion) and the stored settings read back: usable, or
    MapDatabaseError naming the first that is not (the run cannot be read without them)."""
    if info.damaged:
        raise MapDatabaseError("; ".join(info.damaged))
    for name, ok in (("map_voxel_size_m", lambda v: isinstance(v, (int, float)) and math.isfinite(v) and v > 0),
                     ("max_map_points", lambda v: isinstance(v, int) and v > 0),
                     ("max_trajectory_poses", lambda v: isinstance(v, int) and v > 0),
                     ("long_run_policy", lambda v: isinstance(v, str))):
        if not ok(setting(info, name)):
            raise MapDatabaseError(f"run {info.id}: settings: {name} {setting(info, name)!r} is not a usable value")
    try:
        parse_mount(setting(info, "camera_mount"))
    except (ValueError, TypeError) as error:
        raise MapDatabaseError(f"run {info.id}: settings: camera_mount: {error}") from None


def load_run(conn: sqlite3.Connection, info: RunInfo, refused: list | None = None) -> StoredRun:
    """The run as ``Mapper.save`` writes it. A damaged record is skipped and told in ``refused``
    (None: MapDatabaseError); damaged settings or conversion raise MapDatabaseError (nothing of the
    run can be placed without them)."""
    check_settings(info)
    frames = conversion(info)
    xyz, rgb = replay_map(conn, info, refused)
    xyz = frames.points(xyz)
    max_poses = setting(info, "max_trajectory_poses")
    finished = load_finished(conn, info.id, setting(info, "max_map_points"), max_poses, refused)
    entries, positions = [], []
    if finished is not None and len(finished[0]):   # as MapStore.points and .trajectory combine the two parts
        combined = read_record(refused, f"run {info.id}: map", lambda: _insert(finished[0].copy(), (xyz, rgb)))
        xyz, rgb = (finished[0] if combined is None else combined).points()
        mount = rigid_inverse(frames.camera_base)
        for entry in finished[1]:
            entries.append(entry)
            positions.append((entry.pose @ mount)[:3, 3])
    for index, stamp_ns, internal in stored_poses(conn, info.id, refused):
        entries.append((stamp_ns, frames.base_pose(internal), index))
        positions.append(frames.camera_pose(internal)[:3, 3])
    trajectory = Trajectory(max_poses)
    for stamp_ns, pose, key in entries[-max_poses:]:
        trajectory.append(stamp_ns, pose, key=key)
    positions = positions[-max_poses:]
    windows = stored_windows(conn, info.id, refused) if setting(info, "long_run_policy") == "windowed" else None
    return StoredRun(info, xyz, rgb, trajectory, windows,
                     np.array(positions, np.float64).reshape(-1, 3))


def _keyframe_image(index, width, height, intrinsic, jpeg) -> tuple[int, KeyframeImage]:
    """A stored keyframe image, checked: its intrinsics 9 finite values, its JPEG decodes to its
    stored size."""
    width, height = integer(width, "width"), integer(height, "height")
    if not isinstance(intrinsic, bytes) or len(intrinsic) != 72:
        raise ValueError("intrinsics of another size than 9 float64")
    k = checked_array(np.frombuffer(intrinsic, np.float64), (9,), "intrinsics", MAX_MAGNITUDE).reshape(3, 3)
    if not isinstance(jpeg, bytes):
        raise ValueError(f"image of type {type(jpeg).__name__}, not JPEG bytes")
    decoded = decode_compressed(jpeg, "jpeg")
    if decoded.shape[:2] != (height, width):
        raise ValueError(f"a JPEG of {decoded.shape[1]}x{decoded.shape[0]} stored as {width!r}x{height!r}")
    return integer(index, "index"), KeyframeImage(jpeg, width, height, k.copy())


def load_keyframe_images(conn: sqlite3.Connection, run: int, refused: list | None = None) -> dict[int, KeyframeImage]:
    """The run's stored keyframe images by frame index (none in a file of schema 1, which
    predates them); a damaged one is left out (``_refuse``)."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'keyframe_images'").fetchone() is None:
        return {}
    images = {}
    for row in conn.execute("SELECT idx, width, height, intrinsic, jpeg FROM keyframe_images WHERE run = ? "
                            "ORDER BY idx", (run,)):
        image = read_record(refused, f"run {run}: keyframe image {row[0]}", lambda: _keyframe_image(*row))
        if image is not None:
            images[image[0]] = image[1]
    return images
