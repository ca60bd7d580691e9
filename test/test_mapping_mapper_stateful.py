"""mapping/: the Mapper against a plain reference, random verb sequences (as test_cache_stateful.py
does for the cache). A tiny model on the CPU takes frames, rollbacks, flushes, resets, size
changes, stamp jumps, model failures, saves and map reads, under the windowed policy (window
switches) or the reset policy (cache caps), at keyframe interval 1 or 2. After every step:

- the saved trajectory holds exactly the frames placed and not rolled back or cleared, in order,
  once each, with their stamps;
- the counters balance (processed = saved + rolled back + cleared; buffered and failed frames);
- a refused rollback changed nothing;
- the map database (committed) says what the Mapper holds: trajectory, map, windows, conversion;
and at every map read or save: the map's voxels are exactly those of the keyframes still in it
(final values, provisional ones as they stand, a rolled-back keyframe's only while already merged)
and windows.csv lists exactly the windows of what is saved.

The reference is told nothing but what a user sees: the outputs, notices and answers of each
verb. The defects issue 17 listed are plain tests at the end, driven through the same machine.
Seed: printed; MAPPER_MACHINE_SEED=N repeats a run.
"""
import collections
import os
import random
from pathlib import Path

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from lingbot_ros.cache import NothingToRollback
from lingbot_ros.mapping.files.export import read_ply, read_tum
from lingbot_ros.mapping.mapper import Mapper
from lingbot_ros.mapping.records import FAILED, REJECTED, RESTART, InputFrame

from helpers import assert_database_is_the_mapper, mapper_of, tiny_settings

pytestmark = pytest.mark.usefixtures("torch_single_thread")

STEP_NS, JITTER_NS, JUMP_NS = 10**8, 2 * 10**8, 10 * 10**9
MAX_JITTER_NS = 5 * 10**8            # max_stamp_jitter_s's default
VOXEL = 0.05
_BASE = cv2.resize((np.random.default_rng(7).random((60, 80)) * 255).astype(np.uint8), (640, 480),
                   interpolation=cv2.INTER_CUBIC)
SIZES = ((640, 480), (560, 420))
SEEN = collections.Counter()   # what the runs exercised (printed: a run that exercises nothing shows)


def image(shift_px: int, size) -> np.ndarray:
    rgb = np.dstack([np.roll(_BASE, shift_px, axis=1)] * 3)
    if size != SIZES[0]:
        rgb = cv2.resize(rgb, size, interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(rgb)


def tiny_mapper(files: dict, **overrides) -> Mapper:
    """The Mapper of every example: the tiny model loaded once, a fresh session each."""
    return mapper_of(tiny_settings(files, **{"num_scale_frames": 2, "scale_frames": 2, "sliding_window": 3,
                                             "map_points_stride": 8, "map_voxel_size_m": VOXEL, "warmup": False,
                                             **overrides}))


def voxels(xyz: np.ndarray) -> set:
    xyz = np.asarray(xyz, np.float64)
    xyz = xyz[np.isfinite(xyz).all(axis=1)]
    return set(map(tuple, np.floor(xyz / VOXEL).astype(np.int64)))


class MapperMachine(RuleBasedStateMachine):
    files: dict = {}
    tmp: Path = Path("/tmp")

    # ---- set-up ---------------------------------------------------------------------------

    @initialize(policy=st.sampled_from(["windowed", "reset"]), interval=st.sampled_from([1, 2]),
                window=st.sampled_from([4, 5]), overlap=st.sampled_from([1, 2, 3]),
                max_keyframes=st.sampled_from([0, 5]), scale=st.sampled_from([None, 2.0]))
    def setup(self, policy, interval, window, overlap, max_keyframes, scale):
        # A fixed scale of 2 puts the map in metres (voxels of VOXEL / 2 model units) and keeps the
        # reference's voxels exact (doubling is exact in floating point).
        scaled = {"scale_source": "fixed", "scale": scale} if scale else {}
        SEEN["fixed scale"] += bool(scale)
        self.start(long_run_policy=policy, keyframe_interval=interval, window_size=window,
                   overlap_size=overlap, max_keyframes=max_keyframes, **scaled)

    def start(self, **overrides):
        self.mapper = tiny_mapper(self.files, map_database=str(self.tmp / "map.db"), **overrides)
        self.fail_next = False
        original = self.mapper.session.step

        def step(*args, **kwargs):   # a model failure on demand (fail_next)
            if self.fail_next:
                self.fail_next = False
                raise RuntimeError("injected failure")
            return original(*args, **kwargs)
        self.mapper.session.step = step
        self.saves = 0
        self.stamp_ns = 1000 * 10**9
        self.last_accepted_ns = None   # the stamp rule's reference (None after a restart)
        self.size = SIZES[0]
        self.next_index = 0            # the Mapper's index of the next accepted frame
        self.saved: list[int] = []     # placed, not rolled back or cleared, in order
        self.stamps: dict[int, int] = {}
        self.stream_of: dict[int, int] = {}
        self.stream = 0
        self.buffered: list[int] = []  # accepted, not placed yet
        self.seen: set[int] = set()    # ever placed
        self.points: dict[int, set] = {}    # keyframes whose points count in the map: voxels
        self.held: int | None = None   # the newest final keyframe, its points not merged yet
        self.counts = dict(processed=0, rolled_back=0, cleared=0, failed=0, rejected=0)

    def teardown(self):
        if hasattr(self, "mapper"):
            self.mapper.close()

    # ---- the reference --------------------------------------------------------------------

    def _clear(self):
        self.counts["cleared"] += len(self.saved)
        self.saved, self.points, self.held = [], {}, None

    def _stream_ends(self):
        self.stream += 1
        self.held = None               # the ended stream's points are merged for good
        self.last_accepted_ns = None

    def _take(self, outcome, current: int | None, survivor: int | None = None):
        """Apply one verb's outputs and notices, in the order the Mapper made them (``current``: the
        index of the verb's first frame; a confirmed stamp jump takes two)."""
        restarts = [n for n in outcome.notices if n.kind == RESTART]
        before = [n for n in restarts if "cache cap" not in n.text]   # these came before the frame
        after = [n for n in restarts if "cache cap" in n.text]
        failed = any(n.kind == FAILED for n in outcome.notices)
        old = [o for o in outcome.new if current is None or o.index < current]
        new = [o for o in outcome.new if current is not None and o.index >= current]
        old_final = [o for o in outcome.final if current is None or o.index < current or not before]
        new_final = [o for o in outcome.final if before and current is not None and o.index >= current]
        self._outputs(old, old_final, outcome.revised)
        for notice in before:
            self._stream_ends()
            if "map cleared" in notice.text:
                self._clear()
        self._outputs(new, new_final)
        SEEN.update(n.kind for n in outcome.notices)
        SEEN["provisional"] += sum(o.provisional for o in outcome.new)
        if failed:
            lost = [i for i in self.buffered + ([current] if current is not None else [])
                    if i not in self.seen and i != survivor]
            self.counts["failed"] += len(set(lost))
            self.buffered = [survivor] if survivor is not None else []
            self._stream_ends()
        for _ in after:
            self._stream_ends()

    def _outputs(self, new, final, revised=()):
        for o in new:
            assert o.index not in self.seen, f"frame {o.index} placed twice"
            assert o.index in self.buffered, f"frame {o.index} placed but never buffered"
            self.buffered.remove(o.index)
            self.seen.add(o.index)
            self.saved.append(o.index)
            self.stream_of[o.index] = self.stream
            self.counts["processed"] += 1
            if o.provisional and o.is_keyframe:
                self.points[o.index] = voxels(o.points(0.0, 8)[0])
        for o in revised:
            assert o.provisional and o.index in self.seen
            if o.is_keyframe:
                self.points[o.index] = voxels(o.points(0.0, 8)[0])
        for o in final:
            assert not o.provisional
            if o.is_keyframe:
                self.points[o.index] = voxels(o.points(0.0, 8)[0])
                self.held = o.index
            else:
                self.points.pop(o.index, None)

    # ---- rules ----------------------------------------------------------------------------

    @rule(count=st.integers(1, 8), shift=st.integers(0, 40))
    def frames(self, count, shift):
        """A run of ordinary frames (windows fill up and switch)."""
        self.run_of_frames(count, shift)

    @rule(count=st.integers(1, 8), shift=st.integers(0, 40))
    def more_frames(self, count, shift):
        """The same rule again: frames come twice as often as anything else."""
        self.run_of_frames(count, shift)

    def run_of_frames(self, count, shift):
        for i in range(count):
            self.frame(shift=(shift + 8 * i) % 48, kind="next")

    @rule(kind=st.sampled_from(["flush", "reset", "fail", "jitter", "back", "gap", "outlier", "size"]),
          shift=st.integers(0, 40))
    def event(self, kind, shift):
        """Everything else that happens to a stream, less often than frames."""
        if kind == "flush":
            self.flush()
        elif kind == "reset":
            self.reset()
        elif kind == "fail":
            self.fail()
        else:
            self.frame(shift, kind)

    @rule(count=st.integers(1, 3))
    def rollbacks(self, count):
        for _ in range(count):
            self.rollback()

    @rule(save=st.booleans())
    def read(self, save):
        self.save() if save else self.read_map()

    def frame(self, shift, kind):
        if kind in ("gap", "outlier") and self.last_accepted_ns is not None:
            # A forward jump is held until the next frame: it follows (a real jump) or not (an outlier).
            self.stamp_ns += JUMP_NS
            held_ns = self.stamp_ns
            outcome = self.mapper.process(InputFrame(rgb=image(shift, self.size), stamp_ns=held_ns))
            assert not outcome.notices and not outcome.new and self.mapper.snapshot.held_frames == 1
            SEEN[f"held ({kind})"] += 1
            if kind == "gap":
                self.stamp_ns += STEP_NS
                self.feed((shift + 8) % 48, held_ns)
            else:
                self.stamp_ns -= JUMP_NS - STEP_NS
                self.counts["rejected"] += 1
                self.feed(shift)
            return
        self.stamp_ns += {"next": STEP_NS, "size": STEP_NS, "jitter": -JITTER_NS, "back": -JUMP_NS,
                          "gap": JUMP_NS, "outlier": JUMP_NS}[kind]
        if kind == "size":
            self.size = SIZES[1] if self.size == SIZES[0] else SIZES[0]
        self.feed(shift)

    def feed(self, shift, held_ns=None):
        """One frame; ``held_ns``: the stamp of a held frame it confirms (both are taken)."""
        stamp = self.stamp_ns
        window = self.mapper.snapshot.window
        outcome = self.mapper.process(InputFrame(rgb=image(shift, self.size), stamp_ns=stamp))
        assert self.mapper.snapshot.held_frames == 0
        last = self.last_accepted_ns
        if held_ns is None and last is not None and last - MAX_JITTER_NS <= stamp < last:
            assert [n.kind for n in outcome.notices] == [REJECTED] and not outcome.new
            self.counts["rejected"] += 1
            self.stamp_ns = last       # the rule's reference stays: step on from it
            return
        current = self.next_index
        for taken in ([held_ns] if held_ns is not None else []) + [stamp]:
            self.buffered.append(self.next_index)
            self.stamps[self.next_index] = taken
            self.next_index += 1
        # A model failure on the held frame (taken first) ends its stream; the frame that confirmed
        # it goes on into the next one (phase 1: buffered, num_scale_frames >= 2).
        survivor = current + 1 if held_ns is not None else None
        self._take(outcome, current, survivor)
        SEEN["window switch"] += self.mapper.snapshot.window > window
        ended_after = any(n.kind == FAILED or "cache cap" in n.text for n in outcome.notices)
        # After a confirmed jump the confirming frame is the reference (of the stream a failure of
        # the held frame began; no cache cap ends a stream of two frames).
        self.last_accepted_ns = stamp if not ended_after or survivor is not None else None

    def rollback(self):
        before = self._observable()
        try:
            text = self.mapper.rollback_last_frame()
        except NothingToRollback:
            assert self._observable() == before, "a refused rollback changed something"
            SEEN["rollback refused"] += 1
            return
        SEEN["rollback done"] += 1
        if text.startswith("dropped the newest buffered"):
            assert self.buffered, "dropped a buffered frame that the reference does not have"
            self.buffered.pop()
            return
        index = int(text.split()[3].rstrip(":"))
        assert self.saved and index == self.saved[-1], (text, self.saved[-3:])
        self.saved.pop()
        self.counts["rolled_back"] += 1
        if "left the map" in text:
            assert index == self.held, (text, self.held)
            self.points.pop(index)
            self.held = None
        elif "provisional" in text:
            self.points.pop(index, None)
        else:
            assert "already merged" in text and index != self.held, text

    def flush(self):
        assert "flushed" in self.mapper.flush()

    def reset(self):
        self._take(self.mapper.reset("test reset"), None)

    def fail(self):
        self.fail_next = True

    def read_map(self):
        xyz, _ = self.mapper.map_points()
        self.held = None
        assert voxels(xyz) == (set().union(*self.points.values()) if self.points else set())

    def save(self):
        directory = self.tmp / f"save{self.saves}"
        self.saves += 1
        saved = self.mapper.save(directory)
        SEEN["save"] += 1
        self.held = None
        trajectory = read_tum(directory / "trajectory.tum")
        assert saved.num_poses == len(trajectory) == len(self.saved)
        assert trajectory.stamps_ns().tolist() == [self.stamps[i] for i in self.saved]
        xyz, _ = read_ply(directory / "map.ply")
        assert voxels(xyz) == (set().union(*self.points.values()) if self.points else set())
        if self.mapper.settings.long_run_policy == "windowed":
            rows = [line.split(",") for line in (directory / "windows.csv").read_text().splitlines()[1:]]
            windows = [(int(r[0]), int(r[1])) for r in rows]
            assert all(first in self.saved for _, first in windows), (windows, self.saved)
            streams = {self.stream_of[i] for i in self.saved}
            assert sum(w == 0 for w, _ in windows) == len(streams), (windows, streams)
            firsts = [first for _, first in windows]
            assert firsts == sorted(set(firsts))

    # ---- invariants -----------------------------------------------------------------------

    def _observable(self):
        snap = self.mapper.snapshot
        return ([e.key for e in self.mapper.saved_trajectory()], snap.processed, snap.init_frames,
                snap.rolled_back, snap.keyframes, snap.cache_pages, snap.state_text,
                self.mapper.session.stats().frames_stored)

    @invariant()
    def trajectory_and_counters(self):
        if not hasattr(self, "mapper"):
            return
        saved = list(self.mapper.saved_trajectory())
        assert [e.key for e in saved] == self.saved
        assert [e.stamp_ns for e in saved] == [self.stamps[i] for i in self.saved]
        snap, c = self.mapper.snapshot, self.counts
        assert (snap.processed, snap.rolled_back, snap.cleared, snap.failed, snap.rejected) == \
            (c["processed"], c["rolled_back"], c["cleared"], c["failed"], c["rejected"])
        assert snap.processed == len(self.saved) + snap.rolled_back + snap.cleared
        assert snap.trajectory_poses == len(self.saved)
        assert snap.init_frames == len(self.buffered)

    @invariant()
    def database_is_the_mapper(self):
        if hasattr(self, "mapper"):
            assert_database_is_the_mapper(self.mapper)


@pytest.fixture
def machine(fixture_files, tmp_path):
    MapperMachine.files, MapperMachine.tmp = fixture_files, tmp_path
    made = []

    def make(**overrides) -> MapperMachine:
        m = MapperMachine()
        m.start(**overrides)
        made.append(m)
        return m
    yield make
    for m in made:
        m.teardown()


def test_mapper_against_the_reference(fixture_files, tmp_path):
    MapperMachine.files, MapperMachine.tmp = fixture_files, tmp_path
    value = int(os.environ.get("MAPPER_MACHINE_SEED", random.randrange(2**32)))
    print(f"mapper state machine seed {value} (MAPPER_MACHINE_SEED={value} repeats it)")
    run_state_machine_as_test(seed(value)(MapperMachine), settings=settings(
        max_examples=int(os.environ.get("MAPPER_MACHINE_EXAMPLES", 6)), stateful_step_count=35,
        deadline=None, database=None, suppress_health_check=list(HealthCheck)))
    print("exercised:", dict(SEEN))


# ---- the defects of issue 17, one example each ---------------------------------------------------

WINDOWED = dict(long_run_policy="windowed", window_size=10, overlap_size=4)


def frames(m, count):
    for _ in range(count):
        m.frame(shift=(m.next_index * 8) % 48, kind="next")
        m.trajectory_and_counters()


def test_rollback_of_provisional_and_then_final_frames_leaves_no_points(machine):
    """Rolling back an overlap frame said its points stay in the map (false), and a later
    rollback of a final frame left that frame's points in the map."""
    m = machine(**WINDOWED)
    frames(m, 10)                      # frames 6..9 provisional, 5 the newest final keyframe
    for index in (9, 8, 7, 6, 5):
        m.rollback()
        m.trajectory_and_counters()
    assert m.saved == list(range(5))
    m.read_map()
    m = machine(**WINDOWED)
    frames(m, 6)
    m.rollback()
    m.read_map()


def test_rollbacks_beyond_the_window_inputs_refuse_and_change_nothing(machine):
    """The 13th rollback answered IndexError after removing a frame from the session and the
    trajectory."""
    m = machine(long_run_policy="windowed", window_size=20, overlap_size=4, sliding_window=16)
    frames(m, 16)                      # 14 frames stored: the cache could undo 13 or more
    for _ in range(16):
        m.rollback()                   # the machine checks that a refusal changed nothing
        m.trajectory_and_counters()
    assert len(m.saved) == 16 - 12     # the window keeps the inputs of 4 + 8 frames
    m.save()


def test_keyframe_interval_2_rolls_back_only_the_newest_frame(machine):
    """With keyframe_interval 2 the cache dropped keyframe 11 while the window bookkeeping
    dropped frame 12."""
    m = machine(**WINDOWED, keyframe_interval=2)
    frames(m, 13)
    m.rollback()                       # 12 is not stored: refused, or it is and goes
    m.rollback()
    frames(m, 12)                      # through the switch
    m.read_map()
    m.save()


def test_overlap_1_rollbacks_after_a_switch_keep_the_rerun_frame(machine):
    """With overlap 1, two rollbacks right after a switch removed the re-run frame from the new
    window's phase-1 buffer (the next window then aligned onto the wrong frame)."""
    m = machine(long_run_policy="windowed", window_size=10, overlap_size=1, num_scale_frames=3, scale_frames=3)
    frames(m, 11)                      # frame 10 starts window 1: re-run 9, buffered with 10
    m.rollback()
    m.rollback()
    frames(m, 8)
    m.read_map()
    m.save()


def test_windows_csv_after_reset_and_rollback(machine):
    """windows.csv kept the windows of streams a reset cleared, and of rolled-back frames."""
    m = machine(**WINDOWED)
    frames(m, 14)
    m.reset()
    frames(m, 1)
    m.rollback()                       # the new stream's only frame, buffered
    frames(m, 12)
    m.save()


def test_an_overlap_longer_than_the_step_finalises_each_frame_once(machine):
    """Found by the machine: with overlap > window - overlap a frame is in the overlap of two
    windows after its own; it was made final (its points merged) at its first re-run and again at
    the second."""
    m = machine(long_run_policy="windowed", window_size=4, overlap_size=3)
    frames(m, 6)
    m.read_map()
    frames(m, 7)
    m.save()


def test_phase_1_frames_are_not_processed_until_placed(machine):
    """lingbot-ros-demo --frames 5 reported 5 frames processed and saved 0 poses."""
    m = machine(long_run_policy="windowed", num_scale_frames=8, scale_frames=8, window_size=16, overlap_size=8)
    frames(m, 5)
    assert m.mapper.snapshot.processed == 0 and m.mapper.snapshot.init_frames == 5
    m.save()
    frames(m, 3)
    assert m.mapper.snapshot.processed == 8
    m.save()


def test_failures_stamp_jumps_and_size_changes(machine):
    m = machine(long_run_policy="reset", max_keyframes=5, keyframe_interval=2)
    frames(m, 3)
    m.fail()
    frames(m, 3)
    for kind in ("size", "gap", "next", "jitter", "next", "outlier", "next", "back", "next", "size", "next"):
        m.frame(shift=8, kind=kind)
        m.trajectory_and_counters()
    frames(m, 8)                       # a cache cap restart
    m.read_map()
    m.save()


def test_a_model_failure_on_a_held_frame_keeps_the_frame_that_confirmed_it(machine):
    """Found by the machine: a confirmed stamp jump takes two frames in one verb; a model failure
    on the held one loses it (and the frames buffered before it), not the frame after it."""
    m = machine(long_run_policy="windowed", window_size=4, overlap_size=1)
    m.frame(shift=0, kind="next")
    m.fail()
    m.frame(shift=0, kind="gap")
    m.trajectory_and_counters()
    assert m.mapper.snapshot.failed == 1 and m.mapper.snapshot.init_frames == 1
    frames(m, 3)
    m.frame(shift=8, kind="jitter")    # the confirming frame is the new stream's reference
    m.trajectory_and_counters()
    m.database_is_the_mapper()
