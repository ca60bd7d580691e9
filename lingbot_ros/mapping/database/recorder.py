"""The Mapper's seam to the map database: what it calls at its events, and nothing else.

    frame(output, window, final)   a frame's pose entered or changed in the trajectory (a final
                                   keyframe's image and intrinsics with it, for the COLMAP export)
    removed(index)                 a rolled-back frame left it
    cleared()                      a reset cleared the map and the trajectory
    points(xyz, rgb)               a keyframe's points were merged into the voxel map (MapStore)
    pitch(voxel_size)              the live voxel map was resampled at a new pitch (MapStore)
    stream_ended(map, poses)       an ended stream joined the finished part, in map (MapStore)
    sync(records, conversion, mount)   after every verb: the window records and the conversion into map
    continuation(c, points)        what a resumed run continues from (a Continuation:
                                   database/continuation.py) and the provisional keyframes' points,
                                   replacing the last one (None: the stream it was of ended)
    commit()                       commit now (a save; tests)
    close()                        the Mapper is done (a clean end)

Each call is a queue put for the writer thread (database/writer.py); with ``map_database`` empty the
Mapper holds a ``NoRecorder`` whose calls do nothing. A rig's cameras each hold a recorder of the
rig's one writer (``open_rig_recorders``), each putting its events for its own run (``slot``).
"""
from __future__ import annotations

import dataclasses
import threading

import numpy as np

from .schema import resolve_path
from .events import CLEARED, CONTINUATION, CONVERSION, FINISHED, FRAME, IMAGE, PITCH, POINTS, REMOVED, WINDOWS
from .writer import MapWriter
from ..records import MapperOutput


@dataclasses.dataclass(frozen=True)
class StoredFrame:
    """A resumed frame's stored value, made final at the end of its window (what ``frame`` reads
    of a MapperOutput)."""

    index: int
    stamp_ns: int
    internal_pose: np.ndarray
    is_keyframe: bool


class NoRecorder:
    """``map_database`` empty: nothing is stored."""

    text, failure, active = "off", "", False

    def frame(self, output, window: int, final: bool) -> None: ...
    def removed(self, index: int) -> None: ...
    def cleared(self) -> None: ...
    def points(self, xyz, rgb) -> None: ...
    def pitch(self, voxel_size: float) -> None: ...
    def stream_ended(self, finished_map, finished_poses) -> None: ...   # nothing reads them
    def sync(self, records, conversion, mount) -> None: ...
    def continuation(self, continuation, points=()) -> None: ...
    def commit(self, timeout: float = 60.0) -> bool: return False
    def close(self) -> None: ...


class MapRecorder:
    def __init__(self, writer: MapWriter, images: bool = True, slot: int = 0):
        self.writer = writer
        self.images = images   # map_database_images
        self.slot = slot       # its run in the writer (a rig's camera)
        self._records: tuple = ()
        self._conversion: tuple = (None, None)

    @property
    def text(self) -> str:
        return self.writer.text

    @property
    def failure(self) -> str:
        return self.writer.failure

    @property
    def active(self) -> bool:
        return not self.writer.failure

    def frame(self, output, window: int, final: bool) -> None:
        self._put((FRAME, output.index, output.stamp_ns, output.internal_pose, output.is_keyframe, window,
                         final))
        # A final keyframe's image as received (a reference) and the model's K on the host: 36 bytes
        # after the frame's own copy to the host (Mapper._output), so no other thread touches the
        # device; the writer thread takes K to the image's resolution and encodes. A resumed
        # frame's (not a MapperOutput) is stored already.
        if self.images and final and output.is_keyframe and isinstance(output, MapperOutput):
            result = output.result
            self._put((IMAGE, output.index, output.frame.rgb, result.intrinsic.detach().cpu(), result.image_size))

    def _put(self, event: tuple) -> None:
        self.writer.put(event, self.slot)

    def removed(self, index: int) -> None:
        self._put((REMOVED, index))

    def cleared(self) -> None:
        self._put((CLEARED,))

    def points(self, xyz, rgb) -> None:
        self._put((POINTS, xyz, rgb))

    def pitch(self, voxel_size: float) -> None:
        self._put((PITCH, voxel_size))

    def stream_ended(self, finished_map, finished_poses) -> threading.Event:
        """The finished part handed to the writer as it is, not copied (a full map's copy took
        hundreds of ms on the frame loop): the event is set once the writer has read it; until
        then MapStore changes only a copy of it."""
        released = threading.Event()
        self._put((FINISHED, finished_map, finished_poses, released))
        return released

    def sync(self, records, conversion, mount) -> None:
        """Send what changed since the last call (records and conversions are immutable and
        compared by identity: a new or dropped one is a new object)."""
        records = tuple(records)
        if len(records) != len(self._records) or any(a is not b for a, b in zip(records, self._records)):
            self._records = records
            self._put((WINDOWS, records))
        if conversion is not self._conversion[0] or mount is not self._conversion[1]:
            self._conversion = (conversion, mount)
            self._put((CONVERSION, conversion.scale, conversion.metric.known, mount.copy(),
                             np.concatenate([conversion.origin_internal, conversion.origin_map])))

    def commit(self, timeout: float = 60.0) -> bool:
        """Commit what was told so far (a save, a test); True once it is on disk."""
        return self.writer.commit(timeout)

    def continuation(self, continuation, points=()) -> None:
        self._put((CONTINUATION, continuation, list(points)))

    def close(self) -> None:
        """Its run ends (clean); the writer closes once every run of it has ended."""
        self.writer.close(slot=self.slot)


def open_recorder(settings, model: str, on_commit=None, resume_from: int | None = None) -> MapRecorder | NoRecorder:
    """The recorder ``settings.map_database`` asks for: a new run in that file (taking run
    ``resume_from`` over: its records move to the new run), or none."""
    if not settings.map_database:
        return NoRecorder()
    return MapRecorder(_writer(settings, model, on_commit=on_commit, resume_from=resume_from),
                       settings.map_database_images)


def open_rig_recorders(settings, model: str, cameras: tuple[str, ...], primary: str) -> dict[str, MapRecorder]:
    """A rig's recorders, one per camera, all of one writer (one run per camera, the rig recorded
    in the file: schema.py); {} with ``map_database`` empty."""
    if not settings.map_database:
        return {}
    writer = _writer(settings, model, cameras=cameras, primary=primary)
    return {camera: MapRecorder(writer, settings.map_database_images, slot) for slot, camera in enumerate(cameras)}


def _writer(settings, model: str, **options) -> MapWriter:
    return MapWriter(resolve_path(settings.map_database), dataclasses.asdict(settings), model,
                     settings.map_database_commit_s, settings.map_database_max_runs,
                     settings.map_database_max_mb, settings.max_trajectory_poses, settings.map_voxel_size_m,
                     settings.max_map_points, **options)
