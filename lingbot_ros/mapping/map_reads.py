"""Reading the map a Mapper holds without changing it: the points, the live view's samples, the
trajectory and path in ``map``, the window records, and the saved map's files.

``MapReads`` reads the map store and the stream the Mapper passes in (a restart replaces the
stream, never the store). A windowed run's provisional keyframes are read with their current
values, as if the stream ended here; they enter the map itself only when final.
"""
from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import numpy as np

from .files.export import write_map_files
from .files.staged_files import StagedFiles
from .records import SavedMap
from .store.map_store import MapStore
from .store.trajectory import StampedPose, Trajectory
from .streams import StreamState, Streams


class MapReads:
    def __init__(self, store: MapStore, streams: Streams, settings):
        self.store, self.streams, self.settings = store, streams, settings

    def provisional_points(self, stream: StreamState) -> list[tuple[np.ndarray, np.ndarray]]:
        windows, s = stream.windows, self.settings
        return [] if windows is None else windows.provisional_points(s.min_confidence, s.map_points_stride)

    def points(self, stream: StreamState) -> tuple[np.ndarray, np.ndarray]:
        """The map (xyz float32 [N, 3] in map, rgb uint8 [N, 3]), the newest keyframe included
        (merged for good: a later rollback no longer removes its points) and the provisional ones."""
        xyz, rgb = self.store.points(stream.frames.conversion, self.provisional_points(stream))
        finite = np.isfinite(xyz).all(axis=1)
        if not finite.all():   # every frame's points were checked: a conversion overflowed float32
            raise FloatingPointError(f"{int((~finite).sum())} of {len(xyz)} map points are not finite: the map "
                                     "is not published or saved")
        return xyz, rgb

    def view(self, stream: StreamState, point_budget: int, pose_budget: int) -> Future:
        """What a live view draws (store/map_view.py): even samples of the map (provisional keyframes
        included, as in ``points``) and of the camera path. The future's MapView: the path is read
        here, the map sampled on the map builder's thread (the frame loop never waits for the
        map). The held keyframe stays undoable."""
        windows, s = stream.windows, self.settings
        provisional = list if windows is None else windows.provisional_points_later(s.min_confidence,
                                                                                    s.map_points_stride)
        return self.store.view(stream.frames.conversion, provisional, point_budget, pose_budget)

    def trajectory(self, stream: StreamState) -> Trajectory:
        """The robot base's poses in map (what ``save`` writes), oldest first."""
        return self.store.trajectory(stream.frames.conversion)

    def path_poses(self, stream: StreamState, count: int | None) -> list[tuple[StampedPose, object]]:
        """The newest ``count`` poses (None: all), oldest first, as (entry, conversion) with
        T_M_base = conversion.base_pose(entry.pose), or entry.pose itself where conversion is None.
        Both are immutable, so a caller may cache what it built from them by identity."""
        store = self.store
        return store.newest_poses(store.max_poses if count is None else count, stream.frames.conversion)

    def window_records(self, stream: StreamState) -> list:
        """The windows of what is saved (ended streams still in the map, then the current one)."""
        windows = stream.windows
        return [*self.streams.ended.records, *(windows.records if windows is not None else [])]

    def save(self, stream: StreamState, directory: str | Path, staged: StagedFiles | None) -> SavedMap:
        """The map's files in ``directory``, all or none; with ``staged`` only staged there, for
        the caller to commit with its own files (files/export.write_map_files)."""
        xyz, rgb = self.points(stream)
        trajectory = self.trajectory(stream)
        ply, tum = write_map_files(directory, xyz, rgb, trajectory,
                                   self.window_records(stream) if stream.windows is not None else None,
                                   units="m" if stream.frames.conversion.metric.known else "model units",
                                   staged=staged)
        return SavedMap(str(ply), str(tum), len(xyz), len(trajectory))
