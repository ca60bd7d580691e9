"""Mapper: the mapping application, one camera stream in, placed poses, depth and a map out.

Every front end (the ROS node's worker thread, the offline tool) drives one Mapper through the
same verbs, so the rules live here once: stamps, input checks, the keyframe policy, the long-run
policy, failure recovery, the frame convention, the bounded map and trajectory. The Mapper is
single-threaded: one owner calls its verbs; other threads read only ``snapshot`` (immutable).

    process(frame) -> StepOutcome     one input frame (0..n outputs: phase 1 buffers; a frame past
                                      a forward stamp jump is held until the next one decides)
    finish()       -> StepOutcome     end of the input: buffered frames run, provisional ones final,
                                      a held frame is refused (nothing confirmed its jump)
    reset(reason)                     the operator's reset: restart the stream, clear the map
    rollback_last_frame() -> str      undo the newest frame (pose, points, cache); a refusal
                                      (NothingToRollback) changes nothing
    flush() -> str                    make deferred evictions final
    new_window() -> str               the windowed policy's next window starts at the next frame
    warm_up() -> float                dummy frames before the first real one (seconds)
    map_points(), saved_trajectory(), path_poses(n), save(directory), snapshot
    view(point_budget, pose_budget) -> MapView    samples for a live view (store/map_view.py), no change
    add_odometry(stamp_ns, pose, went_back_ok), odometry_at(stamp_ns)   (any thread)

Vocabulary (code, notices, status and diagnostics use it alike):

    restart        a stream ends and the next begins: the session, the stamp rule's reference,
                   the scale estimate and the window bookkeeping start anew (``_end_stream``, the
                   one path). It keeps the map (an image size change, a model failure, the reset
                   policy's cache cap: the next stream continues from the last pose) or clears it
                   (a stamp gap or jump back, a reset). Counted in ``snapshot.restarts``
                   (MapStatus ``restarts``, diagnostics ``stream_restarts``); the state is
                   RESTARTED until the new stream's first pose, its text "restarted: <reason>".
    reset          the operator's verb (``reset``, the node's ~/reset): a restart that clears
                   the map. (The ``reset`` long-run policy is named for the session it resets at a
                   cap; its restarts keep the map.)
    window switch  the windowed policy's next window: the same stream, a new session run
                   (streams.py); not a restart, never announced as one.
    session reset  ``StreamingSession.reset()``, done at every restart and window switch.

Per-stream state lives in one ``StreamState`` (streams.py) that every restart replaces
whole through ``_end_stream``; the map and trajectory in ``MapStore`` (store/map_store.py, which says
how a saved map stays at one scale); the conversion into ``map`` in placement/conversion.py. The map database
(database/recorder.py) hears every pose at the verbs below and every map change from MapStore; a
``resume`` setting starts the Mapper as the database's last run (database/resume.py).
"""
from __future__ import annotations

import collections
import dataclasses
import math
import time
import typing
from pathlib import Path

import numpy as np
import torch

from ..cache import NothingToRollback
from ..stream import ImageError
from .files.export import write_map_files
from .factory import SessionBundle
from .keyframes import MotionPolicy
from .windows.live import LiveWindows, Pending
from .store.map_store import MapStore
from .store.map_view import MapView
from .long_run import make_long_run_policy
from .database.recorder import open_recorder
from .database.resume import load_resumed
from .store.points import to_numpy
from .placement.robot import RobotFrames, StreamFrames
from .records import (BOUND, FAILED, INITIALISING, REJECTED, RESTART, RESTARTED, TRACKING, WAITING, InputFrame,
                      MapperOutput, MapperSnapshot, Notice, StepOutcome)
from .settings import LIVE, MapperSettings, SettingsError
from .files.staged_files import StagedFiles
from .stamps import DROP, REFUSE, RESTART as STAMP_RESTART, StampPolicy, seconds_text
from .streams import SessionRun, StreamState
from .store.trajectory import StampedPose, Trajectory


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _finite_float32(value: float) -> bool:
    """``value`` is finite and stays so as the float32 the outputs are published in."""
    return math.isfinite(value) and abs(value) <= _FLOAT32_MAX


class _StoredFrame(typing.NamedTuple):
    """A resumed frame's stored value, for the recorder (what it reads of a MapperOutput)."""

    index: int
    stamp_ns: int
    internal_pose: np.ndarray
    is_keyframe: bool


@dataclasses.dataclass(frozen=True)
class SavedMap:
    ply_path: str
    tum_path: str
    num_points: int
    num_poses: int

    @property
    def message(self) -> str:
        return (f"wrote {self.num_points} points to {self.ply_path} and {self.num_poses} poses to "
                f"{self.tum_path} (a top-down picture beside them: preview.png)")


class Mapper:
    def __init__(self, settings: MapperSettings, bundle: SessionBundle):
        self.settings = settings
        self.bundle = bundle
        self.session = bundle.session
        self.preprocessor = bundle.preprocessor
        self.long_run = make_long_run_policy(settings)
        self.robot = RobotFrames(settings)
        resumed, resume_text = (load_resumed(settings, bundle.device, bundle.preprocessor) if settings.resume
                                 else (None, ""))
        self.recorder = open_recorder(settings, bundle.description,   # the map database, or none
                                      resume_from=resumed.run if resumed else None)
        self._store = MapStore(settings.map_voxel_size_m, settings.max_map_points, settings.max_trajectory_poses,
                               self.recorder)
        if resumed is not None:
            self._store.resume(resumed.trajectory, resumed.voxel_map, resumed.finished)
            if resumed.mount is not None:
                self.robot.set_mount(resumed.mount, "the resumed run")
        self._records: list = []         # window records of the ended streams still in the map
        self._frames_in = 0              # index of the next input frame (since configure)
        self._counts = collections.Counter()
        self._state, self._state_text = WAITING, "waiting for images"
        self._last_error = ""
        self._last_frame: InputFrame | None = None
        self._last_placed: int | None = None   # index of the newest frame that got its pose
        self._last_map_pose: np.ndarray | None = None   # T_M_camera where the last ended stream stopped
        self._model_ms = 0.0
        self._warned_trajectory_bound = False
        self._restart_reason = ""
        self._continuation_due = 0.0     # monotonic time of the next continuation stored while mapping
        self._resume_note = None         # (windows, number, text): the resumed window's status says so
        self._stream = self._new_stream(*self.robot.first_stream())
        self._snapshot = MapperSnapshot(init_frames_needed=settings.num_scale_frames)
        if resumed is not None:
            resume_text = self._continue(resumed)
        if resume_text:
            self._set_state(WAITING, f"{resume_text}; waiting for images")
        self._publish_snapshot()   # the database's run holds the conversion (a fixed scale) from the start

    def _continue(self, resumed) -> str:
        """The stored run's map and trajectory are this Mapper's; its first frame continues them:
        the next window aligned to the stored window's last frames (as ``new_window`` does live)
        in the stored stream, at its scale; or, without them, a new stream from the last pose."""
        self._frames_in = resumed.next_index
        where = f"resumed run {resumed.run} ({resumed.ending}) at frame {resumed.next_index}"
        constant = self.robot.constant_scale
        if (self._stream.windows is not None and resumed.placement is not None and resumed.overlap
                and (constant or "odometry_stamps_ns" in resumed.carried)):
            frames = self._stream.frames
            if not constant:   # the stored stream's scale estimate and the odometry it reads go on
                frames = self.robot.resumed_stream(resumed.conversion, resumed.carried)
                for stamp_ns, pose in zip(resumed.carried["odometry_stamps_ns"].tolist(),
                                          resumed.carried["odometry_poses"]):
                    self.robot.odometry.add(stamp_ns, pose)
            self._stream = state = self._new_stream(resumed.placement, frames)
            windows = state.windows
            windows.records = list(resumed.records)
            inputs = [Pending(InputFrame(rgb=rgb, stamp_ns=stamp_ns), index, 0, False, self.preprocessor(rgb))
                      for index, stamp_ns, rgb, _ in resumed.overlap]
            windows.resume(resumed.window, inputs, [result for *_, result in resumed.overlap], resumed.provisional)
            first, last = inputs[0].index, inputs[-1].index
            self.recorder.continuation(self._continuation(with_points=False))   # a crash now resumes the same
            self._resume_note = (windows, resumed.window + 1, where)
            return f"{where}: window {resumed.window + 1} aligns to its stored frames {first}-{last}"
        why = resumed.stale or "no overlap frames stored"
        if not constant:   # the stored stream ends: the next one has a scale of its own
            newest = self._store.newest_poses(1, resumed.conversion)
            if newest:
                entry, conversion = newest[0]
                self._last_map_pose = (conversion.camera_pose(entry.pose) if conversion is not None
                                       else entry.pose @ self.robot.mount)
            self._store.end_stream(resumed.conversion)
            self._records = list(resumed.records)
            if self._last_map_pose is None:
                return f"{where}: it holds no frame, a new map starts"
            self._stream = self._new_stream(*self.robot.continuing_stream(self._last_map_pose))
            return f"{where}: {why}, a new stream at its own scale continues from the last pose"
        newest = self._store.newest_poses(1, self._stream.frames.conversion)
        if newest:   # as a restart that keeps the map: the stored windows are an ended stream's
            self._records = list(resumed.records)
            self._stream = self._new_stream(*self.robot.continuing_in(self._stream.frames.conversion,
                                                                      newest[0][0].pose))
            return f"{where}: {why}, a new stream continues from the last pose"
        return f"{where}: it holds no frame, a new map starts"

    # -- per-stream state ------------------------------------------------------------------------

    def _new_stream(self, placement, frames: StreamFrames) -> StreamState:
        s = self.settings
        windows = LiveWindows(s.window_rule(), s.window_alignment) if s.long_run_policy == "windowed" else None
        return StreamState(placement=placement, frames=frames,
                           stamps=StampPolicy(s.max_stamp_gap_s, s.max_stamp_jitter_s),
                           windows=windows, run=self._new_run())

    def _new_run(self) -> SessionRun:
        s = self.settings
        motion = MotionPolicy(s.keyframe_min_parallax_px) if s.keyframe_policy == "motion" else None
        return SessionRun.new(s.scale_frames + s.sliding_window + 1, s.keyframe_interval, motion)

    # -- verbs -----------------------------------------------------------------------------------

    @property
    def snapshot(self) -> MapperSnapshot:
        return self._snapshot

    def warm_up(self) -> float:
        """Run dummy frames of ``warmup_image_size`` through both phases (kernel builds, the
        CUDA graph capture, which survives the reset), then leave the session empty. Only before
        the first real frame: a live stream is never disturbed."""
        if self._last_frame is not None:
            raise RuntimeError("warm_up() runs before the first frame; the stream is live")
        start = time.perf_counter()
        width, height = self.settings.warmup_size()
        image = self.preprocessor(np.full((height, width, 3), 128, np.uint8))
        with torch.inference_mode():
            # With num_scale_frames > 1 step() only buffers; closing phase 1 runs it.
            self.session.step(image)
            self.session.close_scale_phase()
            self.session.step(image)
        self.session.reset()
        self._publish_snapshot()
        return time.perf_counter() - start

    def process(self, frame: InputFrame) -> StepOutcome:
        """One input frame through the stamp rule (stamps.py): taken, dropped, held for the next
        frame to decide, or, with a held one, both in order."""
        outcome = StepOutcome()
        for verdict, item in self._stream.stamps.decide(frame.stamp_ns, frame.gap_ns, frame):
            if verdict.action in (DROP, REFUSE):
                self._reject(outcome, verdict.reason)
                continue
            if verdict.action == STAMP_RESTART:
                self._end_stream(outcome, verdict.reason, keep_map=False)
            self._take(outcome, item)
        return self._done(outcome)

    def _take(self, outcome: StepOutcome, frame: InputFrame) -> None:
        """A frame the stamp rule let through: into the current stream."""
        try:
            image = self.preprocessor(frame.rgb)
        except ImageError as error:
            self._reject(outcome, f"image skipped: {error}")
            return
        size = (frame.rgb.shape[1], frame.rgb.shape[0])
        known = self._stream.input_wh
        if known is not None and size != known:
            self._end_stream(outcome, f"image size changed from {known[0]}x{known[1]} to {size[0]}x{size[1]}",
                             keep_map=True)
        state = self._stream
        state.input_wh = size
        state.stamps.accept(frame.stamp_ns)
        index = self._frames_in
        self._frames_in += 1
        self._last_frame = outcome.taken = frame
        self._model_ms = 0.0
        try:
            if state.windows is not None and state.windows.switch_due:
                self._switch_window(outcome)
            self._run(outcome, Pending(frame, index, 0, False, image))
        except Exception as error:   # e.g. CUDA out of memory: report, restart the stream, go on
            self._fail(outcome, frame, index, error)
            return
        reason = self.long_run.restart_reason(self.session.stats())
        if reason:
            self._end_stream(outcome, reason, keep_map=True)
        else:
            self._store_continuation()

    def finish(self) -> StepOutcome:
        """End of the input: a stream shorter than num_scale_frames runs as a short phase 1, and
        every provisional output becomes final. The map holds every keyframe afterwards."""
        outcome = StepOutcome()
        self._close(outcome, lost=False)
        self._store.merge()
        return self._done(outcome)

    def reset(self, reason: str) -> StepOutcome:
        outcome = StepOutcome()
        self._end_stream(outcome, reason, keep_map=False)
        return self._done(outcome)

    def rollback_last_frame(self) -> str:
        """Undo the newest frame: cache, pose (trajectory), points (if not yet merged). Raises
        NothingToRollback, having changed nothing, when the newest frame cannot be undone: none
        given, a phase-1 frame already placed, a frame not stored in the cache (keyframe
        interval, motion policy) or one a window runs again for its alignment."""
        state = self._stream
        run, windows = state.run, state.windows
        buffered = bool(run.awaiting)
        if not buffered:
            if not run.stored:
                raise NothingToRollback("no stored phase-2 frame to roll back (phase-1 frames need a reset)")
            if not run.given or run.given[-1] != run.stored[-1]:
                newest = run.given[-1] if run.given else "?"
                raise NothingToRollback(
                    f"the newest frame ({newest}) is not stored in the cache (not a keyframe): only the "
                    "newest frame can be rolled back, and only while it is stored")
        why = windows.refuses_rollback(had_result=not buffered) if windows is not None else ""
        if why:
            raise NothingToRollback(why)
        before = self._cache_numbers()[0]
        self.session.rollback_last_frame()        # refuses before changing anything
        run.given.pop()
        if buffered:                               # a buffered phase-1 frame was dropped
            run.awaiting.pop()                     # its index stays used: indices never repeat
            if windows is not None:
                windows.forget_newest(had_result=False)
            self._set_state(INITIALISING, self._init_text())
            self._publish_snapshot()
            return "dropped the newest buffered scale frame"
        index = run.stored.pop()
        self._store.remove_pose(index)
        self.recorder.removed(index)
        self._continuation_due = 0.0   # the stored one may hold this frame: store the next one soon
        provisional = windows.forget_newest(had_result=True) if windows is not None else None
        self._counts["rolled_back"] += 1
        if provisional is not None:
            points = "it was provisional: its points were never in the map"
        elif self._store.drop_held(index):
            points = "its points left the map"
        else:
            points = "its points were already merged into the map and stay"
        self._publish_snapshot()
        return (f"rolled back frame {index}: {before} frames in cache before, {self._cache_numbers()[0]} "
                f"after; {points}")

    def flush(self) -> str:
        before = self._cache_numbers()
        self.session.flush()
        after = self._cache_numbers()
        self._publish_snapshot()
        return (f"flushed deferred evictions: {before[0]} frames / {before[1]} pages before, "
                f"{after[0]} / {after[1]} after")

    def new_window(self) -> str:
        """Start the next window at the next frame (an operator entering a new area). The last
        ``ov`` frames keep the values they have (they are final or become so as usual); the new
        window runs them again only to be aligned to them. Raises ValueError, having changed
        nothing, when it cannot."""
        windows = self._stream.windows
        if windows is None:
            raise ValueError("new_window needs long_run_policy windowed")
        refusal = windows.switch_refusal()
        if refusal:
            raise ValueError(refusal)
        windows.switch_asked = True
        return f"window {windows.number + 1} starts at the next frame"

    def close(self) -> None:
        """End the run in the map database (a clean end: the state a save now would write) and
        stop the map builder's thread (the owner is done with this Mapper)."""
        try:
            self._store.merge()
            self.recorder.continuation(self._continuation(with_points=True), self._provisional_points())
        except Exception:   # a map insert's or a device's error: it was reported where it happened
            pass
        self.recorder.close()
        self._store.close()

    def apply_live(self, settings: MapperSettings) -> None:
        """New values of LIVE settings (between frames; the others must not change)."""
        changed = {f.name for f in dataclasses.fields(settings)
                   if getattr(settings, f.name) != getattr(self.settings, f.name)}
        fixed = sorted(name for name in changed
                       if MapperSettings.__dataclass_fields__[name].metadata.get("when") != LIVE)
        if fixed:
            raise SettingsError(f"{fixed} cannot change while the Mapper runs")
        self.settings = settings
        state = self._stream
        if state.run.motion is not None:
            state.run.motion.min_parallax_px = settings.keyframe_min_parallax_px
        state.stamps.set_limits(settings.max_stamp_gap_s, settings.max_stamp_jitter_s)
        self.long_run = make_long_run_policy(settings)

    def map_points(self) -> tuple[np.ndarray, np.ndarray]:
        """The map (xyz float32 [N, 3] in map, rgb uint8 [N, 3]), the newest keyframe included
        (merged for good: a later rollback no longer removes its points). A windowed run's
        provisional keyframes are in it with their current values, as if the stream ended here;
        they enter the map itself only when final."""
        xyz, rgb = self._store.points(self._stream.frames.conversion, self._provisional_points())
        finite = np.isfinite(xyz).all(axis=1)
        if not finite.all():   # every frame's points were checked: a conversion overflowed float32
            raise FloatingPointError(f"{int((~finite).sum())} of {len(xyz)} map points are not finite: the map "
                                     "is not published or saved")
        return xyz, rgb

    def view(self, point_budget: int, pose_budget: int) -> MapView:
        """What a live view draws (store/map_view.py): even samples of the map (provisional keyframes
        included, as in ``map_points``) and of the camera path. Read without changing anything:
        the held keyframe stays undoable."""
        conversion = self._stream.frames.conversion
        xyz, rgb, total = self._store.view_points(conversion, self._provisional_points(), point_budget)
        positions, poses = self._store.view_path(conversion, pose_budget)
        return MapView(xyz, rgb, total, positions, poses, units="m" if conversion.metric.known else "model units",
                       voxel_size=self.settings.map_voxel_size_m)

    def _provisional_points(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """A windowed run's provisional keyframes' points (in I) with their current values: a
        resumed window's stored ones first, then the current window's."""
        s, windows = self.settings, self._stream.windows
        if windows is None:
            return []
        stored = [points for _, points in windows.resumed.values() if points is not None]
        return stored + [o.internal_points(s.min_confidence, s.map_points_stride)
                         for o in windows.provisional() if o.is_keyframe]

    def _continuation(self, with_points: bool) -> tuple:
        """What a resumed run needs to start the next window: (window number, next frame index,
        placement, the window's last ov frames as (index, stamp_ns, rgb, pose_enc, depth, keyframe),
        its provisional frames as (index, points stored) in the order of their points, the
        stream's scale state and odometry as arrays: StreamFrames.stored). Without
        points (a continuation stored while mapping) no provisional frame has stored points: the
        resumed window runs them again anyway, as they are among its last ov frames."""
        state = self._stream
        windows, overlap = state.windows, []
        if windows is not None and not windows.switch_refusal():
            frames = list(windows.inputs)[-windows.overlap:]
            for pending, result in zip(frames, list(windows.tail)[-windows.overlap:]):
                overlap.append((pending.index, pending.frame.stamp_ns, pending.frame.rgb, to_numpy(result.pose_enc),
                                to_numpy(result.depth), bool(result.is_keyframe)))
        provisional = [] if windows is None else (
            [(index, with_points and points is not None) for index, (_, points) in windows.resumed.items()]
            + [(o.index, with_points and o.is_keyframe) for o in windows.provisional()])
        # The stream's scale state, and the odometry its frames' next keyframe look-ups read.
        carried = state.frames.stored()
        if overlap and not self.robot.constant_scale:
            carried["odometry_stamps_ns"], carried["odometry_poses"] = self.robot.odometry.samples_since(overlap[0][1])
        return (windows.number if windows is not None else 0, self._frames_in, state.placement, overlap, provisional,
                carried)

    def _store_continuation(self) -> None:
        """While mapping, at most every map_database_continuation_s: the continuation a resume
        after a crash aligns to (its bytes: README, The map database)."""
        period, windows = self.settings.map_database_continuation_s, self._stream.windows
        now = time.monotonic()
        if (not period or now < self._continuation_due or windows is None or not self.recorder.active
                or windows.switch_refusal()):
            return
        self._continuation_due = now + period
        self.recorder.continuation(self._continuation(with_points=False))

    def saved_trajectory(self) -> Trajectory:
        """The robot base's poses in map (what save() writes), oldest first."""
        return self._store.trajectory(self._stream.frames.conversion)

    def path_poses(self, count: int | None = None) -> list[tuple[StampedPose, object]]:
        """The newest ``count`` poses (None: all), oldest first, as (entry, conversion) with
        T_M_base = conversion.base_pose(entry.pose), or entry.pose itself where conversion is None.
        Both are immutable, so a caller may cache what it built from them by identity."""
        store = self._store
        return store.newest_poses(store.max_poses if count is None else count, self._stream.frames.conversion)

    @property
    def camera_base(self) -> np.ndarray:
        """T_camera_base of the map's conversion (the saved trajectory's base poses -> camera poses)."""
        return self._stream.frames.conversion.camera_base

    def window_records(self) -> list:
        """The windows of what is saved (ended streams still in the map, then the current one)."""
        windows = self._stream.windows
        return self._records + (windows.records if windows is not None else [])

    def save(self, directory: str | Path, staged: StagedFiles | None = None) -> SavedMap:
        """The map's files in ``directory``, all or none; with ``staged`` only staged there, for
        the caller to commit with its own files (export.write_map_files)."""
        xyz, rgb = self.map_points()
        trajectory = self.saved_trajectory()
        ply, tum = write_map_files(directory, xyz, rgb, trajectory,
                                   self.window_records() if self._stream.windows is not None else None,
                                   units="m" if self._stream.frames.conversion.metric.known else "model units",
                                   staged=staged)
        self._publish_snapshot()
        return SavedMap(str(ply), str(tum), len(xyz), len(trajectory))

    def add_odometry(self, stamp_ns: int, pose: np.ndarray, went_back_ok: bool = False) -> bool:
        """T_odom_base at ``stamp_ns`` (any thread); False if the buffer ignored it (too old, or
        held). ``went_back_ok``: an old stamp means the stream went back (OdometryBuffer.add)."""
        return self.robot.odometry.add(stamp_ns, pose, went_back_ok)

    @property
    def odometry_max_age_s(self) -> float:
        """How far behind the newest odometry a sample may be stamped and still be kept."""
        return self.robot.odometry.max_age_s

    def odometry_at(self, stamp_ns: int) -> np.ndarray | None:
        """T_odom_base interpolated at ``stamp_ns`` (any thread), None where not known."""
        return self.robot.odometry.at(stamp_ns)

    def set_camera_mount(self, base_camera: np.ndarray, source: str) -> bool:
        """T_base_camera from TF, before the first frame (the map frame is defined by it); False
        once frames were processed (the mount then stays what it was)."""
        if self._frames_in:
            return False
        self.robot.set_mount(base_camera, source)
        self._stream = self._new_stream(*self.robot.first_stream())
        self._publish_snapshot()
        return True

    # -- internals -------------------------------------------------------------------------------

    def _run(self, outcome: StepOutcome, pending: Pending) -> None:
        """Give one frame to the session and place whatever results come back."""
        session, state = self.session, self._stream
        run = state.run
        in_phase2 = run.has_results
        if state.windows is not None:
            state.windows.enter(pending)
        run.awaiting.append(pending)
        run.given.append(pending.index)
        start = time.perf_counter()
        with torch.inference_mode():
            # Motion policy: store the frame (deferred eviction keeps the rollback exact), then
            # keep it and flush if the view moved enough, or roll it back. Scale frames are kept.
            results = session.step(pending.image, keyframe=True if run.motion is not None else None)
            kept = True
            if run.motion is not None:
                moved = run.motion.is_keyframe(pending.frame.rgb)   # phase 1: sets the reference
                if in_phase2:
                    if moved:
                        session.flush()
                    else:
                        session.rollback_last_frame()
                        kept = False
            self._store.release()   # the map thread works while this one waits (store/map_builder.py)
            if pending.image.is_cuda:
                # The step only queues GPU work; the model time ends when the outputs are ready
                # (they are copied to the host next anyway).
                torch.cuda.current_stream(pending.image.device).synchronize()
        self._model_ms += (time.perf_counter() - start) * 1e3
        if not results:
            self._set_state(INITIALISING, self._init_text())
            return
        if in_phase2 and kept and results[0].is_keyframe:
            run.stored.append(pending.index)      # not the image: no tensor is kept
        self._place(outcome, results, keyframe_kept=kept)

    def _place(self, outcome: StepOutcome, results, keyframe_kept: bool = True) -> None:
        """Session results, one per awaiting frame in order -> placed outputs."""
        state = self._stream
        windows = state.windows
        batch = len(results) > 1
        for result in results:
            # Left in ``awaiting`` until placed: a failure while placing it counts it as lost (_fail).
            pending = state.run.awaiting[0]
            is_keyframe = bool(result.is_keyframe) and (keyframe_kept or batch)
            trusted = not (batch or state.untrusted_next)
            state.untrusted_next = False
            if windows is None:
                self._emit(outcome, pending, result, is_keyframe, trusted, final=True)
            else:
                for ready, warped in windows.place(pending, result):
                    keyframe = is_keyframe if ready is pending else bool(warped.is_keyframe)
                    if ready.rerun:
                        if windows.is_provisional(ready.index):
                            self._rerun(outcome, ready, warped, keyframe)
                    else:
                        self._emit(outcome, ready, warped, keyframe, trusted, windows.is_final(ready.position))
            state.run.awaiting.popleft()
        if results:
            state.run.has_results = True
            self._restart_reason = ""
            self._set_state(TRACKING, self._tracking_text())

    def _output(self, pending: Pending, result, is_keyframe: bool, trusted: bool, final: bool) -> MapperOutput:
        state = self._stream
        extrinsic, extremes = result.host_extrinsic()   # one copy: the pose and the outputs' checks
        internal = state.placement.camera_pose(extrinsic)
        conversion = state.frames.conversion
        camera_pose, base_pose = conversion.camera_pose(internal), conversion.base_pose(internal)
        # Whatever the cause: a counted failure (the caller's handler), never published, placed or saved.
        if not (np.isfinite(camera_pose).all() and np.isfinite(base_pose).all()):
            raise FloatingPointError(f"non-finite pose for frame {pending.index}")
        intrinsic, depth, points = (float(v) for v in extremes)
        # Depth and points are published in map units (float32): scaled, they must stay finite too.
        if not (math.isfinite(intrinsic) and _finite_float32(depth * conversion.scale)
                and _finite_float32(points * conversion.scale)):
            raise FloatingPointError(f"non-finite depth, intrinsics or points for frame {pending.index} (largest "
                                     f"|value|: intrinsic {intrinsic:g}, depth {depth:g}, points {points:g}, "
                                     f"at scale {conversion.scale:g})")
        return MapperOutput(frame=pending.frame, index=pending.index, camera_pose=camera_pose,
                            base_pose=base_pose, internal_pose=internal, trusted=trusted,
                            is_keyframe=is_keyframe, provisional=not final, placement=state.placement,
                            result=result, conversion=conversion)

    def _emit(self, outcome, pending: Pending, result, is_keyframe: bool, trusted: bool, final: bool) -> None:
        """A frame's first output: published now; final now or when its window's successor ran."""
        output = self._output(pending, result, is_keyframe, trusted, final)
        store = self._store
        if store.num_poses() == store.max_poses and not self._warned_trajectory_bound:
            self._warned_trajectory_bound = True
            outcome.notices.append(Notice(BOUND, (
                f"the trajectory holds max_trajectory_poses={store.max_poses} poses: the oldest "
                "are dropped from now on (the saved trajectory starts later)")))
        store.add_pose(output.index, output.stamp_ns, output.internal_pose)
        self._counts["processed"] += 1
        self._last_placed = output.index
        outcome.new.append(output)
        if final:
            self._finalise(outcome, output)
        else:
            self._stream.windows.hold(output)
            self.recorder.frame(output, self._stream.windows.number, final=False)

    def _rerun(self, outcome, pending: Pending, result, is_keyframe: bool) -> None:
        """An overlap frame run again by the next window: this run's value replaces the earlier
        one, final unless the frame is in this window's overlap too (overlap > L - overlap)."""
        windows = self._stream.windows
        final = windows.is_final(pending.position)
        output = self._output(pending, result, is_keyframe, True, final=final)
        self._store.replace_pose(output.index, output.internal_pose)
        if final:
            windows.finalised(pending.index)
            self._finalise(outcome, output)
        else:
            windows.hold(output)
            self.recorder.frame(output, windows.number, final=False)
            outcome.revised.append(output)

    def _finalise(self, outcome, output: MapperOutput) -> None:
        outcome.final.append(output)
        windows = self._stream.windows
        self.recorder.frame(output, windows.number if windows is not None else 0, final=True)
        if output.is_keyframe:   # the previous keyframe can no longer be rolled back on its own
            frames = self._stream.frames
            frames.keyframe(output.stamp_ns, output.internal_pose)
            self._store.set_pitch(frames.conversion)
            self._store.hold(output.index, output.internal_points(self.settings.min_confidence,
                                                                  self.settings.map_points_stride))

    def _close(self, outcome: StepOutcome, lost: bool) -> None:
        """The stream's input ends here: buffered frames run as a short phase 1 (``lost``: they
        are dropped, the session may be mid-step), provisional outputs become final."""
        state = self._stream
        unconfirmed = state.stamps.unconfirmed()   # a reset or the end of the input: nothing followed it
        if unconfirmed is not None:
            self._reject(outcome, unconfirmed[0].reason)
        if lost:
            state.run.awaiting.clear()
        else:
            with torch.inference_mode():
                self._place(outcome, self.session.close_scale_phase())
        if state.windows is not None:
            resumed, outputs = state.windows.end()
            for index, (stamp_ns, points) in resumed.items():   # no re-run reached them: stored values
                self.recorder.frame(_StoredFrame(index, stamp_ns, self._store.internal_pose(index), points is not None),
                                    state.windows.number, final=True)
                if points is not None:
                    self._store.hold(index, points)
            for output in outputs:
                self._finalise(outcome, dataclasses.replace(output, provisional=False))

    def _switch_window(self, outcome: StepOutcome) -> None:
        """The current window is full: a new session run starts from its last ``ov`` frames."""
        state = self._stream
        with torch.inference_mode():
            self.session.reset()
        state.run = self._new_run()
        state.frames.window_switch()
        for pending in state.windows.next_window():
            self._run(outcome, pending)

    def _end_stream(self, outcome: StepOutcome, reason: str, keep_map: bool, lost: bool = False) -> None:
        """The one way a stream ends (reset, restart, failure) and the next one starts. Buffered
        scale frames run first (a short phase 1, unless ``lost``), so that every processed frame
        gets its pose. keep_map: the map and trajectory continue from the last pose, the ended
        stream kept at its own scale (store/map_store.py); otherwise both are cleared."""
        self._close(outcome, lost)
        self.session.reset()
        state = self._stream
        conversion = state.frames.conversion
        if keep_map:
            newest = self._store.newest_poses(1, conversion)
            last = newest[0][0].pose if newest and newest[0][1] is conversion else None   # T_I_camera
            if state.windows is not None:
                self._records += state.windows.records
            if self.robot.constant_scale:      # one internal frame and conversion for every stream
                self._store.merge()
                placement, frames = (self.robot.continuing_in(conversion, last) if last is not None
                                     else self.robot.first_stream())
            else:                              # the ended stream goes into map once, at its scale
                if last is not None:
                    self._last_map_pose = conversion.camera_pose(last)
                self._store.end_stream(conversion)
                placement, frames = (self.robot.continuing_stream(self._last_map_pose)
                                     if self._last_map_pose is not None else self.robot.first_stream())
        else:
            self._counts["cleared"] += self._store.clear()
            self._records, self._last_map_pose = [], None
            placement, frames = self.robot.first_stream()
        # The odometry buffer stays: the frames still queued need theirs (the front end clears it
        # when odometry stamps go back, as a looped bag's do).
        self._stream = self._new_stream(placement, frames)
        self.recorder.continuation(None)   # of the ended stream; the new one stores its own soon
        self._continuation_due = 0.0
        self._counts["restarts"] += 1
        self._restart_reason = reason
        self._set_state(RESTARTED, f"restarted: {reason}")
        if not lost:
            kept = "map continues from the last pose" if keep_map else "map cleared"
            outcome.notices.append(Notice(RESTART, f"stream restarted ({kept}): {reason}"))

    def _fail(self, outcome: StepOutcome, frame: InputFrame, index: int, error: Exception) -> None:
        text = (f"model failed on the frame stamped {seconds_text(frame.stamp_ns, 3)}: "
                f"{type(error).__name__}: {error}")
        placed = -1 if self._last_placed is None else self._last_placed   # frames are placed in index order
        lost = {p.index for p in self._stream.run.awaiting if not p.rerun and p.index > placed}
        if self._last_placed != index:
            lost.add(index)
        self._counts["failed"] += len(lost)
        self._last_error = text
        outcome.notices.append(Notice(FAILED, text + " (stream restarted, continuing)"))
        if self.bundle.device.startswith("cuda"):
            torch.cuda.empty_cache()
        self._end_stream(outcome, "model error", keep_map=True, lost=True)

    def _reject(self, outcome: StepOutcome, text: str) -> None:
        self._counts["rejected"] += 1
        self._last_error = text
        outcome.notices.append(Notice(REJECTED, text))

    def _done(self, outcome: StepOutcome) -> StepOutcome:
        self._publish_snapshot()
        return outcome

    def _tracking_text(self) -> str:
        """'tracking', and while the window a resume started runs, that resume and how well its
        stored frames ran again (the overlap error: README, The map database)."""
        note, windows = self._resume_note, self._stream.windows
        if note is None or note[0] is not windows or windows.number != note[1] or windows.similarity is None:
            return "tracking"
        return f"tracking; {note[2]}, window {note[1]} aligned with overlap error {windows.last_overlap_error:.3g}"

    def _init_text(self) -> str:
        text = f"initialising {len(self._stream.run.awaiting)}/{self.settings.num_scale_frames}"
        # Until the new stream tracks, its state says why it restarted.
        return f"{text} (restarted: {self._restart_reason})" if self._restart_reason else text

    def _set_state(self, state: int, text: str) -> None:
        self._state, self._state_text = state, text

    def _cache_numbers(self) -> tuple[int, int, int]:
        """(frames stored since the stream started, pages in use, bytes allocated)."""
        stats = self.session.stats()
        kv = stats["kv_cache"]   # None until the first step allocates the cache
        pages = 0 if kv is None else (kv.anchor_pages + kv.window_pages + kv.pending_pages
                                      + kv.special_pages_in_use)
        nbytes = (0 if kv is None else kv.bytes_allocated) + stats["camera_cache_bytes"]
        return stats["frames_stored"], pages, nbytes

    def _scale_fields(self) -> dict:
        # The scale outputs use (robot.applied_scale), with the estimate's spread and reason.
        state, applied = self._stream.frames.source.state(), self._stream.frames.conversion.metric
        return {"scale_known": applied.known, "scale": applied.scale, "scale_spread": state.spread,
                "scale_text": state.reason, "camera_mount": self.robot.mount_source}

    def _window_fields(self) -> dict:
        windows = self._stream.windows
        if windows is None:
            return {}
        return {"window": windows.number, "window_scale": windows.last_scale,
                "window_overlap_error": windows.last_overlap_error}

    def _publish_snapshot(self) -> None:
        self.recorder.sync(self.window_records(), self._stream.frames.conversion, self.robot.mount)
        keyframes, pages, nbytes = self._cache_numbers()
        last, counts = self._last_frame, self._counts
        self._snapshot = MapperSnapshot(
            state=self._state, state_text=self._state_text, init_frames=self._stream.run.buffered_new(),
            init_frames_needed=self.settings.num_scale_frames, held_frames=self._stream.stamps.held,
            processed=counts["processed"],
            rejected=counts["rejected"], failed=counts["failed"], restarts=counts["restarts"],
            rolled_back=counts["rolled_back"], cleared=counts["cleared"], keyframes=keyframes,
            cache_pages=pages, cache_bytes=nbytes, model_ms=self._model_ms, map_points=self._store.num_points(),
            trajectory_poses=self._store.num_poses(), last_error=self._last_error, **self._window_fields(),
            **self._scale_fields(), map_database=self.recorder.text, map_database_error=self.recorder.failure,
            last_stamp_ns=None if last is None else last.stamp_ns)
