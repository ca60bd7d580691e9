"""lingbot-ros-map: look into a map database, export a run, draw its picture.

    lingbot-ros-map info DB                  runs and rigs, frames, windows, how each run ended, size
    lingbot-ros-map export DB DIR [--run N | --rig R]
                                             map.ply, trajectory.tum (and windows.csv of a windowed
                                             run): what ~/save_map or lingbot-ros-offline wrote for it;
                                             a rig's: map.ply (every camera at the primary's scale),
                                             trajectory_<camera>.tum per camera, as the rig's save
    lingbot-ros-map export --format colmap DB DIR [--run N] [--overwrite]
                                             the keyframes and the map as a COLMAP model (sparse/0/*.bin,
                                             images/), for Gaussian splatting and NeRF trainers
    lingbot-ros-map preview DB OUT.png [--run N]   top-down picture, coloured by height, trajectory over it
    lingbot-ros-map view DB [--run N] [--port P]   the run in the browser's 3D view until Ctrl-C

The run is the newest unless --run; export takes the newest rig where the newest run is a rig's
camera (--run N of a rig's camera exports that camera alone, in its own units). The file is opened read-only (on a read-only disk too): this
works while a node writes it, and nothing of it is ever written. An output path that is the
database or one of its files is refused. A damaged record (a blob of another size, settings that
are not a JSON object, non-finite values, points beyond the map's range, a value of another type,
a keyframe image that does not decode) is left out with one line on stderr naming its run and
record, the rest is exported, and the exit status is 1. A run stored
by an older version that lacks a setting added since is read with that setting's default, and the
output says which. Files are written all or none (mapping/files/staged_files.py).
"""
from __future__ import annotations

import argparse
import datetime
import os
import sqlite3
import sys
from pathlib import Path

from lingbot_ros.mapping.database import schema as mdb
from lingbot_ros.mapping.database.blobs import MapDatabaseError
from lingbot_ros.mapping.database.readback import check_settings, conversion, defaulted, load_keyframe_images, load_run
from lingbot_ros.mapping.database.retention import stored_bytes
from lingbot_ros.mapping.database.run_info import RunInfo, runs as stored_runs
from lingbot_ros.mapping.database.writer_lock import WriterLock, lock_path
from lingbot_ros.mapping.files.colmap import ColmapExportError, export_images, write_colmap
from lingbot_ros.mapping.files.export import MAP_FILE_NAMES, write_map_files
from lingbot_ros.mapping.files.preview import preview_png
from lingbot_ros.mapping.files.staged_files import write_files
from lingbot_ros.mapping.rig.rig_map import file_names
from lingbot_ros.mapping.rig.stored_rig import load_rig, rig_members, save_rig
from lingbot_ros.mapping.store.map_view import stored_view
from lingbot_ros.process import interrupts
from lingbot_ros.tools.command_line import Parser
from lingbot_ros.viewer import serve
from lingbot_ros.viewer.live_view import POSE_BUDGET


class MapToolError(Exception):
    """What the user has to fix (no such file, no such run)."""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="lingbot-ros-map", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="runs, frames, windows, how each run ended, size")
    info.add_argument("database", type=Path)
    export = commands.add_parser("export", help="a run's map.ply, trajectory.tum and windows.csv, or a COLMAP model")
    export.add_argument("database", type=Path)
    export.add_argument("directory", type=Path)
    export.add_argument("--run", type=int, help="run id (default: the newest)")
    export.add_argument("--rig", type=int, help="rig id: its one map and a trajectory per camera (default: the "
                                                "newest run's rig, if it is a rig's camera)")
    export.add_argument("--format", choices=("ply", "colmap"), default="ply",
                        help="ply: map.ply, trajectory.tum, preview.png (and windows.csv); colmap: "
                             "sparse/0/{cameras,images,points3D}.bin and images/ (default %(default)s)")
    export.add_argument("--overwrite", action="store_true",
                        help="colmap: replace a COLMAP model already in DIRECTORY (refused without it)")
    preview = commands.add_parser("preview", help="a run's top-down picture (PNG)")
    preview.add_argument("database", type=Path)
    preview.add_argument("output", type=Path)
    preview.add_argument("--run", type=int, help="run id (default: the newest)")
    view = commands.add_parser("view", help="a run in the browser's 3D view (points, trajectory, last camera)")
    view.add_argument("database", type=Path)
    view.add_argument("--run", type=int, help="run id (default: the newest)")
    serve.add_arguments(view, required=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    return interrupts.run(_main, argv, "lingbot-ros-map")


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    refused: list[str] = []   # damaged records left out, each "run N: record: why"
    try:
        print(COMMANDS[args.command](args, refused))
    except (MapToolError, MapDatabaseError, ColmapExportError, sqlite3.Error, OSError) as error:
        _tell_refused(refused)
        print(f"lingbot-ros-map: error: {error}", file=sys.stderr)
        return 1
    _tell_refused(refused)
    return 1 if refused else 0


def _tell_refused(refused: list[str]) -> None:
    for text in refused:
        print(f"lingbot-ros-map: refused (damaged record, left out): {text}", file=sys.stderr)


def _open(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise MapToolError(f"{path}: no such file")
    return mdb.connect(path, readonly=True)


def _refuse_inputs(database: Path, outputs) -> None:
    """An output path that is the database or one of its files (its journal, its lock), by name or
    through a link, is refused before anything is written: a slip of the hand never replaces the map."""
    real = os.path.realpath(database)
    inputs = {real, *(f"{real}{suffix}" for suffix in mdb.JOURNAL_SUFFIXES), str(lock_path(database))}
    identity = {(st.st_dev, st.st_ino) for st in map(_stat, inputs) if st is not None}
    for output in outputs:
        st = _stat(output)
        if os.path.realpath(output) in inputs or (st is not None and (st.st_dev, st.st_ino) in identity):
            raise MapToolError(f"{output} is the database {database} or one of its files (an input): choose "
                               "another output path; nothing was written")


def _stat(path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def _run(conn: sqlite3.Connection, wanted: int | None) -> RunInfo:
    runs = stored_runs(conn)
    if not runs:
        raise MapToolError("the database holds no run")
    if wanted is None:
        return runs[-1]
    for run in runs:
        if run.id == wanted:
            return run
    raise MapToolError(f"no run {wanted} (runs: {', '.join(str(r.id) for r in runs)})")


def _load(conn: sqlite3.Connection, info: RunInfo, refused: list[str]):
    """The run as its save wrote it; the damaged records of its row read as unknown are told too."""
    refused.extend(info.unreadable)
    return load_run(conn, info, refused)


def _defaults_note(run: RunInfo) -> str:
    if run.damaged:
        return "; damaged (below)"
    missing = defaulted(run)
    return (f"; stored settings lack {', '.join(missing)} (an older version wrote the run): read with "
            "the default" + ("s" if len(missing) > 1 else "")) if missing else ""


def _ending(run: RunInfo, writer_alive: bool, newest: bool) -> str:
    if run.ending == mdb.RUNNING:
        return "running" if writer_alive and newest else "crashed (no end recorded yet)"
    return run.ending


def _time(ns: int | None) -> str:
    if ns is None:
        return "-"
    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def info(args, refused: list[str]) -> str:
    conn = _open(args.database)
    runs = stored_runs(conn)
    for run in runs:   # the run's own records (settings, conversion, times): the rest is export's to read
        try:
            check_settings(run)
        except MapDatabaseError as error:
            refused.extend(run.damaged or [str(error)])
        refused.extend(run.unreadable)
    alive = WriterLock.held(args.database)
    rigs = sorted({run.rig.rig for run in runs if run.rig is not None})
    lines = [f"{args.database}: {stored_bytes(args.database) / 1e6:.1f} MB, schema {mdb.SCHEMA_VERSION}, "
             f"{len(runs)} run(s)" + (f", {len(rigs)} of them rig(s) of several cameras" if rigs else "")]
    for run in runs:
        if run.rig is not None:
            if run is rig_members(runs, run.rig.rig)[0]:
                lines += _rig_lines(conn, rig_members(runs, run.rig.rig), alive, runs[-1], refused)
            continue
        lines.append(f"run {run.id}: {_ending(run, alive, run is runs[-1])}; started {_time(run.started_ns)}, "
                     f"last commit {_time(run.last_commit_ns)}, ended {_time(run.ended_ns)}; {_counts(run)}; "
                     f"scale {_metric(run)}; {run.model}{_defaults_note(run)}")
    return "\n".join(lines)


def _counts(run: RunInfo) -> str:
    return f"{run.frames} frames ({run.keyframes} keyframes), {run.windows} windows, {run.map_inserts} map inserts"


def _metric(run: RunInfo) -> str:
    return f"{run.scale:.6g} m per model unit" if run.scale_known else "unknown (model units)"


def _rig_lines(conn, members: list[RunInfo], alive: bool, newest: RunInfo, refused: list[str]) -> list[str]:
    """A rig as one entry: its line, then one per camera (its run, counts, map points, scale to the primary)."""
    first = members[0]
    endings = {_ending(run, alive, newest.id in {r.id for r in members}) for run in members}
    lines = [f"rig {first.rig.rig}: {' / '.join(sorted(endings))}; {len(members)} cameras, started "
             f"{_time(first.started_ns)}, last commit {_time(first.last_commit_ns)}, ended {_time(first.ended_ns)}; "
             f"{first.model}"]
    for run in members:
        camera = run.rig
        try:
            points = f"{len(load_run(conn, run, refused).xyz)} map points"
        except MapDatabaseError:   # its settings are damaged: told above
            points = "map points unreadable"
        scale = ("1 (the primary camera)" if camera.primary else
                 f"{camera.scale:.6g} to the primary ({camera.scale_source}: {camera.scale_text})"
                 if camera.scale is not None else f"unknown ({camera.scale_text or 'not estimated yet'}): "
                                                  "its points are not in the rig's map")
        lines.append(f"  camera {camera.camera}{' (primary)' if camera.primary else ''}: run {run.id}; "
                     f"{_counts(run)}, {points}; scale {scale}; metric scale {_metric(run)}{_defaults_note(run)}")
    return lines


def export(args, refused: list[str]) -> str:
    _refuse_inputs(args.database, [args.directory, *(args.directory / name for name in MAP_FILE_NAMES)])
    conn = _open(args.database)
    members = _rig(conn, args)
    if members:
        return export_rig(conn, members, args, refused)
    stored = _load(conn, _run(conn, args.run), refused)
    if args.format == "colmap":
        return export_colmap(conn, stored, args, refused)
    ply, tum = write_map_files(args.directory, stored.xyz, stored.rgb, stored.trajectory, stored.windows)
    return (f"run {stored.info.id} ({stored.info.ending}): wrote {len(stored.xyz)} points to {ply} and "
            f"{len(stored.trajectory)} poses to {tum}" + ("" if stored.windows is None else
                                                          f", {len(stored.windows)} windows")
            + _defaults_note(stored.info))


def _rig(conn: sqlite3.Connection, args) -> list[RunInfo]:
    """The rig's runs to export (--rig, or the newest run's rig without --run); [] for a single run."""
    runs = stored_runs(conn)
    if args.rig is not None:
        if args.run is not None:
            raise MapToolError("--run and --rig: give one")
        members = rig_members(runs, args.rig)
        if not members:
            rigs = sorted({run.rig.rig for run in runs if run.rig is not None})
            raise MapToolError(f"no rig {args.rig} (rigs: {', '.join(map(str, rigs)) or 'none'})")
        return members
    if args.run is None and runs and runs[-1].rig is not None:
        return rig_members(runs, runs[-1].rig.rig)
    return []


def export_rig(conn: sqlite3.Connection, members: list[RunInfo], args, refused: list[str]) -> str:
    if args.format == "colmap":
        raise MapToolError(f"rig {members[0].rig.rig}: a COLMAP model of a rig is not written (one camera's: "
                           f"--run with one of its runs {', '.join(str(run.id) for run in members)})")
    _refuse_inputs(args.database, [args.directory / name for name in file_names(run.rig.camera for run in members)])
    for run in members:
        refused.extend(run.unreadable)
    saved = save_rig(load_rig(conn, members, refused), args.directory)
    return f"rig {members[0].rig.rig} ({members[0].ending}): {saved.message}"


def export_colmap(conn: sqlite3.Connection, stored, args, refused: list[str]) -> str:
    """The run's keyframes that have a stored image (a file of schema 1 has none), their poses and the map."""
    info = stored.info
    keyframes = load_keyframe_images(conn, info.id, refused)
    images = export_images(stored.trajectory, conversion(info).camera_base, keyframes)
    if not images:
        raise MapToolError(f"run {info.id} holds no keyframe image ({info.keyframes} keyframes; runs stored before "
                           "lingbot_ros stored them, schema 1, have none): a COLMAP model needs the images; "
                           "the poses and the map are in `lingbot-ros-map export` (map.ply, trajectory.tum)")
    summary = write_colmap(args.directory, images, stored.xyz, stored.rgb, info.scale_known, overwrite=args.overwrite)
    missing = info.keyframes - len(images)
    return (f"run {info.id} ({info.ending}): {summary.text()}"
            + (f"; {missing} keyframes without a stored image are left out" if missing > 0 else "")
            + _defaults_note(info))


def preview(args, refused: list[str]) -> str:
    _refuse_inputs(args.database, [args.output])
    conn = _open(args.database)
    stored = _load(conn, _run(conn, args.run), refused)
    units = "m" if stored.info.scale_known else "model units"
    write_files({args.output: preview_png(
        stored.xyz, stored.camera_positions, units,
        title=f"run {stored.info.id}: {len(stored.trajectory)} frames, {len(stored.xyz)} points; "
              "top-down, coloured by height")})
    return f"run {stored.info.id}: wrote {args.output}{_defaults_note(stored.info)}"


def view(args, refused: list[str]) -> str:
    """Serve the run until Ctrl-C (the text is what is shown, printed once it is served)."""
    conn = _open(args.database)
    stored = _load(conn, _run(conn, args.run), refused)
    viewer = serve.start(args, "lingbot-ros-map")
    if viewer is None:
        raise MapToolError("the view did not start (the reason is above)")
    shown = stored_view(stored, args.viewer_point_budget, POSE_BUDGET)
    viewer.show(shown)
    print(f"run {stored.info.id} ({stored.info.ending}): {len(shown.xyz)} of {shown.map_points} points, "
          f"{shown.poses} poses{_defaults_note(stored.info)}", flush=True)
    serve.until_stopped(viewer, "lingbot-ros-map", f"run {stored.info.id}")
    return ""


COMMANDS = {"info": info, "export": export, "preview": preview, "view": view}


if __name__ == "__main__":
    sys.exit(main())
