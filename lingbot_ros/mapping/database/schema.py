"""The map database: one SQLite file (WAL journal) holding every run's map, trajectory and windows.

Layout (schema version 1; each later version is one more step in ``_MIGRATIONS``, so a new kind
of record, e.g. keyframes with their images for relocalisation, is a new table, not a rewrite):

    runs            one row per Mapper (per configure; a resumed run replaces the one it continues):
                    settings (JSON), model, wall-clock start, last commit, end, how it ended (running -> clean | crashed), and the current
                    conversion into ``map`` (metric scale, camera mount, the stream's origins in
                    the internal frame and in ``map``: frames.MapConversion)
    frames          (run, idx): stamp (ns), the camera pose in the internal frame (placement/robot.py), keyframe
                    flag, window number, final flag; exactly the Mapper's trajectory (rolled-back
                    frames deleted, a reset clears it, the oldest go beyond max_trajectory_poses)
    windows         (run, seq): window number, first frame index, the similarity into window 0, the
                    overlap error; exactly the windowed policy's records
    map_inserts     (run, seq): the points of each merge into the voxel map (internal frame), in order
    map_checkpoints (run): the voxel map's full state (its pitch included) after insert ``upto_seq``;
                    the inserts up to it are deleted, so a long run's map takes about its bounded
                    in-memory size on disk; a new pitch (the metric scale became known) is one
    finished_streams (run): with ``scale_source odometry``, the streams a restart that kept the map
                    ended, as MapStore holds them in ``map`` (store/map_store.py): the voxel map's state
                    and the base poses (keys, stamps_ns, poses); the tables above then hold the live
                    stream only
    continuations   (run): what a resumed run continues from (database/resume.py), stored at a clean end and
                    while mapping: the window number, the next frame index, the stream's placement in
                    the internal frame, its window's provisional frames (index, points stored;
                    their points are the provisional inserts) and its scale state and odometry
                    (robot.StreamFrames.stored); replaced whole each time
    overlap_frames  (run, seq): the continuation's frames, the window's newest ``ov``: the decoded image
                    as received (lossless), the window's warped result the next window aligns to (pose
                    encoding, depth, keyframe flag)
    keyframe_images (run, idx): (schema 2) each final keyframe's image as received, as JPEG
                    (colmap.keyframe_jpeg), its size and the model's intrinsics at that size: what the
                    COLMAP export needs beyond the poses and the map; kept as long as the frame's pose
    rigs            (id): (schema 3) a camera rig (mapping/rig/) recorded by one writer: its primary camera
    rig_cameras     (run): (schema 3) the runs that form a rig, one per camera: the rig, the camera's
                    position and name, and its scale against the primary (primary map units per
                    unit of its own map; NULL while unknown), how it was found and its status text
                    (rig/scale.py), kept up to date while mapping. Each run holds its camera's
                    records in the tables above, as a single camera's run does; a rig is pruned
                    (``apply_retention``) as one

The map is stored as its inputs, not its voxels: replaying the inserts into an empty VoxelMap of
the run's voxel size and bound gives the in-memory map bit for bit (the voxel map is a
deterministic function of its inserts), and the conversion into ``map`` is applied on the way
out, as ``Mapper.save`` does. Provisional points (a windowed run's last frames, when the run ended
cleanly) are inserts with ``provisional = 1``, replayed into a copy as ``Mapper.map_points`` does;
a checkpoint keeps them (their continuation replaces them).

A rig's cameras are written by one writer (one connection, one transaction: writer.py).
One process writes at a time (writer_lock.py); readers (``lingbot-ros-map``, a resume) need no
lock and open the file read-only (``connect``). A run's own row is read back by run_info.py, the
older runs are marked and pruned by retention.py.
"""
from __future__ import annotations

import errno
import os
import sqlite3
import urllib.parse
from pathlib import Path

from ..files.paths import ros_home
from .blobs import MapDatabaseError

SCHEMA_VERSION = 3
RUNNING, CLEAN, CRASHED = "running", "clean", "crashed"

_MIGRATIONS = {
    1: """
CREATE TABLE runs (
    id INTEGER PRIMARY KEY,
    started_ns INTEGER NOT NULL,
    last_commit_ns INTEGER,
    ended_ns INTEGER,
    ending TEXT NOT NULL DEFAULT 'running',
    settings TEXT NOT NULL,
    model TEXT NOT NULL,
    scale REAL NOT NULL DEFAULT 1.0,
    scale_known INTEGER NOT NULL DEFAULT 0,
    mount BLOB,
    origins BLOB
);
CREATE TABLE frames (
    run INTEGER NOT NULL, idx INTEGER NOT NULL, stamp_ns INTEGER NOT NULL, pose BLOB NOT NULL,
    keyframe INTEGER NOT NULL, window INTEGER NOT NULL, final INTEGER NOT NULL,
    PRIMARY KEY (run, idx)) WITHOUT ROWID;
CREATE TABLE windows (
    run INTEGER NOT NULL, seq INTEGER NOT NULL, window INTEGER NOT NULL, first_index INTEGER NOT NULL,
    scale REAL NOT NULL, rotation BLOB NOT NULL, translation BLOB NOT NULL, overlap_error REAL,
    PRIMARY KEY (run, seq));
CREATE TABLE map_inserts (
    run INTEGER NOT NULL, seq INTEGER NOT NULL, xyz BLOB NOT NULL, rgb BLOB NOT NULL,
    provisional INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (run, seq));
CREATE TABLE map_checkpoints (run INTEGER PRIMARY KEY, upto_seq INTEGER NOT NULL, state BLOB NOT NULL);
CREATE TABLE finished_streams (run INTEGER PRIMARY KEY, map_state BLOB NOT NULL, poses BLOB NOT NULL);
CREATE TABLE continuations (
    run INTEGER PRIMARY KEY, window INTEGER NOT NULL, next_index INTEGER NOT NULL, stream BLOB NOT NULL);
CREATE TABLE overlap_frames (
    run INTEGER NOT NULL, seq INTEGER NOT NULL, idx INTEGER NOT NULL, stamp_ns INTEGER NOT NULL,
    rgb BLOB NOT NULL, pose_enc BLOB NOT NULL, depth BLOB NOT NULL, keyframe INTEGER NOT NULL,
    PRIMARY KEY (run, seq));
""",
    2: """
CREATE TABLE keyframe_images (
    run INTEGER NOT NULL, idx INTEGER NOT NULL, width INTEGER NOT NULL, height INTEGER NOT NULL,
    intrinsic BLOB NOT NULL, jpeg BLOB NOT NULL, PRIMARY KEY (run, idx)) WITHOUT ROWID;
""",
    3: """
CREATE TABLE rigs (id INTEGER PRIMARY KEY, primary_camera TEXT NOT NULL);
CREATE TABLE rig_cameras (
    run INTEGER PRIMARY KEY, rig INTEGER NOT NULL, position INTEGER NOT NULL, camera TEXT NOT NULL,
    scale REAL, scale_source TEXT NOT NULL DEFAULT 'unknown', scale_text TEXT NOT NULL DEFAULT '');
""",
}
JOURNAL_SUFFIXES = ("-wal", "-shm", "-journal")   # SQLite's files beside the database
RUN_TABLES = ("frames", "windows", "map_inserts", "map_checkpoints", "finished_streams", "continuations",
              "overlap_frames", "keyframe_images", "rig_cameras")


def resolve_path(text: str) -> Path:
    """The ``map_database`` setting -> a path: ``$ROS_HOME`` is ROS_HOME, or ~/.ros without it."""
    return Path(os.path.expanduser(text.replace("$ROS_HOME", str(ros_home()))))


def describe_error(error: BaseException, path: Path) -> str:
    text = str(error)
    if isinstance(error, sqlite3.Error):
        lowered = text.lower()
        if "readonly" in lowered or "read-only" in lowered:
            return f"{path} is read-only ({text})"
        if "full" in lowered:
            return f"the disk holding {path} is full ({text})"
        if "not a database" in lowered or "malformed" in lowered or "corrupt" in lowered:
            return f"{path} is corrupt, left untouched ({text})"
    if isinstance(error, PermissionError):
        return f"{path} cannot be written ({error.strerror})"
    if isinstance(error, OSError) and error.errno in (errno.EROFS, errno.ENOSPC):
        return (f"{path} is read-only ({error.strerror})" if error.errno == errno.EROFS
                else f"the disk holding {path} is full ({error.strerror})")
    return f"{path}: {type(error).__name__}: {text}"


def connect(path: Path, readonly: bool) -> sqlite3.Connection:
    """A connection (autocommit: transactions are explicit) that has checked the file is a sound
    database of a schema this code knows. Raises MapDatabaseError."""
    _refuse_linked_journal(path)
    try:
        if readonly:
            conn, check = _open_readonly(path)
        else:
            # The resolved path: the journal (-wal, -shm) beside the file itself, whichever path reached it.
            conn = sqlite3.connect(os.path.realpath(path), isolation_level=None, check_same_thread=False,
                                   timeout=0.5)
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            conn.close()
            raise MapDatabaseError(f"{path} is corrupt, left untouched (quick_check: {check})")
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        version = conn.execute("SELECT version FROM schema_version").fetchone()[0] \
            if "schema_version" in tables else 0
        if version > SCHEMA_VERSION:
            conn.close()
            raise MapDatabaseError(f"{path} has schema version {version}, newer than this lingbot_ros's "
                                   f"{SCHEMA_VERSION}; left untouched")
        if version == 0 and tables:
            conn.close()
            raise MapDatabaseError(f"{path} is an SQLite file of something else (tables {sorted(tables)}); "
                                   "left untouched")
        if readonly:
            if version == 0:
                conn.close()
                raise MapDatabaseError(f"{path} is not a map database (empty)")
            return conn
        conn.execute("PRAGMA journal_mode = WAL")
        # FULL: a commit survives a power cut too (the fsync is the writer thread's, never the frame loop's).
        conn.execute("PRAGMA synchronous = FULL")
        if version < SCHEMA_VERSION:
            conn.execute("BEGIN IMMEDIATE")
            if version == 0:
                conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
                conn.execute("INSERT INTO schema_version VALUES (0)")
            for step in range(version + 1, SCHEMA_VERSION + 1):
                for statement in filter(str.strip, _MIGRATIONS[step].split(";")):
                    conn.execute(statement)
            conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
            conn.execute("COMMIT")
        return conn
    except MapDatabaseError:
        raise
    except (sqlite3.Error, OSError) as error:
        raise MapDatabaseError(describe_error(error, path)) from None


def _refuse_linked_journal(path: Path) -> None:
    """SQLite refuses a symlink at the database's -wal, -shm or -journal (it would write its journal
    into the file the link points at) with a bare "unable to open database file": say which."""
    for suffix in JOURNAL_SUFFIXES:
        journal = f"{os.path.realpath(path)}{suffix}"
        if os.path.islink(journal):
            raise MapDatabaseError(f"{journal} is a symlink, not followed (SQLite would write its journal into "
                                   "the file it points at); remove it")


def _open_readonly(path: Path) -> tuple[sqlite3.Connection, str]:
    """A read-only connection (URI mode=ro: the database file is never written; in a writable
    directory SQLite makes the -wal and -shm it reads alongside a writer with, empty when none
    writes) and its quick_check. A WAL database closed cleanly on a read-only file system has no
    -shm and none can be made: it is opened ``immutable`` then (no writer can be changing it there)."""
    real = os.path.realpath(path)
    uri = f"file:{urllib.parse.quote(real)}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        return conn, conn.execute("PRAGMA quick_check").fetchone()[0]
    except sqlite3.OperationalError:
        if _writable_directory(path):
            raise
        if os.path.exists(f"{real}-wal"):   # immutable would skip the writer's last commits in it
            raise MapDatabaseError(f"{path} cannot be read on this read-only disk: its -wal holds the last commits "
                                   "of a writer that did not end, and SQLite cannot make the -shm it reads them "
                                   "with here; copy the file with its -wal to a writable disk") from None
    conn = sqlite3.connect(uri + "&immutable=1", uri=True, isolation_level=None, check_same_thread=False)
    return conn, conn.execute("PRAGMA quick_check").fetchone()[0]


def _writable_directory(path: Path) -> bool:
    directory = os.path.dirname(os.path.realpath(path))
    try:
        return not os.statvfs(directory).f_flag & os.ST_RDONLY and os.access(directory, os.W_OK)
    except OSError:
        return False
