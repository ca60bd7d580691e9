"""lingbot-ros-map: look into a map database, export a run, draw its picture.

    lingbot-ros-map info DB                  runs, frames, windows, how each run ended, size
    lingbot-ros-map export DB DIR [--run N]  map.ply, trajectory.tum (and windows.csv of a windowed
                                             run): what ~/save_map or lingbot-ros-offline wrote for it
    lingbot-ros-map preview DB OUT.png [--run N]   top-down picture, coloured by height, trajectory over it

The run is the newest unless --run. The file is opened read-only: this works while a node writes it.
A run stored by an older version that lacks a setting added since is read with that setting's
default, and the output says which. Files are written all or none (mapping/staged_files.py).
"""
from __future__ import annotations

import argparse
import datetime
import sqlite3
import sys
from pathlib import Path

from lingbot_ros.mapping import map_database as mdb
from lingbot_ros.mapping.export import write_map_files
from lingbot_ros.mapping.map_readback import defaulted, load_run
from lingbot_ros.mapping.map_writer import stored_bytes
from lingbot_ros.mapping.preview import preview_png
from lingbot_ros.mapping.staged_files import write_files
from lingbot_ros.process import interrupts


class MapToolError(Exception):
    """What the user has to fix (no such file, no such run)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lingbot-ros-map", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="runs, frames, windows, how each run ended, size")
    info.add_argument("database", type=Path)
    export = commands.add_parser("export", help="a run's map.ply, trajectory.tum and windows.csv")
    export.add_argument("database", type=Path)
    export.add_argument("directory", type=Path)
    export.add_argument("--run", type=int, help="run id (default: the newest)")
    preview = commands.add_parser("preview", help="a run's top-down picture (PNG)")
    preview.add_argument("database", type=Path)
    preview.add_argument("output", type=Path)
    preview.add_argument("--run", type=int, help="run id (default: the newest)")
    return parser


def main(argv: list[str] | None = None) -> int:
    return interrupts.run(_main, argv, "lingbot-ros-map")


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    try:
        print(COMMANDS[args.command](args))
    except (MapToolError, mdb.MapDatabaseError, sqlite3.Error, OSError) as error:
        print(f"lingbot-ros-map: error: {error}", file=sys.stderr)
        return 1
    return 0


def _open(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise MapToolError(f"{path}: no such file")
    return mdb.connect(path, readonly=True)


def _run(conn: sqlite3.Connection, wanted: int | None) -> mdb.RunInfo:
    runs = mdb.runs(conn)
    if not runs:
        raise MapToolError("the database holds no run")
    if wanted is None:
        return runs[-1]
    for run in runs:
        if run.id == wanted:
            return run
    raise MapToolError(f"no run {wanted} (runs: {', '.join(str(r.id) for r in runs)})")


def _defaults_note(run: mdb.RunInfo) -> str:
    missing = defaulted(run)
    return (f"; stored settings lack {', '.join(missing)} (an older version wrote the run): read with "
            "the default" + ("s" if len(missing) > 1 else "")) if missing else ""


def _ending(run: mdb.RunInfo, writer_alive: bool, newest: bool) -> str:
    if run.ending == mdb.RUNNING:
        return "running" if writer_alive and newest else "crashed (no end recorded yet)"
    return run.ending


def _time(ns: int | None) -> str:
    if ns is None:
        return "-"
    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def info(args) -> str:
    conn = _open(args.database)
    runs = mdb.runs(conn)
    alive = mdb.WriterLock.held(args.database)
    lines = [f"{args.database}: {stored_bytes(args.database) / 1e6:.1f} MB, schema {mdb.SCHEMA_VERSION}, "
             f"{len(runs)} run(s)"]
    for run in runs:
        scale = f"{run.scale:.6g} m per model unit" if run.scale_known else "unknown (model units)"
        lines.append(f"run {run.id}: {_ending(run, alive, run is runs[-1])}; started {_time(run.started_ns)}, "
                     f"last commit {_time(run.last_commit_ns)}, ended {_time(run.ended_ns)}; {run.frames} frames "
                     f"({run.keyframes} keyframes), {run.windows} windows, {run.map_inserts} map inserts; "
                     f"scale {scale}; {run.model}{_defaults_note(run)}")
    return "\n".join(lines)


def export(args) -> str:
    conn = _open(args.database)
    stored = load_run(conn, _run(conn, args.run))
    ply, tum = write_map_files(args.directory, stored.xyz, stored.rgb, stored.trajectory, stored.windows)
    return (f"run {stored.info.id} ({stored.info.ending}): wrote {len(stored.xyz)} points to {ply} and "
            f"{len(stored.trajectory)} poses to {tum}" + ("" if stored.windows is None else
                                                          f", {len(stored.windows)} windows")
            + _defaults_note(stored.info))


def preview(args) -> str:
    conn = _open(args.database)
    stored = load_run(conn, _run(conn, args.run))
    units = "m" if stored.info.scale_known else "model units"
    write_files({args.output: preview_png(
        stored.xyz, stored.camera_positions, units,
        title=f"run {stored.info.id}: {len(stored.trajectory)} frames, {len(stored.xyz)} points; "
              "top-down, coloured by height")})
    return f"run {stored.info.id}: wrote {args.output}{_defaults_note(stored.info)}"


COMMANDS = {"info": info, "export": export, "preview": preview}


if __name__ == "__main__":
    sys.exit(main())
