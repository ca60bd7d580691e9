"""The Mapper's status: what it counted and what state it is in, and the snapshot built from values.

``MapperStatus`` is immutable and replaced whole at each change (``counted``, ``entered``), so a
restart or a reset cannot leave one field behind. ``snapshot`` assembles the published
``MapperSnapshot`` from values only (the status, the stream, the cache usage, the map's sizes): it
never calls back into the Mapper.
"""
from __future__ import annotations

import dataclasses

from .records import WAITING, InputFrame, MapperSnapshot


@dataclasses.dataclass(frozen=True)
class Counts:
    processed: int = 0
    rejected: int = 0
    failed: int = 0
    restarts: int = 0
    rolled_back: int = 0
    cleared: int = 0


@dataclasses.dataclass(frozen=True)
class MapperStatus:
    state: int = WAITING
    text: str = "waiting for images"
    counts: Counts = Counts()
    last_error: str = ""
    restart_reason: str = ""          # why the stream restarted, until the new one tracks
    model_ms: float = 0.0             # the newest frame's model time
    last_frame: InputFrame | None = None
    last_placed: int | None = None    # index of the newest frame that got its pose

    def counted(self, **added: int) -> MapperStatus:
        counts = self.counts
        return dataclasses.replace(self, counts=dataclasses.replace(
            counts, **{name: getattr(counts, name) + n for name, n in added.items()}))

    def entered(self, state: int, text: str) -> MapperStatus:
        return dataclasses.replace(self, state=state, text=text)


def tracking_text(stream) -> str:
    """'tracking', and while the window a resume started runs, that resume and how well its
    stored frames ran again (the overlap error: README, The map database)."""
    note, windows = stream.resume_note, stream.windows
    if note is None or windows.number != note[0] or windows.similarity is None:
        return "tracking"
    return f"tracking; {note[1]}, window {note[0]} aligned with overlap error {windows.last_overlap_error:.3g}"


def init_text(stream, needed: int, restart_reason: str) -> str:
    text = f"initialising {len(stream.run.awaiting)}/{needed}"
    # Until the new stream tracks, its state says why it restarted.
    return f"{text} (restarted: {restart_reason})" if restart_reason else text


def snapshot(status: MapperStatus, stream, usage, *, needed: int, map_points: int, trajectory_poses: int,
             camera_mount: str, map_database: str, map_database_error: str) -> MapperSnapshot:
    """The snapshot of these values: ``stream`` a StreamState, ``usage`` the session's CacheUsage."""
    counts, last = status.counts, status.last_frame
    scale, applied = stream.frames.source.state(), stream.frames.conversion.metric
    windows = stream.windows
    window = {} if windows is None else {"window": windows.number, "window_scale": windows.last_scale,
                                         "window_overlap_error": windows.last_overlap_error}
    return MapperSnapshot(
        state=status.state, state_text=status.text, init_frames=stream.run.buffered_new(), init_frames_needed=needed,
        held_frames=stream.stamps.held, **dataclasses.asdict(counts), keyframes=usage.frames_stored,
        cache_pages=usage.pages, cache_bytes=usage.bytes_allocated, model_ms=status.model_ms, map_points=map_points,
        trajectory_poses=trajectory_poses, last_error=status.last_error, **window,
        # The scale outputs use (metric_scale.applied_scale), with the estimate's spread and reason.
        scale_known=applied.known, scale=applied.scale, scale_spread=scale.spread, scale_text=scale.reason,
        camera_mount=camera_mount, map_database=map_database, map_database_error=map_database_error,
        last_stamp_ns=None if last is None else last.stamp_ns)
