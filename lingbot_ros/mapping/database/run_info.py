"""Each run's own row (``runs``, ``rig_cameras``) read back as a RunInfo: its settings, ending,
conversion and counts, every record checked; a record that cannot be read is named, never raised."""
from __future__ import annotations

import dataclasses
import json
import math
import sqlite3

import numpy as np

from .blobs import MAX_MAGNITUDE, MapDatabaseError, checked_array, integer, scale_value
from .schema import CLEAN, CRASHED, RUNNING


@dataclasses.dataclass(frozen=True)
class RunInfo:
    id: int
    started_ns: int | None          # None (and in ``unreadable``) where the record is damaged
    last_commit_ns: int | None
    ended_ns: int | None
    ending: str                     # running, clean, crashed; "unknown" where damaged
    settings: dict                  # {} where the record is damaged
    model: str
    scale: float
    scale_known: bool
    mount: np.ndarray | None
    origins: np.ndarray | None      # [6]: the conversion's origin in I, then in map
    frames: int
    keyframes: int
    windows: int
    map_inserts: int
    damaged: tuple[str, ...] = ()   # records the run cannot be placed without (settings, conversion), damaged:
                                    # "run N: record: why"
    rig: RigCamera | None = None    # the rig camera it records (None: a single camera's run)
    unreadable: tuple[str, ...] = ()   # other records of its row, damaged and read as unknown (times, ending,
                                       # its rig camera's row or scale): told, but the run can be placed


@dataclasses.dataclass(frozen=True)
class RigCamera:
    """A run's place in a rig (``rig_cameras``)."""

    rig: int
    position: int
    camera: str
    primary: bool
    scale: float | None             # primary map units per unit of this camera's map; None: unknown
    scale_source: str
    scale_text: str


def rig_cameras(conn: sqlite3.Connection) -> tuple[dict[int, RigCamera], dict[int, str]]:
    """Each rig run's camera by run id ({} in a file older than schema 3), and by run id why its
    row is damaged. A row whose rig, position or camera cannot be read leaves its run out of the
    rig (a run of its own); a damaged scale reads as not known (the camera stays out of the rig's
    map)."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'rig_cameras'").fetchone() is None:
        return {}, {}
    out, damaged = {}, {}
    for run, rig, position, camera, scale, source, text, primary in conn.execute(
            "SELECT c.run, c.rig, c.position, c.camera, c.scale, c.scale_source, c.scale_text, r.primary_camera "
            "FROM rig_cameras c LEFT JOIN rigs r ON r.id = c.rig"):
        if type(rig) is not int or type(position) is not int or type(camera) is not str or primary is None:
            damaged[run] = (f"run {run}: rig camera: rig {rig!r}, position {position!r}, camera {camera!r} "
                            "(not a stored rig, a position and a name): read as a run of its own")
            continue
        if scale is not None and not (type(scale) in (int, float) and math.isfinite(scale) and scale > 0):
            damaged[run] = f"run {run}: rig camera scale: {scale!r} is not a positive number: read as not known"
            scale, source, text = None, "unknown", f"the stored scale {scale!r} is damaged (not a positive number)"
        out[run] = RigCamera(rig, position, camera, camera == primary, None if scale is None else float(scale),
                             str(source), str(text))
    return out, damaged


def _settings(text) -> dict:
    try:
        value = json.loads(text)
    except (ValueError, TypeError) as error:
        raise ValueError(f"not JSON ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"JSON {type(value).__name__}, not an object")
    return value


def _time(value) -> int | None:
    return None if value is None else integer(value, "value")


def _ending(value) -> str:
    if value not in (RUNNING, CLEAN, CRASHED):
        raise ValueError(f"{value!r} is none of {RUNNING}, {CLEAN}, {CRASHED}")
    return value


def _read(row: tuple) -> tuple[dict, list[str], list[str]]:
    """The row's records by name, with the damaged ones named (those the run cannot be placed
    without, then the others), each damaged one read as its fallback."""
    readers = (  # (record, read, fallback, the run can be placed without it)
        ("started_ns", lambda: integer(row[1], "value"), None, True),
        ("last_commit_ns", lambda: _time(row[2]), None, True),
        ("ended_ns", lambda: _time(row[3]), None, True),
        ("ending", lambda: _ending(row[4]), "unknown", True),
        ("settings", lambda: _settings(row[5]), {}, False),
        ("scale", lambda: scale_value(row[7], "value"), 1.0, False),
        ("scale_known", lambda: bool(integer(row[8], "value")), False, False),
        ("mount", lambda: None if row[9] is None else checked_array(row[9], (4, 4), "mount", MAX_MAGNITUDE), None,
         False),
        ("origins", lambda: None if row[10] is None else checked_array(row[10], (6,), "origins", MAX_MAGNITUDE),
         None, False))
    values, damaged, unreadable = {}, [], []
    for name, read, fallback, optional in readers:
        try:
            values[name] = read()
        except (MapDatabaseError, ValueError, TypeError) as error:
            values[name] = fallback
            (unreadable if optional else damaged).append(f"run {row[0]}: {name}: {error}")
    return values, damaged, unreadable


def runs(conn: sqlite3.Connection) -> list[RunInfo]:
    """Every run; a run record that cannot be read is named in its ``damaged`` or ``unreadable``
    (never raised)."""
    out, (cameras, damaged_cameras) = [], rig_cameras(conn)
    for row in conn.execute("SELECT id, started_ns, last_commit_ns, ended_ns, ending, settings, model, scale, "
                            "scale_known, mount, origins FROM runs ORDER BY id").fetchall():
        run = row[0]
        frames, keyframes = conn.execute("SELECT COUNT(*), COALESCE(SUM(keyframe), 0) FROM frames WHERE run = ?",
                                         (run,)).fetchone()
        windows = conn.execute("SELECT COUNT(*) FROM windows WHERE run = ?", (run,)).fetchone()[0]
        inserts = conn.execute("SELECT COUNT(*) FROM map_inserts WHERE run = ?", (run,)).fetchone()[0]
        values, damaged, unreadable = _read(row)
        if run in damaged_cameras:
            unreadable.append(damaged_cameras[run])
        out.append(RunInfo(run, values["started_ns"], values["last_commit_ns"], values["ended_ns"], values["ending"],
                           values["settings"], str(row[6]), values["scale"], values["scale_known"], values["mount"],
                           values["origins"], frames, keyframes, windows, inserts, tuple(damaged), cameras.get(run),
                           tuple(unreadable)))
    return out
