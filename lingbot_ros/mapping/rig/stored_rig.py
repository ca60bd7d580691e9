"""A rig recorded in the map database, read back as ``RigMapper.save`` writes it (lingbot-ros-map).

Each camera's run is read back as its Mapper's save (database/readback.py ``load_run``: the map
and base trajectory in its ``map``, in its own units); the one map and the trajectories at the
primary's scale are rig_map.py's, with each other camera's last stored scale against the primary
(``rig_cameras``, database/run_info.py). A camera whose stored scale is unknown is left out of
the map and its trajectory is in its own units, as in a save.
"""
from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

from ..database.blobs import MapDatabaseError
from ..database.readback import StoredRun, load_run, setting
from ..database.run_info import RunInfo
from ..settings import SettingsError
from . import rig_map
from .cameras import check_cameras
from .records import RigScale, SavedRigMap
from .scale import primary_scale


@dataclasses.dataclass
class StoredRig:
    rig: int
    primary: str
    runs: dict[str, StoredRun]      # camera -> its run, in the rig's camera order
    scales: dict[str, RigScale]     # camera -> its last stored scale against the primary


def rig_members(runs: list[RunInfo], rig: int) -> list[RunInfo]:
    """The rig's runs in its camera order."""
    return sorted((run for run in runs if run.rig is not None and run.rig.rig == rig), key=lambda r: r.rig.position)


def load_rig(conn: sqlite3.Connection, members: list[RunInfo], refused: list | None = None) -> StoredRig:
    """The rig of ``members`` (rig_members); damaged records as ``load_run`` treats them. Its
    camera names become file names: names the rig could not have (check_cameras: ``..``, ``/``, a
    name twice, no primary among them) raise MapDatabaseError."""
    rig = members[0].rig.rig
    primaries = [run.rig.camera for run in members if run.rig.primary]
    try:
        check_cameras([run.rig.camera for run in members], primaries[0] if primaries else "")
    except SettingsError as error:
        raise MapDatabaseError(f"rig {rig}: its stored cameras are damaged ({error})") from None
    if not primaries:
        raise MapDatabaseError(f"rig {rig}: its stored primary camera is none of its cameras")
    primary = primaries[0]
    return StoredRig(rig, primary,
                     {run.rig.camera: load_run(conn, run, refused) for run in members},
                     {run.rig.camera: primary_scale() if run.rig.camera == primary else
                      RigScale(run.rig.scale, run.rig.scale_source, run.rig.scale_text) for run in members})


def save_rig(stored: StoredRig, directory: str | Path) -> SavedRigMap:
    """What ``RigMapper.save`` wrote for the rig at the scales stored last."""
    primary = stored.runs[stored.primary].info
    xyz, rgb, left_out = rig_map.union({camera: (run.xyz, run.rgb) for camera, run in stored.runs.items()},
                                       stored.scales, setting(primary, "map_voxel_size_m"),
                                       setting(primary, "max_map_points"))
    trajectories = {camera: rig_map.scaled(run.trajectory, stored.scales[camera])
                    for camera, run in stored.runs.items()}
    windows = {camera: run.windows for camera, run in stored.runs.items()}
    units = "m" if primary.scale_known else "model units"
    return rig_map.save(directory, xyz, rgb, trajectories, stored.primary, windows, units, left_out)
