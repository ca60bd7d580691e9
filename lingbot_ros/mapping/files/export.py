"""File export: coloured point clouds as PLY, trajectories in the TUM RGB-D format.

Every file is written through ``staged_files.StagedFiles``: to a temporary file in the target's
directory, fsynced, then renamed over the target, all files of a save or none. A reader never
sees a partial file; a failed save leaves the previous files as they were; a symlink at a target
is replaced, never followed.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .preview import preview_png
from .staged_files import StagedFiles, write_files
from ..stamps import ns_from_text, seconds_text
from ..store.trajectory import Trajectory
from ..placement.geometry import quaternion_to_rotation, rotation_to_quaternion

# One vertex record of the PLY files written here: 15 bytes, little-endian, no padding.
_PLY_VERTEX = np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4"),
                        ("red", "u1"), ("green", "u1"), ("blue", "u1")])
_PLY_HEADER = ("ply\n"
               "format binary_little_endian 1.0\n"
               "comment written by lingbot_ros\n"
               "element vertex {count}\n"
               "property float x\nproperty float y\nproperty float z\n"
               "property uchar red\nproperty uchar green\nproperty uchar blue\n"
               "end_header\n")


class PlyFormatError(ValueError):
    """A PLY file is not in the layout that :func:`write_ply` produces."""


def ply_bytes(xyz: np.ndarray, rgb: np.ndarray) -> bytes:
    """A binary little-endian PLY point cloud (Open3D, MeshLab, CloudCompare read it).

    Args:
        xyz: ``[N, 3]`` positions (written as float32, model units / metres), finite.
        rgb: ``[N, 3]`` uint8 colours.
    """
    xyz = np.asarray(xyz)
    rgb = np.asarray(rgb)
    if xyz.ndim != 2 or xyz.shape[1] != 3 or rgb.shape != xyz.shape:
        raise ValueError(f"xyz and rgb must both be [N, 3], got {xyz.shape} and {rgb.shape}")
    if rgb.dtype != np.uint8:
        raise ValueError(f"rgb must be uint8, got {rgb.dtype}")
    if not np.isfinite(xyz).all():
        raise ValueError("non-finite points: not written")
    vertices = np.empty(len(xyz), dtype=_PLY_VERTEX)
    for axis, name in enumerate("xyz"):
        vertices[name] = xyz[:, axis]
    for channel, name in enumerate(("red", "green", "blue")):
        vertices[name] = rgb[:, channel]
    return _PLY_HEADER.format(count=len(xyz)).encode("ascii") + vertices.tobytes()


def write_ply(path: str | Path, xyz: np.ndarray, rgb: np.ndarray) -> None:
    """``ply_bytes`` written safely to ``path``."""
    write_files({Path(path): ply_bytes(xyz, rgb)})


def read_ply(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read a PLY written by :func:`write_ply` -> ``(xyz float32 [N, 3], rgb uint8 [N, 3])``."""
    data = Path(path).read_bytes()
    end = data.find(b"end_header\n")
    if not data.startswith(b"ply\n") or end < 0:
        raise PlyFormatError(f"{path}: not a PLY file (no 'ply' magic or 'end_header')")
    header = data[:end].decode("ascii").splitlines()
    count_lines = [line for line in header if line.startswith("element vertex ")]
    if len(count_lines) != 1:
        raise PlyFormatError(f"{path}: expected one 'element vertex N' line")
    count = int(count_lines[0].split()[2])
    if header != _PLY_HEADER.format(count=count).splitlines()[:-1]:
        raise PlyFormatError(f"{path}: header differs from the layout write_ply produces")
    body = data[end + len(b"end_header\n"):]
    if len(body) != count * _PLY_VERTEX.itemsize:
        raise PlyFormatError(f"{path}: {len(body)} bytes of vertex data for {count} vertices")
    vertices = np.frombuffer(body, dtype=_PLY_VERTEX)
    xyz = np.stack([vertices["x"], vertices["y"], vertices["z"]], axis=1)
    rgb = np.stack([vertices["red"], vertices["green"], vertices["blue"]], axis=1)
    return xyz, rgb


def write_tum(path: str | Path, trajectory: Trajectory) -> None:
    """``tum_bytes`` written safely to ``path``."""
    write_files({Path(path): tum_bytes(trajectory)})


def tum_bytes(trajectory: Trajectory) -> bytes:
    """``timestamp tx ty tz qx qy qz qw`` per pose, one line each (the Mapper's trajectory.tum:
    the robot base in ``map``).

    This is the TUM RGB-D benchmark format that evo and the TUM tools read. The integer-ns stamps
    are written as seconds with microsecond digits, exactly (no float in between): evo and the TUM
    tools read a stamp as a float64, which resolves only ~0.24 us at Unix-epoch seconds.
    """
    lines = []
    for stamp_ns, pose, _ in trajectory:
        stamp = seconds_text(stamp_ns, 6)
        if not np.isfinite(pose).all():
            raise ValueError(f"non-finite pose at {stamp}: trajectory not written")
        qx, qy, qz, qw = rotation_to_quaternion(pose[:3, :3])
        tx, ty, tz = pose[:3, 3]
        lines.append(f"{stamp} {tx:.9g} {ty:.9g} {tz:.9g} "
                     f"{qx:.9g} {qy:.9g} {qz:.9g} {qw:.9g}\n")
    return "".join(lines).encode("ascii")


def read_tum(path: str | Path) -> Trajectory:
    """Read a TUM trajectory file (``#`` comment lines and blank lines are skipped)."""
    trajectory = Trajectory()
    for line_number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 8:
            raise ValueError(f"{path}:{line_number}: expected 8 fields "
                             f"'timestamp tx ty tz qx qy qz qw', got {len(fields)}")
        try:
            stamp_ns = ns_from_text(fields[0])
        except ValueError as error:
            raise ValueError(f"{path}:{line_number}: {error}") from None
        tx, ty, tz, qx, qy, qz, qw = map(float, fields[1:])
        pose = np.eye(4)
        pose[:3, :3] = quaternion_to_rotation(np.array([qx, qy, qz, qw]))
        pose[:3, 3] = (tx, ty, tz)
        trajectory.append(stamp_ns, pose)
    return trajectory


def windows_bytes(records) -> bytes:
    """One row per window of a windowed run: its number in its stream, the Mapper index of its
    first frame, the alignment's scale, its rotation and translation into window 0's model frame
    (spec 13.1 ``chunk_scales`` / ``chunk_transforms``, OpenCV axes) and how well the overlap
    agreed (mean camera-centre distance over the overlap relative to the motion over it)."""
    lines = ["window,first_index,scale," + ",".join(f"r{i}{j}" for i in range(3) for j in range(3))
             + ",tx,ty,tz,overlap_error\n"]
    for record in records:
        sim = record.similarity
        rotation = sim.rotation.detach().cpu().double().numpy().reshape(-1)
        translation = sim.translation.detach().cpu().double().numpy()
        values = [float(sim.scale), *rotation, *translation, record.overlap_error]
        lines.append(f"{record.window},{record.first_index}," + ",".join(f"{v:.9g}" for v in values) + "\n")
    return "".join(lines).encode("ascii")


# What write_map_files writes in its directory (windows.csv for a windowed run only).
MAP_FILE_NAMES = ("map.ply", "trajectory.tum", "preview.png", "windows.csv")


def write_map_files(directory: str | Path, xyz: np.ndarray, rgb: np.ndarray, trajectory: Trajectory,
                    windows=None, units: str = "m", staged: StagedFiles | None = None) -> tuple[Path, Path]:
    """A saved map's files in ``directory`` (``Mapper.save`` and ``lingbot-ros-map export`` write
    the same), all or nothing: map.ply, trajectory.tum, preview.png (axes in ``units``) and, for a
    windowed run (``windows`` not None), windows.csv. With ``staged`` they are added to it for the
    caller to commit with its own files; without, they are committed here. Returns the PLY's and
    the TUM file's paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ply, tum, png, csv = (directory / name for name in MAP_FILE_NAMES)
    files = {ply: ply_bytes(xyz, rgb), tum: tum_bytes(trajectory),
             png: preview_png(xyz, trajectory.poses()[:, :3, 3], units=units)}
    if windows is not None:
        files[csv] = windows_bytes(windows)
    write_files(files, staged)
    return ply, tum
