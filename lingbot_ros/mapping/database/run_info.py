"""Each run's own row (``runs``, ``rig_cameras``) read back as a RunInfo: its settings, ending,
conversion and counts, every record checked; a record that cannot be read is named, never raised."""
from __future__ import annotations

import dataclasses
import json
import math
import sqlite3

import numpy as np

from .blobs import MapDatabaseError, checked_array


@dataclasses.dataclass(frozen=True)
class RunInfo:
    id: int
    started_ns: int
    last_commit_ns: int | None
    ended_ns: int | None
    ending: str
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
    damaged: tuple[str, ...] = ()   # the run's own records that cannot be read: "run N: record: why"
    rig: RigCamera | None = None    # the rig camera it records (None: a single camera's run)


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


def rig_cameras(conn: sqlite3.Connection) -> dict[int, RigCamera]:
    """Each rig run's camera by run id ({} in a file older than schema 3)."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'rig_cameras'").fetchone() is None:
        return {}
    out = {}
    for run, rig, position, camera, scale, source, text, primary in conn.execute(
            "SELECT c.run, c.rig, c.position, c.camera, c.scale, c.scale_source, c.scale_text, r.primary_camera "
            "FROM rig_cameras c JOIN rigs r ON r.id = c.rig"):
        if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            # Damaged: read as not known (the camera stays out of the rig's map), and said so.
            scale, source, text = None, "unknown", f"the stored scale {scale!r} is damaged (not a positive number)"
        out[run] = RigCamera(rig, position, str(camera), camera == primary, None if scale is None else float(scale),
                             str(source), str(text))
    return out


def _settings(text) -> dict:
    try:
        value = json.loads(text)
    except (ValueError, TypeError) as error:
        raise ValueError(f"not JSON ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"JSON {type(value).__name__}, not an object")
    return value


def runs(conn: sqlite3.Connection) -> list[RunInfo]:
    """Every run; a run record that cannot be read is named in its ``damaged`` (never raised)."""
    out, cameras = [], rig_cameras(conn)
    for row in conn.execute("SELECT id, started_ns, last_commit_ns, ended_ns, ending, settings, model, scale, "
                            "scale_known, mount, origins FROM runs ORDER BY id").fetchall():
        run, damaged = row[0], []
        frames, keyframes = conn.execute("SELECT COUNT(*), COALESCE(SUM(keyframe), 0) FROM frames WHERE run = ?",
                                         (run,)).fetchone()
        windows = conn.execute("SELECT COUNT(*) FROM windows WHERE run = ?", (run,)).fetchone()[0]
        inserts = conn.execute("SELECT COUNT(*) FROM map_inserts WHERE run = ?", (run,)).fetchone()[0]
        values = {}
        for name, read in (("settings", lambda: _settings(row[5])),
                           ("scale", lambda: float(checked_array(np.float64(row[7]), (), "scale"))),
                           ("mount", lambda: None if row[9] is None else checked_array(row[9], (4, 4), "mount")),
                           ("origins", lambda: None if row[10] is None else checked_array(row[10], (6,), "origins"))):
            try:
                values[name] = read()
            except (MapDatabaseError, ValueError, TypeError) as error:
                values[name] = {} if name == "settings" else 1.0 if name == "scale" else None
                damaged.append(f"run {run}: {name}: {error}")
        out.append(RunInfo(run, row[1], row[2], row[3], row[4], values["settings"], str(row[6]), values["scale"],
                           bool(row[8]), values["mount"], values["origins"], frames, keyframes, windows, inserts,
                           tuple(damaged), cameras.get(run)))
    return out
