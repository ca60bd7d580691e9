"""The saved map and trajectory, at one scale whatever restarts happened.

The live stream's keyframe points and poses are kept in its internal frame I (model units), so
that a scale estimate that moves converts them all alike when they are read. A restart that
keeps the map:

- with a constant scale (scale_source none or fixed) the next stream continues in the same I
  with the same conversion: nothing is converted, the map is what one stream would have made;
- with a scale of each stream's own (odometry) the ended stream is converted into ``map`` once,
  with the scale it had at its end, and joins the finished part (``end_stream``): each stream is
  in ``map`` at its own scale, and a later stream's estimate never rescales an earlier one.

Reading the map or the trajectory gives the finished part plus the live part converted with the
current conversion.

The voxel pitch is ``map_voxel_size_m`` in ``map`` units (metres once the scale is known): the live
map's pitch in I is that divided by the stream's scale, and is set again (its voxels resampled)
when the stream's scale first becomes known.

The newest final keyframe's points stay out of the map while that frame can still be rolled back
(``hold``); they go in when the next keyframe comes, or when the map is read.

Every change of the map itself (an insert, a new pitch, a clear) is told to the map database's
recorder (database/recorder.py) here, the one place it happens. The finished part goes to the recorder
without a copy; it is changed again only after the recorder has read it, or as a copy
(``_own_finished``).
"""
from __future__ import annotations

import itertools
from concurrent.futures import Future
from typing import Callable, TypeVar

import numpy as np

from ..placement.conversion import MapConversion
from ..placement.geometry import rigid_inverse
from .map_builder import MapBuilder
from .map_view import MapView, share, stride
from .trajectory import StampedPose, Trajectory
from .voxel_map import VoxelMap

T = TypeVar("T")


class MapStore:
    def __init__(self, voxel_size_m: float, max_points: int, max_poses: int, recorder):
        self.voxel_size_m, self.max_points, self.max_poses = voxel_size_m, max_points, max_poses
        self._recorder = recorder
        self._live = MapBuilder(VoxelMap(voxel_size_m, max_points))
        self._poses = Trajectory(max_poses)                 # live stream, T_I_camera
        self._finished_map = VoxelMap(voxel_size_m, max_points)   # earlier streams, in map
        self._finished_poses = Trajectory(max_poses)        # earlier streams, T_M_base
        self._finished_read = None   # set once the recorder has read the finished part it was handed
        self._held: tuple[int, tuple[np.ndarray, np.ndarray]] | None = None
        self._pitch_known = False

    # -- poses -----------------------------------------------------------------------------------

    def add_pose(self, index: int, stamp_ns: int, internal_pose: np.ndarray) -> None:
        self._poses.append(stamp_ns, internal_pose, key=index)

    def replace_pose(self, index: int, internal_pose: np.ndarray) -> None:
        self._poses.replace(index, internal_pose)

    def remove_pose(self, index: int) -> None:
        self._poses.remove(index)

    def internal_pose(self, index: int) -> np.ndarray:
        """The live stream's T_I_camera of frame ``index`` (searched from the newest)."""
        return next(p.pose for p in reversed(self._poses) if p.key == index)

    def num_poses(self) -> int:
        return min(len(self._finished_poses) + len(self._poses), self.max_poses)

    def newest_poses(self, count: int, conversion: MapConversion) -> list[tuple[StampedPose, MapConversion | None]]:
        """The newest ``count`` poses, oldest first, each with the conversion that makes it
        T_M_base (None: already in map)."""
        live = [(entry, conversion) for entry in self._poses.newest(count)]
        earlier = self._finished_poses.newest(count - len(live)) if count > len(live) else []
        return [(entry, None) for entry in earlier] + live

    def trajectory(self, conversion: MapConversion) -> Trajectory:
        """T_M_base of every pose kept, oldest first."""
        out = Trajectory(self.max_poses)
        for entry, conv in self.newest_poses(self.max_poses, conversion):
            out.append(entry.stamp_ns, entry.pose if conv is None else conv.base_pose(entry.pose), key=entry.key)
        return out

    # -- points ----------------------------------------------------------------------------------

    def hold(self, index: int, points: tuple[np.ndarray, np.ndarray]) -> None:
        """A final keyframe's points (in I): the previous held ones go into the map."""
        self.merge()
        self._held = (index, points)

    def drop_held(self, index: int) -> bool:
        """Frame ``index`` was rolled back: its points leave if they are still held."""
        if self._held is not None and self._held[0] == index:
            self._held = None
            return True
        return False

    def release(self) -> None:
        """Hand the staged inserts to the map thread (the caller is about to wait for the device)."""
        self._live.release()

    def merge(self) -> None:
        if self._held is not None:
            self._live.insert(*self._held[1])
            self._recorder.points(*self._held[1])
            self._held = None

    def set_pitch(self, conversion: MapConversion) -> None:
        """The stream's scale became known: voxels of ``map_voxel_size_m`` metres from now on."""
        if self._pitch_known or not conversion.metric.known:
            return
        self._pitch_known = True
        pitch = self.voxel_size_m / conversion.scale
        old = self._live.map
        if pitch != old.voxel_size_m:
            self._live.swap(old.resampled(pitch))
            self._recorder.pitch(pitch)

    def num_points(self) -> int:
        """Voxels so far (for status: never waits for the map builder)."""
        return len(self._finished_map) + len(self._live)

    def points(self, conversion: MapConversion, extra: list[tuple[np.ndarray, np.ndarray]] = ()) \
            -> tuple[np.ndarray, np.ndarray]:
        """The map in ``map`` (xyz float32, rgb uint8) with the held keyframe merged for good;
        ``extra``: more points in I that count as if in the map (provisional keyframes)."""
        self.merge()
        live = self._live.map
        if extra:
            live = live.copy()
            for xyz, rgb in extra:
                live.insert(xyz, rgb)
        xyz, rgb = live.points()
        if not len(self._finished_map):
            return conversion.points(xyz), rgb
        combined = self._finished_map.copy()
        combined.insert(conversion.points(xyz), rgb)
        return combined.points()

    def view(self, conversion: MapConversion, extra: Callable[[], list[tuple[np.ndarray, np.ndarray]]],
             point_budget: int, pose_budget: int) -> Future:
        """What a live view draws, in metres once the scale is known: the path read now
        (``view_path``), the points sampled on the map builder's thread (``view_points``); the
        future's MapView. The caller never waits for the map."""
        positions, poses = self.view_path(conversion, pose_budget)
        units = "m" if conversion.metric.known else "model units"
        return self.view_points(conversion, extra, point_budget, lambda xyz, rgb, total: MapView(
            xyz, rgb, total, positions, poses, units=units, voxel_size=self.voxel_size_m))

    def view_points(self, conversion: MapConversion, extra: Callable[[], list[tuple[np.ndarray, np.ndarray]]],
                    budget: int, then: Callable[[np.ndarray, np.ndarray, int], T]) -> Future:
        """``then(xyz, rgb, total)`` of at most ``budget`` of the map's points in ``map`` (xyz
        float32, rgb uint8), an even sample of every part (store/map_view.py), the held keyframe and
        the points ``extra()`` makes (in I) as points of their own, and how many points the parts
        hold: sampled, ``extra`` called, on the map builder's thread, in order after the inserts
        so far (the caller never waits). Changes nothing."""
        finished = self._finished_map   # changed only after the queue is done (end_stream), else replaced
        held = [self._held[1]] if self._held is not None else []
        return self._live.after(lambda live: then(*_sample(finished, live, held + list(extra()), conversion,
                                                           budget)))

    def view_path(self, conversion: MapConversion, budget: int) -> tuple[np.ndarray, int]:
        """At most ``budget`` camera positions in ``map`` [m, 3], oldest first, evenly sampled
        (the newest among them); and how many poses the trajectory holds."""
        # sample_path's picks (every k-th counted back from the newest) of newest_poses(max_poses),
        # taken without a list of them all: that cost the frame loop 0.3 s at 100,000 poses.
        live, finished = self._poses, self._finished_poses
        total = min(len(finished) + len(live), self.max_poses)
        every, in_live = stride(total, budget), min(len(live), total)
        newest_live = list(itertools.islice(reversed(live), 0, in_live, every))
        newest_earlier = list(itertools.islice(reversed(finished), -in_live % every, max(total - in_live, 0), every))
        picked = [(entry, None) for entry in reversed(newest_earlier)] + \
            [(entry, conversion) for entry in reversed(newest_live)]
        if not picked:
            return np.zeros((0, 3)), 0
        poses = np.array([entry.pose for entry, _ in picked]).reshape(-1, 4, 4)
        in_map = np.array([conv is None for _, conv in picked])
        positions = poses[:, :3, 3].copy()
        # Earlier streams are stored as T_M_base: the camera is T_M_base @ T_base_camera.
        base_camera = rigid_inverse(conversion.camera_base)
        positions[in_map] += poses[in_map, :3, :3] @ base_camera[:3, 3]
        live = ~in_map
        if live.any() and not conversion.is_identity:
            positions[live] = (conversion.scale * (positions[live] - conversion.origin_internal)
                               + conversion.origin_map)
        return positions, total

    @property
    def builder(self) -> MapBuilder:
        """The live stream's map builder (its inserts run on their own thread)."""
        return self._live

    @property
    def live_map(self) -> VoxelMap:
        """The live stream's voxels in I (waits for the map builder)."""
        return self._live.map

    # -- streams ---------------------------------------------------------------------------------

    def end_stream(self, conversion: MapConversion) -> None:
        """The stream ends and the map goes on: convert it into the finished part, once."""
        self.merge()
        self._own_finished()
        live = self._live.map
        if len(live):
            xyz, rgb = live.points()
            self._finished_map.insert(conversion.points(xyz), rgb)
        for entry in self._poses:
            self._finished_poses.append(entry.stamp_ns, conversion.base_pose(entry.pose), key=entry.key)
        self._finished_read = self._recorder.stream_ended(self._finished_map, self._finished_poses)
        self._new_live()

    def _own_finished(self) -> None:
        """Before the finished part changes: while the recorder may still be reading it, the store
        goes on with a copy (at most one stream end in a row pays it)."""
        read, self._finished_read = self._finished_read, None
        if read is not None and not read.is_set():
            poses = Trajectory(self.max_poses)
            for entry in self._finished_poses:
                poses.append(entry.stamp_ns, entry.pose, key=entry.key)
            self._finished_map, self._finished_poses = self._finished_map.copy(), poses

    def clear(self) -> int:
        """Forget everything; returns how many poses went."""
        count = self.num_poses()
        self._held = None
        # New objects, not cleared ones: the recorder may still be reading the old ones.
        self._finished_map = VoxelMap(self.voxel_size_m, self.max_points)
        self._finished_poses = Trajectory(self.max_poses)
        self._finished_read = None
        self._new_live()
        self._recorder.cleared()
        return count

    def resume(self, poses: Trajectory, voxel_map: VoxelMap, finished: tuple[VoxelMap, Trajectory] | None) -> None:
        """Start as a stored run (database/resume.py): its live stream's poses in I and voxels, and
        its finished part in map (earlier streams at their own scales), if any."""
        if finished is not None:
            self._finished_map, self._finished_poses = finished
            self._finished_read = None
        self._poses = poses
        self._live.swap(voxel_map)
        self._pitch_known = voxel_map.voxel_size_m != self.voxel_size_m

    def _new_live(self) -> None:
        self._live.swap(VoxelMap(self.voxel_size_m, self.max_points))
        self._poses.clear()
        self._pitch_known = False

    def close(self) -> None:
        self._live.close()


def _sample(finished: VoxelMap, live: VoxelMap, loose: list[tuple[np.ndarray, np.ndarray]],
            conversion: MapConversion, budget: int) -> tuple[np.ndarray, np.ndarray, int]:
    """MapStore.view_points' sample: ``finished`` in map, ``live`` and ``loose`` in I."""
    counts = [len(finished), len(live)] + [len(xyz) for xyz, _ in loose]
    xyz_parts, rgb_parts = [], []
    for part, count, quota in zip([finished, live, *loose], counts, share(counts, budget)):
        if not quota:
            continue
        every = stride(count, quota)
        if isinstance(part, VoxelMap):
            xyz, rgb = part.points(every)
        else:
            xyz, rgb = part[0][::every], part[1][::every]
        xyz_parts.append(xyz if part is finished else conversion.points(xyz))
        rgb_parts.append(rgb)
    if not xyz_parts:
        return np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint8), sum(counts)
    return np.concatenate(xyz_parts), np.concatenate(rgb_parts), sum(counts)
