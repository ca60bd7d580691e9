"""RigMapper: several cameras, one model, one batched model step per group of frames, one map.

Each camera is an ordinary ``Mapper`` (its own stamps, windows, keyframe and long-run policies,
restarts, camera mount and map store) whose session is its stream of the rig's one
``MultiStreamSession`` (session_view.py). The rig runs the cameras' verbs through the baton
(baton.py): their model steps of one call run as batched steps, and the outputs are those of
separate Mappers fed the same frames. The cameras share one odometry buffer (one robot).

    process(frames) -> RigOutcome     ONE group: at most one frame per camera
    finish(), reset(reason) -> RigOutcome          every camera
    rollback_last_frame(camera) -> str; flush() -> str; warm_up(size) -> float
    set_camera_mount(camera, base_camera, source) -> bool; add_odometry(stamp_ns, pose, went_back_ok)
    camera(name) -> Mapper; snapshots; scales (scale.py); map_points(), save(directory) (rig_map.py)
    close()

Threads, as the Mapper's: one owner calls the verbs and the map reads (they run the cameras'
verbs in the baton's worker threads and wait); ``add_odometry`` and ``snapshots`` from any thread.

With ``map_database`` set the rig records into it through one writer: each camera's Mapper into
its own run, the rig and each camera's scale against the primary in ``rig_cameras``
(database/schema.py; ``lingbot-ros-map export`` of the rig writes what ``save`` writes).

The rig's map frame is the robot base at the start (the cameras start together): each camera's
``map`` is that frame at its own scale, brought to the primary camera's by its ``RigScale``.
"""
from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..database.recorder import MapRecorder, open_rig_recorders
from ..database.events import RIG_SCALES
from ..factory import RigBundle
from ..files.staged_files import StagedFiles
from ..mapper import Mapper
from ..placement.odometry import OdometryBuffer
from ..records import MapperSnapshot
from ..settings import MapperSettings
from ..store.trajectory import Trajectory
from ..warmup_size import WarmupSize
from . import rig_map
from .baton import Baton
from .cameras import check_cameras, check_rig_settings
from .grouping import RigFrame
from .records import RigOutcome, RigScale, SavedRigMap
from .scale import metric_scale, primary_scale, trajectory_scale
from .session_view import StreamView

# Base poses per camera the scale against the primary is estimated from (the newest).
SCALE_POSES = 2000


class RigMapper:
    def __init__(self, settings: MapperSettings, bundle: RigBundle, cameras: Sequence[str], primary: str | None = None):
        self.cameras, self.primary = check_cameras(cameras, primary)
        check_rig_settings(settings)
        if bundle.session.num_streams != len(self.cameras):
            raise ValueError(f"the bundle's session has {bundle.session.num_streams} streams for "
                             f"{len(self.cameras)} cameras (factory.build_rig makes one per camera)")
        self.settings = settings
        self._baton = Baton(bundle.session, self.cameras)
        self._odometry = OdometryBuffer()
        self._mappers: dict[str, Mapper] = {}
        self._recorders = open_rig_recorders(settings, bundle.description, self.cameras, self.primary)
        # The scales as last sent to the database, and when they are next due (monotonic s).
        self._stored_scales: dict[str, RigScale] | None = None
        self._scales_due = 0.0
        try:
            for stream, camera in enumerate(self.cameras):
                self._mappers[camera] = Mapper(settings, bundle.camera_bundle(StreamView(self._baton, stream)),
                                               self._odometry, self._recorders.get(camera))
        except BaseException:
            self.close()
            raise
        self._record_scales()   # the primary's 1 and the others' unknown, from the first commit on

    # -- verbs -----------------------------------------------------------------------------------

    def process(self, frames: Sequence[RigFrame]) -> RigOutcome:
        """One group of frames, at most one per camera; the cameras' model steps run batched."""
        seen = [frame.camera for frame in frames]
        for camera in seen:
            self.camera(camera)
        if len(set(seen)) != len(seen):
            raise ValueError(f"a group takes at most one frame per camera, got {seen}")
        return self._each({frame.camera: partial(self._mappers[frame.camera].process, frame.frame)
                           for frame in frames})

    def finish(self) -> RigOutcome:
        return self._each({camera: mapper.finish for camera, mapper in self._mappers.items()})

    def reset(self, reason: str) -> RigOutcome:
        return self._each({camera: partial(mapper.reset, reason) for camera, mapper in self._mappers.items()})

    def rollback_last_frame(self, camera: str) -> str:
        """That camera's newest frame undone (Mapper.rollback_last_frame: raises NothingToRollback,
        having changed nothing, where it cannot)."""
        return self.camera(camera).rollback_last_frame()

    def flush(self) -> str:
        return "; ".join(f"{camera}: {mapper.flush()}" for camera, mapper in self._mappers.items())

    def warm_up(self, size: WarmupSize | None = None) -> float:
        """Every camera's warm-up at once: the batched step of all cameras is what gets built."""
        start = time.perf_counter()
        self._each({camera: partial(mapper.warm_up, size) for camera, mapper in self._mappers.items()})
        return time.perf_counter() - start

    def set_camera_mount(self, camera: str, base_camera: np.ndarray, source: str) -> bool:
        return self.camera(camera).set_camera_mount(base_camera, source)

    def add_odometry(self, stamp_ns: int, pose: np.ndarray, went_back_ok: bool = False) -> bool:
        """T_odom_base at ``stamp_ns`` (any thread), for every camera."""
        return self._odometry.add(stamp_ns, pose, went_back_ok)

    def close(self) -> None:
        if len(self._mappers) == len(self.cameras):
            self._record_scales()
        for mapper in self._mappers.values():
            mapper.close()
        for recorder in self._recorders.values():   # a camera whose Mapper was never made: its run ends too
            recorder.close()
        self._baton.close()

    # -- reading ---------------------------------------------------------------------------------

    def camera(self, name: str) -> Mapper:
        """That camera's Mapper (its snapshot, path, outputs); read it, drive it through the rig."""
        try:
            return self._mappers[name]
        except KeyError:
            raise ValueError(f"no camera {name!r} in the rig ({', '.join(self.cameras)})") from None

    @property
    def snapshots(self) -> dict[str, MapperSnapshot]:
        return {camera: mapper.snapshot for camera, mapper in self._mappers.items()}

    @property
    def scales(self) -> dict[str, RigScale]:
        """Each camera's scale against the primary's (scale.py), from the newest SCALE_POSES base
        poses of each (a bounded cost, whatever the trajectories hold)."""
        primary = self._mappers[self.primary]
        reference = _newest_base_poses(primary)
        out = {}
        for camera, mapper in self._mappers.items():
            if camera == self.primary:
                out[camera] = primary_scale()
            elif primary.snapshot.scale_known and mapper.snapshot.scale_known:
                out[camera] = metric_scale()
            else:
                out[camera] = trajectory_scale(reference, _newest_base_poses(mapper))
        return out

    def map_points(self) -> tuple[np.ndarray, np.ndarray]:
        """The one map (xyz float32 [N, 3] in map at the primary's scale, rgb uint8 [N, 3])."""
        xyz, rgb, _ = self._union(self.scales)
        return xyz, rgb

    def save(self, directory: str | Path, staged: StagedFiles | None = None) -> SavedRigMap:
        """map.ply (the one map), preview.png, trajectory_<camera>.tum per camera at the primary's
        scale (a camera whose scale is unknown: in its own units, and said so); all or none."""
        scales = self.scales
        self._record_scales(scales)
        xyz, rgb, left_out = self._union(scales)
        trajectories = {camera: rig_map.scaled(mapper.saved_trajectory(), scales[camera])
                        for camera, mapper in self._mappers.items()}
        windows = {camera: mapper.window_records() if mapper.stream.windows is not None else None
                   for camera, mapper in self._mappers.items()}
        units = "m" if self._mappers[self.primary].snapshot.scale_known else "model units"
        return rig_map.save(directory, xyz, rgb, trajectories, self.primary, windows, units, left_out, staged)

    # -- internals -------------------------------------------------------------------------------

    def _union(self, scales: dict[str, RigScale]):
        nothing = (np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint8))
        parts = {camera: mapper.map_points() if scales[camera].known else nothing
                 for camera, mapper in self._mappers.items()}
        return rig_map.union(parts, scales, self.settings.map_voxel_size_m, self.settings.max_map_points)

    def _each(self, verbs: dict[str, Callable]) -> RigOutcome:
        """``verbs[camera]()`` for the named cameras through the baton; outcomes in camera order."""
        index = {camera: stream for stream, camera in enumerate(self.cameras)}
        done = self._baton.run({index[camera]: verb for camera, verb in verbs.items()})
        if time.monotonic() >= self._scales_due:
            self._record_scales()
        return RigOutcome({self.cameras[stream]: outcome for stream, outcome in sorted(done.items())})


    def _record_scales(self, scales: dict[str, RigScale] | None = None) -> None:
        """The scales to the map database where they changed: after a verb at most every
        map_database_commit_s (the writer commits no more often; estimating them reads every
        camera's newest poses), and at a save and at close."""
        recorder = self._mappers[self.primary].recorder
        if not isinstance(recorder, MapRecorder) or not recorder.active:
            return
        self._scales_due = time.monotonic() + self.settings.map_database_commit_s
        scales = self.scales if scales is None else scales
        if scales != self._stored_scales:
            self._stored_scales = scales
            recorder.writer.put((RIG_SCALES, scales))


def _newest_base_poses(mapper: Mapper) -> Trajectory:
    """T_map_base of the camera's newest SCALE_POSES poses, oldest first."""
    out = Trajectory()
    for entry, conversion in mapper.path_poses(SCALE_POSES):
        out.append(entry.stamp_ns, entry.pose if conversion is None else conversion.base_pose(entry.pose))
    return out
