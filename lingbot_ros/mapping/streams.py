"""Everything that belongs to one stream, in one object that a restart replaces whole, and the one
place a stream starts.

A *stream* runs from a restart (configure, ``reset``, a stamp jump, a size change, a failure, a
cache cap) to the next one; a *session run* from a session reset to the next: a stream without
windows is one run, the windowed policy starts a new run at every window switch.

``Streams`` builds every ``StreamState``: the first one (configure, a new camera mount, a restart
that clears the map), the next one after a restart that keeps the map, and a stored run resumed.
It keeps what outlives a stream but not the map, ``EndedStreams``: the ended streams' window
records and where the last ended stream stopped in ``map``.

Vocabulary (code, notices, status and diagnostics use it alike):

    restart        a stream ends and the next begins: the session, the stamp rule's reference,
                   the scale estimate and the window bookkeeping start anew (``Mapper._end_stream``,
                   the one path). It keeps the map (an image size change, a model failure, the reset
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
"""
from __future__ import annotations

import collections
import dataclasses

import numpy as np

from ..stream.session import NOTHING_STORED
from .keyframes import MotionPolicy
from .placement.conversion import MapConversion, Placement
from .placement.robot import RobotFrames, StreamFrames
from .records import InputFrame
from .stamps import StampPolicy
from .windows.live import LiveWindows, Pending


@dataclasses.dataclass
class SessionRun:
    """One session run: what the session holds and what rollback may undo in it."""

    awaiting: collections.deque[Pending]     # given to the session, result not back (phase 1)
    # Indices of the frames given to the session, newest last, and of those among them stored
    # in the cache after phase 1 (kept keyframes): only the newest frame can be rolled back, and
    # only while it is stored, so the newest few are enough.
    given: collections.deque[int]
    stored: collections.deque[int]
    motion: MotionPolicy | None
    has_results: bool = False                # phase 1 is over

    @classmethod
    def new(cls, rollback_depth: int, keyframe_interval: int, motion: MotionPolicy | None) -> "SessionRun":
        return cls(collections.deque(), collections.deque(maxlen=rollback_depth * keyframe_interval + 1),
                   collections.deque(maxlen=rollback_depth), motion)

    def give(self, pending: Pending) -> None:
        """``pending`` goes to the session: the newest frame given, awaited until its result is back."""
        self.awaiting.append(pending)
        self.given.append(pending.index)

    def buffered_new(self) -> int:
        """Frames buffered for phase 1 that were never placed (not the ones a window re-runs)."""
        return sum(not p.rerun for p in self.awaiting)

    def rollback_refusal(self) -> str:
        """Why this run cannot name the frame a session rollback would undo ('' if it can): a
        buffered phase-1 frame always; otherwise only the newest frame given, and only while
        stored. Whether the session holds one at all is its rule (StreamingSession.rollback_refusal,
        asked first); the run's ``stored`` keeps the newest few only, and when they are used up it
        answers in the session's words."""
        if self.awaiting:
            return ""
        if not self.stored:
            return NOTHING_STORED
        if not self.given or self.given[-1] != self.stored[-1]:
            newest = self.given[-1] if self.given else "?"
            return (f"the newest frame ({newest}) is not stored in the cache (not a keyframe): only the "
                    "newest frame can be rolled back, and only while it is stored")
        return ""

    def lost(self, index: int, last_placed: int | None) -> set[int]:
        """The frames a failure on frame ``index`` loses: the buffered ones never placed (frames are
        placed in index order) and ``index`` itself unless it got its pose."""
        placed = -1 if last_placed is None else last_placed
        lost = {p.index for p in self.awaiting if not p.rerun and p.index > placed}
        return lost if last_placed == index else lost | {index}


@dataclasses.dataclass
class StreamState:
    placement: Placement                     # the stream's model world in the internal frame
    frames: StreamFrames                     # its metric scale and conversion into map
    stamps: StampPolicy
    windows: LiveWindows | None              # the windowed policy's bookkeeping, provisional outputs
    run: SessionRun
    untrusted_next: bool = True              # the stream's first placed pose is not to be fused
    input_wh: tuple[int, int] | None = None
    resume_note: tuple[int, str] | None = None   # (window, text): a resumed window's status says so

    def apply_live(self, settings) -> None:
        """New values of LIVE settings for the policies this stream holds."""
        if self.run.motion is not None:
            self.run.motion.min_parallax_px = settings.keyframe_min_parallax_px
        self.stamps.set_limits(settings.max_stamp_gap_s, settings.max_stamp_jitter_s)

    def rollback_refusal(self, session_refusal: str) -> str:
        """Why the newest frame cannot be rolled back ('' if it can): the session's rule
        (``session_refusal``, its rollback_refusal()), the run's, then the windows' (a frame a
        window runs again for its alignment)."""
        windows, buffered = self.windows, bool(self.run.awaiting)
        return (session_refusal or self.run.rollback_refusal()
                or (windows.refuses_rollback(had_result=not buffered) if windows else ""))

    def rolled_back(self) -> int | None:
        """The session rolled its newest frame back: out of the run's bookkeeping. Its index, or None
        for a buffered phase-1 frame (dropped; its index stays used: indices never repeat)."""
        self.run.given.pop()
        if not self.run.awaiting:
            return self.run.stored.pop()
        self.run.awaiting.pop()
        if self.windows is not None:
            self.windows.forget_newest(had_result=False)
        return None


@dataclasses.dataclass(frozen=True)
class EndedStreams:
    """What the map keeps of the streams that ended in it (replaced whole; a clear starts anew)."""

    records: tuple = ()                         # their window records, oldest first
    last_map_pose: np.ndarray | None = None     # T_M_camera where the last of them stopped


class Streams:
    def __init__(self, settings, robot: RobotFrames, store, preprocessor):
        self.settings, self.robot, self.store, self.preprocessor = settings, robot, store, preprocessor
        self.ended = EndedStreams()

    def first(self) -> StreamState:
        """A stream with no earlier one to continue from."""
        return self._new(*self.robot.first_stream())

    def start(self, resumed) -> tuple[StreamState, str]:
        """The Mapper's first stream: a new one, or (``resumed`` from database/resume.py, None: no
        resume) the stored run's map, trajectory and mount, and its stream (``resumed``)."""
        if resumed is None:
            return self.first(), ""
        self.store.resume(resumed.trajectory, resumed.voxel_map, resumed.finished)
        if resumed.mount is not None:
            self.robot.set_mount(resumed.mount, "the resumed run")
        return self.resumed(resumed, self.first())

    def restarted(self, ended: StreamState, keep_map: bool) -> tuple[StreamState, int]:
        """The next stream after ``ended``, and the map points cleared (0 where the map is kept)."""
        if keep_map:
            return self.after(ended), 0
        cleared = self.store.clear()
        return self.after_clear(), cleared

    def after_clear(self) -> StreamState:
        """The map is cleared: nothing of the ended streams is left."""
        self.ended = EndedStreams()
        return self.first()

    def after(self, ended: StreamState) -> StreamState:
        """The map is kept: the next stream continues from the ended one's last pose."""
        conversion = ended.frames.conversion
        newest = self.store.newest_poses(1, conversion)
        last = newest[0][0].pose if newest and newest[0][1] is conversion else None   # T_I_camera
        if ended.windows is not None:
            self.ended = dataclasses.replace(self.ended, records=self.ended.records + tuple(ended.windows.records))
        return self._continuing(conversion, last)

    def _continuing(self, conversion: MapConversion, last: np.ndarray | None) -> StreamState:
        """Keep the map, continue from ``last`` (T_I_camera of the ended stream, None: it has none):
        one internal frame for every stream with a constant scale; otherwise the ended stream goes
        into map once, at its scale (store/map_store.py), and the next one starts where it stopped."""
        if self.robot.constant_scale:
            self.store.merge()
            return self._new(*(self.robot.continuing_in(conversion, last) if last is not None
                               else self.robot.first_stream()))
        if last is not None:
            self.ended = dataclasses.replace(self.ended, last_map_pose=conversion.camera_pose(last))
        self.store.end_stream(conversion)
        pose = self.ended.last_map_pose
        return self._new(*(self.robot.continuing_stream(pose) if pose is not None else self.robot.first_stream()))

    def resumed(self, resumed, current: StreamState) -> tuple[StreamState, str]:
        """The stream a resumed run (database/resume.py) continues with, and what the status says:
        the next window aligned to the stored window's last frames (as ``new_window`` does live)
        in the stored stream, at its scale; or, without them, a new stream from the last pose as
        after a restart that keeps the map (the stored windows are an ended stream's)."""
        where = f"resumed run {resumed.run} ({resumed.ending}) at frame {resumed.next_index}"
        constant = self.robot.constant_scale
        if (current.windows is not None and resumed.placement is not None and resumed.overlap
                and (constant or "odometry_stamps_ns" in resumed.carried)):
            frames = current.frames
            if not constant:   # the stored stream's scale estimate and the odometry it reads go on
                frames = self.robot.resumed_stream(resumed.conversion, resumed.carried)
                for stamp_ns, pose in zip(resumed.carried["odometry_stamps_ns"].tolist(),
                                          resumed.carried["odometry_poses"]):
                    self.robot.odometry.add(stamp_ns, pose)
            state = self._new(resumed.placement, frames)
            state.windows.records = list(resumed.records)
            inputs = [Pending(InputFrame(rgb=f.rgb, stamp_ns=f.stamp_ns), f.index, 0, False, self.preprocessor(f.rgb))
                      for f in resumed.overlap]
            state.windows.resume(resumed.window, inputs, [f.result for f in resumed.overlap], resumed.provisional)
            state.resume_note = (resumed.window + 1, where)
            return state, (f"{where}: window {resumed.window + 1} aligns to its stored frames "
                           f"{inputs[0].index}-{inputs[-1].index}")
        why = resumed.stale or "no overlap frames stored"
        if constant:
            conversion = current.frames.conversion
            newest = self.store.newest_poses(1, conversion)
            if not newest:
                return current, f"{where}: it holds no frame, a new map starts"
            self.ended = EndedStreams(tuple(resumed.records))
            return (self._continuing(conversion, newest[0][0].pose),
                    f"{where}: {why}, a new stream continues from the last pose")
        newest = self.store.newest_poses(1, resumed.conversion)
        # The newest pose is an earlier stream's (its conversion None): in map already.
        earlier = newest[0][0].pose @ self.robot.mount if newest and newest[0][1] is None else None
        self.ended = EndedStreams(tuple(resumed.records), earlier)
        state = self._continuing(resumed.conversion, newest[0][0].pose if newest and newest[0][1] is not None else None)
        if self.ended.last_map_pose is None:
            return state, f"{where}: it holds no frame, a new map starts"
        return state, f"{where}: {why}, a new stream at its own scale continues from the last pose"

    def window_switch(self, state: StreamState) -> list[Pending]:
        """The windowed policy's next window in ``state`` (the session was reset): a new session run,
        the frames it runs first (the last window's ``ov``, to align to them)."""
        state.run = self.new_run()
        state.frames.window_switch()
        return state.windows.next_window()

    def new_run(self) -> SessionRun:
        s = self.settings
        motion = MotionPolicy(s.keyframe_min_parallax_px) if s.keyframe_policy == "motion" else None
        return SessionRun.new(s.scale_frames + s.sliding_window + 1, s.keyframe_interval, motion)

    def _new(self, placement: Placement, frames: StreamFrames) -> StreamState:
        s = self.settings
        windows = LiveWindows(s.window_rule(), s.window_alignment) if s.long_run_policy == "windowed" else None
        return StreamState(placement=placement, frames=frames,
                           stamps=StampPolicy(s.max_stamp_gap_s, s.max_stamp_jitter_s),
                           windows=windows, run=self.new_run())
