"""Mapper: the mapping application, one camera stream in, placed poses, depth and a map out.

Every front end (the ROS node's worker thread, the offline tool) drives one Mapper through the
same verbs, so the rules live here once: stamps, input checks, the keyframe policy, the long-run
policy, failure recovery, the frame convention, the bounded map and trajectory. The Mapper is
single-threaded: one owner calls its verbs; other threads read only ``snapshot`` (immutable).

    process(frame) -> StepOutcome     one input frame (0..n outputs: phase 1 buffers; a frame past
                                      a forward stamp jump is held until the next one decides)
    process_queued(frames) -> iterator of StepOutcome   the same for frames that keep coming, one
                                      outcome each, in order; a frame's step is queued on the device
                                      before the frame before it is placed (flights.py)
    finish()       -> StepOutcome     end of the input: buffered frames run, provisional ones final,
                                      a held frame is refused (nothing confirmed its jump)
    reset(reason)                     the operator's reset: restart the stream, clear the map
    rollback_last_frame() -> str      undo the newest frame (pose, points, cache); a refusal
                                      (NothingToRollback) changes nothing
    flush() -> str                    make deferred evictions final
    new_window() -> str               the windowed policy's next window starts at the next frame
    warm_up(size) -> float            dummy frames before the first real one (seconds)
    map_points(), view(budgets), saved_trajectory(), path_poses(n), save(directory)   (map_reads.py), snapshot
    add_odometry(stamp_ns, pose, went_back_ok), odometry_at(stamp_ns)   (any thread)

Per-stream state lives in one ``StreamState`` that every restart replaces whole; ``Streams``
(streams.py, with the vocabulary: restart, reset, window switch, session reset) is the one place a
stream starts (first, after a restart, resumed). Counts and the state text live in one immutable
``MapperStatus`` (status.py); a placed output goes to the map, the database and the outcome through
``Placing`` (placing.py); the map and trajectory live in ``MapStore`` (store/map_store.py, which
says how a saved map stays at one scale), the conversion into ``map`` in placement/. The map
database (database/recorder.py) hears every pose and every map change; a ``resume`` setting starts
the Mapper as the database's last run (database/resume.py).
"""
from __future__ import annotations

import collections
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from ..cache import NothingToRollback
from ..stream import ImageError
from .database.continuation import ContinuationSchedule
from .database.recorder import MapRecorder, open_recorder
from .database.resume import load_resumed
from .factory import SessionBundle
from .flights import Flight, PlacingStream, device_mark
from .files.staged_files import StagedFiles
from .keyframes import KEEP, ROLLBACK, policy_step
from .long_run import make_long_run_policy
from .map_reads import MapReads
from .outputs import output_of
from .placement.odometry import OdometryBuffer
from .placement.robot import RobotFrames
from .placing import Placing
from .records import (FAILED, INITIALISING, REJECTED, RESTART, RESTARTED, TRACKING, WAITING, WARMUP,
                      InputFrame, MapperSnapshot, Notice, SavedMap, StepOutcome)
from .settings import MapperSettings, SettingsError
from .settings_rules import fixed_changes
from .stamps import DROP, REFUSE, RESTART as STAMP_RESTART, seconds_text
from .status import MapperStatus, init_text, snapshot, tracking_text
from .store.map_store import MapStore
from .store.trajectory import StampedPose, Trajectory
from .streams import StreamState, Streams
from .windows.ahead import SwitchAhead
from .windows.live import Pending
from .warmup_size import WarmupSize, run_warmup, warmup_size


class Mapper:
    def __init__(self, settings: MapperSettings, bundle: SessionBundle, odometry: OdometryBuffer | None = None,
                 recorder: MapRecorder | None = None):
        self.settings = settings
        self.bundle = bundle
        self.session = bundle.session
        self._ahead = SwitchAhead(settings, self.session)   # window_switch_ahead's spare session
        self.preprocessor = bundle.preprocessor
        self.long_run = make_long_run_policy(settings)
        self.robot = RobotFrames(settings, odometry)   # odometry: a rig's cameras share one robot's
        resumed, resume_text = (load_resumed(settings, bundle.device, bundle.preprocessor) if settings.resume
                                else (None, ""))
        # The map database, or none; a rig's camera records through the rig's writer (``recorder``).
        self.recorder = recorder or open_recorder(settings, bundle.description,
                                                  resume_from=resumed.run if resumed else None)
        self._store = MapStore(settings.map_voxel_size_m, settings.max_map_points, settings.max_trajectory_poses,
                               self.recorder)
        self._streams = Streams(settings, self.robot, self._store, self.preprocessor)
        self._placing = Placing(self._store, self.recorder, settings)
        self._reads = MapReads(self._store, self._streams, settings)
        self._continuations = ContinuationSchedule(self.recorder, self.robot, settings.map_database_continuation_s)
        self._frames_in = 0              # index of the next input frame (since configure)
        self._flights: collections.deque[Flight] = collections.deque()   # steps not placed yet, oldest first
        self._placing_stream = PlacingStream()
        self._status = MapperStatus()
        self._warmed: WarmupSize | None = None   # until the first frame: what warm_up prepared
        self._stream, resumed_text = self._streams.start(resumed)
        self._snapshot = MapperSnapshot(init_frames_needed=settings.num_scale_frames)
        if resumed is not None:
            self._frames_in = resumed.next_index
            if self._stream.resume_note is not None:   # a crash now resumes the same
                self._continuations.store(self._stream, self._frames_in)
        if resumed_text or resume_text:
            self._enter(WAITING, f"{resumed_text or resume_text}; waiting for images")
        self._publish_snapshot()   # the database's run holds the conversion (a fixed scale) from the start

    # -- verbs -----------------------------------------------------------------------------------

    @property
    def snapshot(self) -> MapperSnapshot:
        return self._snapshot.with_database(self.recorder.text, self.recorder.failure)

    @property
    def stream(self) -> StreamState:
        """The current stream (read it; the Mapper replaces it at every restart)."""
        return self._stream

    @property
    def store(self) -> MapStore:
        """The map and trajectory in memory."""
        return self._store

    @property
    def next_index(self) -> int:
        """The index the next input frame gets (frames are counted since configure)."""
        return self._frames_in

    def warm_up(self, size: WarmupSize | None = None) -> float:
        """Run dummy frames of ``size`` (default: warmup_size.py's rule with nothing found) through
        both phases (warmup_size.run_warmup). Only before the first real frame: a live stream is
        never disturbed."""
        if self._status.last_frame is not None:
            raise RuntimeError("warm_up() runs before the first frame; the stream is live")
        start = time.perf_counter()
        self._warmed = size or warmup_size(self.settings)
        run_warmup(self.session, self.preprocessor, self._warmed)
        self._ahead.warm_up(self.preprocessor, self._warmed)
        self._publish_snapshot()
        return time.perf_counter() - start

    def process(self, frame: InputFrame) -> StepOutcome:
        """One input frame through the stamp rule (stamps.py): taken, dropped, held for the next
        frame to decide, or, with a held one, both in order."""
        outcome = StepOutcome()
        self._intake(outcome, frame, defer=False)
        return self._done(outcome)

    def process_queued(self, frames: Iterable[InputFrame]) -> Iterator[StepOutcome]:
        """``process`` of each frame, one outcome each, in order, with the same results; the
        iterator of frames may block (the node's inbox). A frame's phase-2 step stays on the
        device while the next frame is asked for; a next frame that comes has its step queued
        behind it before the earlier frame is placed (flights.py). ``step_running`` tells the
        iterator whether a step is still running. Close the iterator or run it out: what is
        queued is placed either way."""
        waiting: collections.deque[StepOutcome] = collections.deque()   # outcomes not yielded yet
        try:
            for frame in frames:
                outcome = StepOutcome()
                self._intake(outcome, frame, defer=True)
                waiting.append(outcome)
                newest = self._flights[-1] if self._flights and self._flights[-1].outcome is outcome else None
                while self._flights and self._flights[0] is not newest:
                    self._land(self._flights.popleft())
                while waiting and (newest is None or waiting[0] is not newest.outcome):
                    yield self._done(waiting.popleft())
            self._land_all()
            while waiting:
                yield self._done(waiting.popleft())
        finally:   # closed early: what was queued is placed all the same
            if self._flights:
                self._land_all()
                self._publish_snapshot()

    @property
    def step_running(self) -> bool:
        """Whether the device still runs a step that ``process_queued`` has not placed."""
        return bool(self._flights) and not self._flights[-1].finished

    def _intake(self, outcome: StepOutcome, frame: InputFrame, defer: bool) -> None:
        for verdict, item in self._stream.stamps.decide(frame.stamp_ns, frame.gap_ns, frame):
            if verdict.action in (DROP, REFUSE):
                self._reject(outcome, verdict.reason)
                continue
            if verdict.action == STAMP_RESTART:
                self._end_stream(outcome, verdict.reason, keep_map=False)
            elif not self._plain_step(item):
                self._land_all()   # what follows reads or ends the stream: every earlier frame placed first
            self._take(outcome, item, defer)

    def _plain_step(self, frame: InputFrame) -> bool:
        """Whether ``frame`` would be one phase-2 step of the current stream and window (no
        switch, no restart for its size), which may run while earlier frames are not placed. Not
        while a resume point is due: it is stored with every frame before placed (the window's
        frames and results agree)."""
        state = self._stream
        return (state.run.has_results and (state.windows is None or not state.windows.switch_due)
                and state.input_wh == (frame.rgb.shape[1], frame.rgb.shape[0]) and not self._continuations.due(state))

    def _take(self, outcome: StepOutcome, frame: InputFrame, defer: bool = False) -> None:
        """A frame the stamp rule let through: into the current stream (``defer``: a phase-2
        step may stay on the device, placed by ``_land``)."""
        try:
            image = self.preprocessor(frame.rgb)
        except ImageError as error:
            self._reject(outcome, f"image skipped: {error}")
            return
        warmed, self._warmed = self._warmed, None
        size = (frame.rgb.shape[1], frame.rgb.shape[0])
        mismatch = warmed.mismatch(size, (image.shape[-1], image.shape[-2])) if warmed is not None else ""
        if mismatch:
            outcome.notices.append(Notice(WARMUP, mismatch))
        known = self._stream.input_wh
        if known is not None and size != known:
            self._end_stream(outcome, f"image size changed from {known[0]}x{known[1]} to {size[0]}x{size[1]}",
                             keep_map=True)
        state = self._stream
        state.input_wh = size
        state.stamps.accept(frame.stamp_ns)
        index = self._frames_in
        self._frames_in += 1
        outcome.taken = frame
        self._status = replace(self._status, last_frame=frame, model_ms=0.0)
        try:
            if state.windows is not None and state.windows.switch_due:
                self._switch_window(outcome)
            self._run(outcome, Pending(frame, index, 0, False, image), defer=defer)
        except Exception as error:   # e.g. CUDA out of memory: report, restart the stream, go on
            self._land_all(end_on_failure=False)   # the frame before ran first: it is placed
            self._step_failed(outcome, frame, index, error, end_stream=True)
            return
        reason = self.long_run.restart_reason(self.session.usage())
        if reason:
            self._end_stream(outcome, reason, keep_map=True)
        elif not self._flights:   # else when the frame is placed (_land)
            self._continuations.while_mapping(self._stream, self._frames_in)

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
        """Undo the newest frame: cache, pose (trajectory), points (if not yet merged). Raises NothingToRollback,
        having changed nothing, when the newest frame cannot be undone: none given, a phase-1 frame already
        placed, a frame not stored in the cache (keyframe interval, motion policy) or one a window runs again."""
        why = self._stream.rollback_refusal(self.session.rollback_refusal())
        if why:
            raise NothingToRollback(why)
        before = self.session.usage().frames_stored
        self.session.rollback_last_frame()        # refuses before changing anything
        index = self._stream.rolled_back()
        self._ahead.forget(index)
        if index is None:                          # a buffered phase-1 frame was dropped
            self._enter(INITIALISING, self._init_text())
            self._publish_snapshot()
            return "dropped the newest buffered scale frame"
        points = self._placing.undo(self._stream, index)
        self._continuations.soon()
        self._status = self._status.counted(rolled_back=1)
        self._publish_snapshot()
        return (f"rolled back frame {index}: {before} frames in cache before, "
                f"{self.session.usage().frames_stored} after; {points}")

    def flush(self) -> str:
        before = self.session.usage()
        self.session.flush()
        after = self.session.usage()
        self._publish_snapshot()
        return (f"flushed deferred evictions: {before.frames_stored} frames / {before.pages} pages before, "
                f"{after.frames_stored} / {after.pages} after")

    def new_window(self) -> str:
        """Start the next window at the next frame (an operator entering a new area). The last
        ``ov`` frames keep the values they have (they are final or become so as usual); the new
        window runs them again only to be aligned to them. Raises ValueError, having changed
        nothing, when it cannot."""
        if self._stream.windows is None:
            raise ValueError("new_window needs long_run_policy windowed")
        return self._stream.windows.ask_switch()

    def close(self) -> None:
        """End the run in the map database (a clean end: the state a save now would write) and
        stop the map builder's thread (the owner is done with this Mapper)."""
        try:
            self._store.merge()
            self._continuations.store(self._stream, self._frames_in, self._reads.provisional_points(self._stream))
        except Exception:   # a map insert's or a device's error: it was reported where it happened
            pass
        self.recorder.close()
        self._store.close()

    def apply_live(self, settings: MapperSettings) -> None:
        """New values of LIVE settings (between frames; the others must not change)."""
        fixed = fixed_changes(self.settings, settings)
        if fixed:
            raise SettingsError(f"{fixed} cannot change while the Mapper runs")
        self.settings = self._streams.settings = self._placing.settings = self._reads.settings = settings
        self._stream.apply_live(settings)
        self.long_run = make_long_run_policy(settings)

    # -- reading the map (map_reads.py; nothing changes) -------------------------------------------

    def map_points(self) -> tuple[np.ndarray, np.ndarray]:
        return self._reads.points(self._stream)

    def view(self, point_budget: int, pose_budget: int) -> Future:
        return self._reads.view(self._stream, point_budget, pose_budget)

    def saved_trajectory(self) -> Trajectory:
        return self._reads.trajectory(self._stream)

    def path_poses(self, count: int | None = None) -> list[tuple[StampedPose, object]]:
        return self._reads.path_poses(self._stream, count)

    @property
    def camera_base(self) -> np.ndarray:
        """T_camera_base of the map's conversion (the saved trajectory's base poses -> camera poses)."""
        return self._stream.frames.conversion.camera_base

    def window_records(self) -> list:
        return self._reads.window_records(self._stream)

    def save(self, directory: str | Path, staged: StagedFiles | None = None) -> SavedMap:
        saved = self._reads.save(self._stream, directory, staged)
        self._publish_snapshot()
        return saved

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
        self._stream = self._streams.first()
        self._publish_snapshot()
        return True

    # -- the frame path --------------------------------------------------------------------------

    def _run(self, outcome: StepOutcome, pending: Pending, ready: list | None = None, defer: bool = False) -> None:
        """Give one frame to the session (``ready``: its results, run ahead) and place what comes
        back (``defer``: a phase-2 step is left on the device as a flight, placed by ``_land``)."""
        state = self._stream
        run = state.run
        in_phase2 = run.has_results
        if state.windows is not None:
            state.windows.enter(pending)
        run.give(pending)
        start = time.perf_counter()
        defer = defer and in_phase2 and ready is None
        began = device_mark(pending.image) if defer else None
        with torch.inference_mode():
            if ready is not None:   # run ahead of its window's switch (the interval policy: kept)
                results, decision = ready, KEEP
            else:
                results, decision = policy_step(self.session, run.motion, pending.image, pending.frame.rgb, in_phase2)
                self._store.release()   # the map thread works while this one waits (store/map_builder.py)
                if defer:
                    self._flights.append(Flight(outcome, pending, results, decision, began, device_mark(pending.image),
                                                (time.perf_counter() - start) * 1e3))
                    return
                if pending.image.is_cuda:
                    # The step only queues GPU work: the model time ends when its outputs are ready.
                    torch.cuda.current_stream(pending.image.device).synchronize()
        self._status = replace(self._status, model_ms=self._status.model_ms + (time.perf_counter() - start) * 1e3)
        self._settle(outcome, pending, results, decision, in_phase2)

    def _settle(self, outcome: StepOutcome, pending: Pending, results: list, decision: str, in_phase2: bool) -> None:
        """A step's results, ready on the host's side: placed."""
        if not results:
            self._enter(INITIALISING, self._init_text())
            return
        kept = decision != ROLLBACK
        if in_phase2 and kept and results[0].is_keyframe:
            self._stream.run.stored.append(pending.index)      # not the image: no tensor is kept
        self._place(outcome, results, keyframe_kept=kept)
        outcome.notices += self._ahead.take(pending)   # after the placing: the pose waits for no spare work

    def _land(self, flight: Flight, end_on_failure: bool = True) -> None:
        """Place a flight once its step is done. A failure loses it and the frames queued after it
        (they ran in its stream), and ends the stream unless the caller is ending it anyway."""
        try:
            if flight.done is not None:
                flight.done.synchronize()
            self._status = replace(self._status, model_ms=flight.model_ms)
            with self._placing_stream.placing(flight):
                self._settle(flight.outcome, flight.pending, flight.results, flight.decision, True)
        except Exception as error:
            self._flights.clear()
            self._step_failed(flight.outcome, flight.pending.frame, flight.pending.index, error, end_on_failure)
            return
        self._continuations.while_mapping(self._stream, flight.pending.index + 1)

    def _step_failed(self, outcome: StepOutcome, frame: InputFrame, index: int, error: Exception,
                     end_stream: bool) -> None:
        """A frame's step or placing raised: counted and reported; ``end_stream``: the stream
        restarts from the last pose (else the caller is ending it anyway)."""
        self._failed(outcome, f"model failed on the frame stamped {seconds_text(frame.stamp_ns, 3)}", error, index,
                     " (stream restarted, continuing)" if end_stream else "")
        if end_stream:
            self._end_stream(outcome, "model error", keep_map=True, lost=True)

    def _land_all(self, end_on_failure: bool = True) -> None:
        while self._flights:
            self._land(self._flights.popleft(), end_on_failure)

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
            self._status = replace(self._status, restart_reason="")
            self._enter(TRACKING, tracking_text(state))

    def _emit(self, outcome, pending: Pending, result, is_keyframe: bool, trusted: bool, final: bool) -> None:
        """A frame's first output: published now; final now or when its window's successor ran."""
        output = output_of(self._stream, pending, result, is_keyframe, trusted, final)
        self._placing.add_pose(outcome, output)
        self._status = replace(self._status.counted(processed=1), last_placed=output.index)
        self._placing.first(outcome, self._stream, output)

    def _rerun(self, outcome, pending: Pending, result, is_keyframe: bool) -> None:
        """An overlap frame run again by the next window (placing.py: which value stays)."""
        final = self._stream.windows.is_final(pending.position)
        self._placing.again(outcome, self._stream, output_of(self._stream, pending, result, is_keyframe, True, final))

    # -- stream ends -----------------------------------------------------------------------------

    def _close(self, outcome: StepOutcome, lost: bool) -> None:
        """The stream's input ends here: buffered frames run as a short phase 1 (``lost``: they
        are dropped, the session may be mid-step), provisional outputs become final."""
        self._land_all(end_on_failure=False)
        state = self._stream
        unconfirmed = state.stamps.unconfirmed()   # a reset or the end of the input: nothing followed it
        if unconfirmed is not None:
            self._reject(outcome, unconfirmed[0].reason)
        try:
            if not lost:
                with torch.inference_mode():
                    self._place(outcome, self.session.close_scale_phase())
        except Exception as error:   # as a frame's failure: its frames count as failed, the run ends
            self._failed(outcome, "model failed on the last scale frames", error, None)
            self.session.reset()
        state.run.awaiting.clear()   # placed, lost or failed
        if state.windows is not None:
            self._placing.windows_end(outcome, state)

    def _switch_window(self, outcome: StepOutcome) -> None:
        """The current window is full: a new session run starts from its last ``ov`` frames."""
        rerun = self._streams.window_switch(self._stream)
        for pending, results in zip(rerun, self._ahead.start_window(rerun, self.session)):
            self._run(outcome, pending, results)

    def _end_stream(self, outcome: StepOutcome, reason: str, keep_map: bool, lost: bool = False) -> None:
        """The one way a stream ends (reset, restart, failure) and the next one starts. Buffered
        scale frames run first (a short phase 1, unless ``lost``), so that every processed frame
        gets its pose. keep_map: the map and trajectory continue from the last pose, the ended
        stream kept at its own scale (store/map_store.py); otherwise both are cleared."""
        self._close(outcome, lost)
        self.session.reset()
        self._ahead.discard(until_switch=False)
        self._stream, cleared = self._streams.restarted(self._stream, keep_map)
        # The odometry buffer stays: the frames still queued need theirs (the front end clears it
        # when odometry stamps go back, as a looped bag's do).
        self._continuations.ended()
        self._status = replace(self._status.counted(restarts=1, cleared=cleared), restart_reason=reason)
        self._enter(RESTARTED, f"restarted: {reason}")
        if not lost:
            kept = "map continues from the last pose" if keep_map else "map cleared"
            outcome.notices.append(Notice(RESTART, f"stream restarted ({kept}): {reason}"))

    def _failed(self, outcome: StepOutcome, what: str, error: Exception, index: int | None, then: str = "") -> None:
        text, lost = f"{what}: {type(error).__name__}: {error}", self._stream.run.lost(index, self._status.last_placed)
        self._status = replace(self._status.counted(failed=len(lost)), last_error=text)
        outcome.notices.append(Notice(FAILED, text + then))
        self.bundle.release_cached_memory()

    def _reject(self, outcome: StepOutcome, text: str) -> None:
        self._status = replace(self._status.counted(rejected=1), last_error=text)
        outcome.notices.append(Notice(REJECTED, text))

    # -- the status ---------------------------------------------------------------------------------

    def _done(self, outcome: StepOutcome) -> StepOutcome:
        self._publish_snapshot()
        return outcome

    def _init_text(self) -> str:
        return init_text(self._stream, self.settings.num_scale_frames, self._status.restart_reason)

    def _enter(self, state: int, text: str) -> None:
        self._status = self._status.entered(state, text)

    def _publish_snapshot(self) -> None:
        self.recorder.sync(self.window_records(), self._stream.frames.conversion, self.robot.mount)
        self._snapshot = snapshot(self._status, self._stream, self.session.usage(),
                                  needed=self.settings.num_scale_frames, map_points=self._store.num_points(),
                                  trajectory_poses=self._store.num_poses(), camera_mount=self.robot.mount_source,
                                  map_database=self.recorder.text, map_database_error=self.recorder.failure)
