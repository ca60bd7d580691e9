"""Mapper: the mapping application, one camera stream in, placed poses, depth and a map out.

Every front end (the ROS node's worker thread, the offline tool) drives one Mapper through the
same verbs, so the rules live here once: stamps, input checks, the keyframe policy, the long-run
policy, failure recovery, the frame convention, the bounded map and trajectory. The Mapper is
single-threaded: one owner calls its verbs; other threads read only ``snapshot`` (immutable).

    process(frame) -> StepOutcome     one input frame (0..n outputs: phase 1 buffers)
    finish()       -> StepOutcome     end of the input: buffered frames run, provisional ones final
    reset(reason)                     restart the stream and clear the map
    rollback_last_frame() -> str      undo the newest stored frame (pose, points, cache)
    flush() -> str                    make deferred evictions final
    new_window() -> str               the windowed policy's next window starts at the next frame
    warm_up() -> float                dummy frames before the first real one (seconds)
    map_points(), save(directory), snapshot
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import time
import typing
from pathlib import Path

import numpy as np
import torch

from ..cache import NothingToRollback
from ..stream import ImageError
from .export import write_map_files
from .factory import SessionBundle
from .frames import Placement
from .keyframes import MotionPolicy
from .live_windows import LiveWindows, Pending
from .long_run import make_long_run_policy
from .map_recorder import open_recorder
from .map_resume import load_resumed
from .points import to_numpy
from .robot import RobotFrames
from .records import (BOUND, FAILED, INITIALISING, REJECTED, RESET, RESTART, TRACKING, WAITING, InputFrame,
                      MapperOutput, MapperSnapshot, Notice, StepOutcome)
from .settings import LIVE, MapperSettings, SettingsError
from .stamps import ACCEPT, DROP, StampPolicy
from .trajectory import Trajectory
from .map_builder import MapBuilder
from .voxel_map import VoxelMap

log = logging.getLogger(__name__)


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
                f"{self.tum_path}")


class Mapper:
    def __init__(self, settings: MapperSettings, bundle: SessionBundle):
        self.settings = settings
        self.bundle = bundle
        self.session = bundle.session
        self.preprocessor = bundle.preprocessor
        self.motion = (MotionPolicy(settings.keyframe_min_parallax_px)
                       if settings.keyframe_policy == "motion" else None)
        self.stamps = StampPolicy(settings.max_stamp_gap_s, settings.max_stamp_jitter_s)
        self.long_run = make_long_run_policy(settings)
        self.windows = (LiveWindows(settings.window_rule(), settings.window_alignment)
                        if settings.long_run_policy == "windowed" else None)
        resumed, resume_text = load_resumed(settings, bundle.device) if settings.resume else (None, "")
        self._map = MapBuilder(resumed.voxel_map if resumed else VoxelMap(settings.map_voxel_size_m,
                                                                          settings.max_map_points))
        self.trajectory = resumed.trajectory if resumed else Trajectory(settings.max_trajectory_poses)
        self._frames_in = 0              # index of the next input frame (since configure)
        self._counts = collections.Counter()
        self._state, self._state_text = WAITING, "waiting for images"
        self._last_error = ""
        self._last_frame: InputFrame | None = None
        self._model_ms = 0.0
        self._warned_trajectory_bound = False
        self._restart_reason = ""
        self.robot = RobotFrames(settings)
        self.recorder = open_recorder(settings, bundle.description,   # the map database, or none
                                      resume_from=resumed.run if resumed else None)
        if resumed is not None and resumed.mount is not None:
            self.robot.set_mount(resumed.mount, "the resumed run")
        self._new_stream(self._fresh_placement())
        self._snapshot = MapperSnapshot(init_frames_needed=settings.num_scale_frames)
        if resumed is not None:
            resume_text = self._continue(resumed)
        if resume_text:
            self._set_state(WAITING, f"{resume_text}; waiting for images")
            self._publish_snapshot()

    def _continue(self, resumed) -> str:
        """The stored run's map and trajectory are this Mapper's; its first frame continues them."""
        self._frames_in = resumed.next_index
        self._last_pose = self.trajectory[-1].c2w if len(self.trajectory) else None
        if self.windows is not None:
            self.windows.records = list(resumed.records)
        where = f"resumed run {resumed.run} ({resumed.ending}) at frame {resumed.next_index}"
        if self.windows is not None and resumed.placement is not None and resumed.overlap:
            self._placement = resumed.placement
            inputs = [Pending(InputFrame(rgb=rgb, stamp_ns=stamp_ns), index, 0, False, self.preprocessor(rgb))
                      for index, stamp_ns, rgb, _ in resumed.overlap]
            self.windows.resume(resumed.window, inputs, [result for *_, result in resumed.overlap],
                                resumed.provisional)
            return f"{where}: window {resumed.window + 1} aligns to its last {len(inputs)} frames"
        if self._last_pose is not None:
            self._placement = self._placement.continuing_from(self._last_pose)
            return f"{where}: no overlap frames stored, a new stream continues from the last pose"
        return f"{where}: it holds no frame, a new map starts"

    # -- per-stream state ------------------------------------------------------------------------

    def _new_stream(self, placement: Placement) -> None:
        self._placement = placement
        self._awaiting: collections.deque[Pending] = collections.deque()   # phase-1 buffering
        # (index, rerun) of the session's stored phase-2 frames, newest last, for rollback: only
        # frames still in the cache can be rolled back, so the newest of them are enough.
        self._stored: collections.deque[tuple[int, bool]] = collections.deque(
            maxlen=self.settings.scale_frames + self.settings.sliding_window + 1)
        self._has_results = False        # phase 1 is over
        self._untrusted_next = True
        self._input_wh: tuple[int, int] | None = None
        # Points of the newest stored keyframe, kept out of the map while that frame can still be
        # rolled back; merged when the next keyframe comes, or before the map is read.
        self._unmerged: tuple[np.ndarray, np.ndarray] | None = None
        self._unmerged_index: int | None = None
        self._last_pose: np.ndarray | None = None
        if self.motion is not None:
            self.motion.reset()
        self.stamps.reset()
        self.long_run.reset()
        self.robot.restart()
        if self.windows is not None:
            self.windows.reset()

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
        outcome = StepOutcome()
        verdict = self.stamps.check(frame.stamp_ns)
        if verdict.action == DROP:
            self._reject(outcome, verdict.reason)
            return self._done(outcome)
        if verdict.action != ACCEPT:
            self._restart(outcome, verdict.reason, keep_map=False)
        try:
            image = self.preprocessor(frame.rgb)
        except ImageError as error:
            self._reject(outcome, f"image skipped: {error}")
            return self._done(outcome)
        size = (frame.rgb.shape[1], frame.rgb.shape[0])
        if self._input_wh is not None and size != self._input_wh:
            self._restart(outcome, f"image size changed from {self._input_wh[0]}x{self._input_wh[1]} to "
                                   f"{size[0]}x{size[1]}", keep_map=True)
        self._input_wh = size
        self.stamps.accept(frame.stamp_ns)
        index = self._frames_in
        self._frames_in += 1
        self._last_frame = frame
        self._model_ms = 0.0
        try:
            if self.windows is not None and self.windows.switch_due:
                self._switch_window(outcome)
            self._run(outcome, Pending(frame, index, 0, False, image))
        except Exception as error:   # e.g. CUDA out of memory: report, restart the stream, go on
            self._fail(outcome, frame, error)
            return self._done(outcome)
        self._counts["processed"] += 1
        reason = self.long_run.restart_reason(self.session.stats())
        if reason:
            self._restart(outcome, reason, keep_map=True)
        return self._done(outcome)

    def finish(self) -> StepOutcome:
        """End of the input: a stream shorter than num_scale_frames runs as a short phase 1, and
        every provisional output becomes final. The map holds every keyframe afterwards."""
        outcome = StepOutcome()
        with torch.inference_mode():
            self._place(outcome, self.session.close_scale_phase())
        self._finalise_provisional(outcome)
        self._merge_points()
        return self._done(outcome)

    def reset(self, reason: str) -> StepOutcome:
        outcome = StepOutcome()
        self._restart(outcome, reason, keep_map=False)
        return self._done(outcome)

    def rollback_last_frame(self) -> str:
        """Undo the newest stored frame: cache, pose (trajectory), points (if not yet merged).
        Raises NothingToRollback when there is none (phase-1 frames need a reset)."""
        before = self._cache_numbers()[0]
        if not self._awaiting and self._stored and self._stored[-1][1]:
            raise NothingToRollback("the newest stored frame was run again to align two windows; "
                                    "it cannot be rolled back")
        self.session.rollback_last_frame()
        if self._awaiting:                      # a buffered phase-1 frame was dropped
            self._awaiting.pop()                # its index stays used: indices never repeat
            if self.windows is not None:
                self.windows.forget_newest(had_result=False)
            self._set_state(INITIALISING, self._init_text())
            self._publish_snapshot()
            return "dropped the newest buffered scale frame"
        index = self._stored.pop()[0]
        self.trajectory.remove(index)
        self.recorder.removed(index)
        if self.windows is not None:
            self.windows.forget_newest(had_result=True)
            if self.windows.provisional.pop(index, None) is not None:
                self._unmerged_index = None
        removed = self._unmerged is not None and self._unmerged_index == index
        if removed:
            self._unmerged = None
        self._publish_snapshot()
        points = ("its points left the map" if removed else
                  "its points were already merged into the map and stay")
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
        window runs them again only to be aligned to them. Raises ValueError when it cannot."""
        if self.windows is None:
            raise ValueError("new_window needs long_run_policy windowed")
        refusal = self.windows.switch_refusal()
        if refusal:
            raise ValueError(refusal)
        self.windows.switch_asked = True
        return f"window {self.windows.number + 1} starts at the next frame"

    def close(self) -> None:
        """End the run in the map database (a clean end: the state a save now would write) and
        stop the map builder's thread (the owner is done with this Mapper)."""
        try:
            self._merge_points()
            provisional, continuation = self._provisional_points(), self._continuation()
        except Exception:   # a map insert's or a device's error: it was reported where it happened
            provisional, continuation = [], None
        self.recorder.close(provisional, continuation)
        self._map.close()

    @property
    def voxel_map(self) -> VoxelMap:
        """The map with every finished keyframe in (waits for the map builder)."""
        return self._map.map

    def apply_live(self, settings: MapperSettings) -> None:
        """New values of LIVE settings (between frames; the others must not change)."""
        changed = {f.name for f in dataclasses.fields(settings)
                   if getattr(settings, f.name) != getattr(self.settings, f.name)}
        fixed = sorted(name for name in changed
                       if MapperSettings.__dataclass_fields__[name].metadata.get("when") != LIVE)
        if fixed:
            raise SettingsError(f"{fixed} cannot change while the Mapper runs")
        self.settings = settings
        if self.motion is not None:
            self.motion.min_parallax_px = settings.keyframe_min_parallax_px
        self.stamps.set_limits(settings.max_stamp_gap_s, settings.max_stamp_jitter_s)
        self.long_run = make_long_run_policy(settings)

    def map_points(self) -> tuple[np.ndarray, np.ndarray]:
        """The map (xyz float32 [N, 3] in map, rgb uint8 [N, 3]), the newest keyframe included
        (merged for good: a later rollback no longer removes its points). A windowed run's
        provisional keyframes are in it with their current values, as if the stream ended here;
        they enter the map itself only when final."""
        self._merge_points()
        provisional = self._provisional_points()
        voxel_map = self.voxel_map
        if provisional:
            voxel_map = voxel_map.copy()
            for points in provisional:
                voxel_map.insert(*points)
        xyz, rgb = voxel_map.points()
        return self.robot.points(xyz), rgb

    def _continuation(self) -> tuple:
        """What a resumed run needs to start the next window: (window number, next frame index,
        placement, the window's last ov frames as (index, stamp_ns, rgb, pose_enc, depth, keyframe),
        its provisional frames as (index, keyframe) in the order of their points)."""
        windows, overlap = self.windows, []
        if windows is not None and not windows.switch_refusal():
            frames = list(windows.inputs)[-windows.overlap:]
            for pending, result in zip(frames, list(windows.tail)[-windows.overlap:]):
                overlap.append((pending.index, pending.frame.stamp_ns, pending.frame.rgb, to_numpy(result.pose_enc),
                                to_numpy(result.depth), bool(result.is_keyframe)))
        provisional = [] if windows is None else (
            [(index, points is not None) for index, (_, points) in windows.resumed.items()]
            + [(o.index, o.is_keyframe) for o in windows.provisional.values()])
        return (windows.number if windows is not None else 0, self._frames_in, self._placement, overlap, provisional)

    def _provisional_points(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """A windowed run's provisional keyframes' points (internal frame), with their current values."""
        if self.windows is None:
            return []
        stored = [points for _, points in self.windows.resumed.values() if points is not None]
        outputs = [o for o in self.windows.provisional.values() if o.is_keyframe]
        return stored + [o.internal_points(self.settings.min_confidence, self.settings.map_points_stride)
                         for o in outputs]

    def _pose_of(self, index: int) -> np.ndarray:
        return next(p.c2w for p in reversed(self.trajectory) if p.key == index)

    def saved_trajectory(self) -> Trajectory:
        """The robot base's poses in map with the current scale (what save() writes)."""
        out = Trajectory()
        for entry in self.trajectory:
            out.append(entry.stamp_s, self.robot.base_pose(entry.c2w), key=entry.key)
        return out

    def save(self, directory: str | Path) -> SavedMap:
        xyz, rgb = self.map_points()
        ply, tum = write_map_files(directory, xyz, rgb, self.saved_trajectory(),
                                   self.windows.records if self.windows is not None else None)
        self._publish_snapshot()
        return SavedMap(str(ply), str(tum), len(xyz), len(self.trajectory))

    # -- internals -------------------------------------------------------------------------------

    def _run(self, outcome: StepOutcome, pending: Pending) -> None:
        """Give one frame to the session and place whatever results come back."""
        session = self.session
        in_phase2 = self._has_results
        if self.windows is not None:
            self.windows.enter(pending)
        self._awaiting.append(pending)
        start = time.perf_counter()
        with torch.inference_mode():
            # Motion policy: store the frame (deferred eviction keeps the rollback exact), then
            # keep it and flush if the view moved enough, or roll it back. Scale frames are kept.
            results = session.step(pending.image, keyframe=True if self.motion is not None else None)
            kept = True
            if self.motion is not None:
                moved = self.motion.is_keyframe(pending.frame.rgb)   # phase 1: sets the reference
                if in_phase2:
                    if moved:
                        session.flush()
                    else:
                        session.rollback_last_frame()
                        kept = False
            if pending.image.is_cuda:
                # The step only queues GPU work; the model time ends when the outputs are ready
                # (they are copied to the host next anyway).
                torch.cuda.current_stream(pending.image.device).synchronize()
        self._model_ms += (time.perf_counter() - start) * 1e3
        if not results:
            self._set_state(INITIALISING, self._init_text())
            return
        if in_phase2 and kept and results[0].is_keyframe:
            self._stored.append((pending.index, pending.rerun))   # not the image: no tensor is kept
        self._place(outcome, results, keyframe_kept=kept)

    def _place(self, outcome: StepOutcome, results, keyframe_kept: bool = True) -> None:
        """Session results, one per awaiting frame in order -> placed outputs."""
        batch = len(results) > 1
        for result in results:
            pending = self._awaiting.popleft()
            is_keyframe = bool(result.is_keyframe) and (keyframe_kept or batch)
            trusted = not (batch or self._untrusted_next)
            self._untrusted_next = False
            if self.windows is None:
                self._emit(outcome, pending, result, is_keyframe, trusted, final=True)
                continue
            for ready, warped in self.windows.place(pending, result):
                keyframe = is_keyframe if ready is pending else bool(warped.is_keyframe)
                if ready.rerun:
                    # A frame final already (the window was ended early by new_window) only aligns.
                    if ready.index in self.windows.provisional or ready.index in self.windows.resumed:
                        self._finalise_overlap(outcome, ready, warped, keyframe)
                else:
                    self._emit(outcome, ready, warped, keyframe, trusted, self.windows.is_final(ready.position))
        if results:
            self._has_results = True
            self._restart_reason = ""
            self._set_state(TRACKING, "tracking")

    def _output(self, pending: Pending, result, is_keyframe: bool, trusted: bool, final: bool) -> MapperOutput:
        internal = self._placement.camera_pose(to_numpy(result.extrinsic))
        return MapperOutput(frame=pending.frame, index=pending.index,
                            camera_pose=self.robot.camera_pose(internal), base_pose=self.robot.base_pose(internal),
                            internal_pose=internal, trusted=trusted, is_keyframe=is_keyframe,
                            provisional=not final, placement=self._placement, result=result, frames=self.robot)

    def _fresh_placement(self) -> Placement:
        """A stream with no earlier one to continue from: its first camera at the internal origin."""
        return Placement(rotation=self.robot.rotation.copy())

    def set_camera_mount(self, base_camera: np.ndarray, source: str) -> bool:
        """T_base_camera from TF, before the first frame (the map frame is defined by it); False
        once frames were processed (the mount then stays what it was)."""
        if self._frames_in:
            return False
        self.robot.set_mount(base_camera, source)
        self._placement = self._fresh_placement()
        self._publish_snapshot()
        return True

    def _emit(self, outcome, pending: Pending, result, is_keyframe: bool, trusted: bool, final: bool) -> None:
        """A frame's first output: published now; final now or when its window's successor ran."""
        output = self._output(pending, result, is_keyframe, trusted, final)
        self._record_pose(outcome, output)
        outcome.new.append(output)
        if final:
            self._finalise(outcome, output)
        else:
            self.windows.provisional[output.index] = output
            self.recorder.frame(output, self.windows.number, final=False)

    def _finalise_overlap(self, outcome, pending: Pending, result, is_keyframe: bool) -> None:
        """An overlap frame run again by the next window: that run's value is the final one."""
        self.windows.provisional.pop(pending.index, None)
        self.windows.resumed.pop(pending.index, None)
        output = self._output(pending, result, is_keyframe, True, final=True)
        self.trajectory.replace(output.index, output.internal_pose)
        self._finalise(outcome, output)

    def _finalise(self, outcome, output: MapperOutput) -> None:
        outcome.final.append(output)
        self.recorder.frame(output, self.windows.number if self.windows is not None else 0, final=True)
        if output.is_keyframe:   # the previous keyframe can no longer be rolled back on its own
            self.robot.keyframe(output.stamp_ns, output.internal_pose)
            self._merge_points()
            self._unmerged = output.internal_points(self.settings.min_confidence, self.settings.map_points_stride)
            self._unmerged_index = output.index

    def _finalise_provisional(self, outcome: StepOutcome) -> None:
        """The stream ends here (input over, restart): the window's provisional outputs are final."""
        if self.windows is None:
            return
        for index, (stamp_ns, points) in self.windows.resumed.items():   # no re-run reached them: stored values
            self.recorder.frame(_StoredFrame(index, stamp_ns, self._pose_of(index), points is not None),
                                self.windows.number, final=True)
            if points is not None:
                self._merge_points()
                self._unmerged, self._unmerged_index = points, index
        self.windows.resumed.clear()
        for output in self.windows.provisional.values():
            self._finalise(outcome, dataclasses.replace(output, provisional=False))
        self.windows.provisional.clear()

    def _switch_window(self, outcome: StepOutcome) -> None:
        """The current window is full: start the next one from its last ``ov`` frames."""
        with torch.inference_mode():
            self.session.reset()
        if self.motion is not None:
            self.motion.reset()
        self._has_results = False
        self._stored.clear()
        self.robot.window_switch()
        for pending in self.windows.next_window():
            self._run(outcome, pending)

    def _record_pose(self, outcome: StepOutcome, output: MapperOutput) -> None:
        trajectory = self.trajectory
        if len(trajectory) == trajectory.max_length and not self._warned_trajectory_bound:
            self._warned_trajectory_bound = True
            outcome.notices.append(Notice(BOUND, (
                f"the trajectory holds max_trajectory_poses={trajectory.max_length} poses: the oldest "
                "are dropped from now on (the saved trajectory starts later)")))
        trajectory.append(output.stamp_ns / 1e9, output.internal_pose, key=output.index)
        self._last_pose = output.internal_pose

    def _merge_points(self) -> None:
        if self._unmerged is not None:
            self._map.insert(*self._unmerged)
            self.recorder.points(*self._unmerged)
            self._unmerged = None

    def _restart(self, outcome: StepOutcome, reason: str, keep_map: bool) -> None:
        """Start a new stream. Buffered scale frames run first (a short phase 1), so that every
        processed frame gets its pose. keep_map: the map and trajectory continue from the last
        pose; otherwise both are cleared."""
        with torch.inference_mode():
            self._place(outcome, self.session.close_scale_phase())
        self._finalise_provisional(outcome)
        self.session.reset()
        self._merge_points()
        if keep_map and self._last_pose is not None:
            placement = self._placement.continuing_from(self._last_pose)
        else:
            placement = self._fresh_placement()
            self.voxel_map.clear()
            self.trajectory.clear()
            self.recorder.cleared()
        self._new_stream(placement)
        self._counts["restarts"] += 1
        kept = "map continues from the last pose" if keep_map else "map cleared"
        self._restart_reason = reason
        self._set_state(RESET, f"reset: {reason}")
        outcome.notices.append(Notice(RESTART, f"stream restarted ({kept}): {reason}"))

    def _fail(self, outcome: StepOutcome, frame: InputFrame, error: Exception) -> None:
        text = (f"model failed on the frame stamped {frame.stamp_ns / 1e9:.3f}: "
                f"{type(error).__name__}: {error}")
        self._counts["failed"] += 1
        self._last_error = text
        outcome.notices.append(Notice(FAILED, text + " (stream restarted, continuing)"))
        if self.bundle.device.startswith("cuda"):
            torch.cuda.empty_cache()
        # The session may be mid-step: drop what it buffered instead of running it again.
        self._awaiting.clear()
        self._finalise_provisional(outcome)
        self.session.reset()
        self._merge_points()
        placement = self._placement.continuing_from(self._last_pose) if self._last_pose is not None \
            else self._fresh_placement()
        self._new_stream(placement)
        self._counts["restarts"] += 1
        self._restart_reason = "model error"
        self._set_state(RESET, "reset: model error")

    def _reject(self, outcome: StepOutcome, text: str) -> None:
        self._counts["rejected"] += 1
        self._last_error = text
        outcome.notices.append(Notice(REJECTED, text))

    def _done(self, outcome: StepOutcome) -> StepOutcome:
        self._publish_snapshot()
        return outcome

    def _init_text(self) -> str:
        text = f"initialising {len(self._awaiting)}/{self.settings.num_scale_frames}"
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
        state = self.robot.scale
        return {"scale_known": state.known, "scale": state.scale, "scale_spread": state.spread,
                "scale_text": state.reason, "camera_mount": self.robot.mount_source}

    def _window_fields(self) -> dict:
        windows = self.windows
        if windows is None:
            return {}
        return {"window": windows.number, "window_scale": windows.last_scale,
                "window_overlap_error": windows.last_overlap_error}

    def _publish_snapshot(self) -> None:
        self.recorder.sync(self.windows.records if self.windows is not None else (), self.robot.scale,
                           self.robot.mount)
        keyframes, pages, nbytes = self._cache_numbers()
        last = self._last_frame
        self._snapshot = MapperSnapshot(
            state=self._state, state_text=self._state_text, init_frames=len(self._awaiting),
            init_frames_needed=self.settings.num_scale_frames, processed=self._counts["processed"],
            rejected=self._counts["rejected"], failed=self._counts["failed"],
            restarts=self._counts["restarts"], keyframes=keyframes, cache_pages=pages, cache_bytes=nbytes,
            model_ms=self._model_ms, map_points=len(self._map), trajectory_poses=len(self.trajectory),
            last_error=self._last_error, **self._window_fields(), **self._scale_fields(),
            map_database=self.recorder.text, map_database_error=self.recorder.failure,
            last_stamp_ns=None if last is None else last.stamp_ns,
            last_source=None if last is None else last.source)
