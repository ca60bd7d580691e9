"""mapping/: ``Mapper.process_queued`` (a frame's step queued before the frame before is placed)
gives every frame the outcome ``process`` gives it: the same outputs, bit for bit on the CPU, the
same notices and counters, over stamp drops and restarts, size changes, window switches, the
motion policy's rollbacks and model failures, fed in runs of any length (a run ends where the
node's inbox runs dry)."""
import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lingbot_ros.mapping.records import FAILED, InputFrame

from helpers import frame

pytestmark = pytest.mark.usefixtures("torch_single_thread")

STEP_S = 0.1
# What comes next: a frame (stamp a step on, the view moved a little or much, dropped jitter, a
# jump back that restarts, a new size), a model failure on the next step, or the end of a run of
# queued frames.
EVENTS = st.lists(st.sampled_from(["next"] * 4 + ["move"] * 2 + ["jitter", "back", "size", "fail", "end"]), min_size=4, max_size=22)
SETTINGS = st.sampled_from([
    dict(long_run_policy="windowed", window_size=6, overlap_size=2),
    dict(long_run_policy="windowed", window_size=5, overlap_size=2, keyframe_interval=2),
    dict(long_run_policy="reset", max_keyframes=5),
    dict(long_run_policy="reset", keyframe_policy="motion", keyframe_min_parallax_px=4.0),
])


def inputs(events) -> list:
    """``events`` as frames (None: the next step fails) split into runs."""
    runs, run, stamp_s, size, shift = [], [], 1.0, None, 0
    for event in events:
        if event == "end":
            runs.append(run)
            run = []
            continue
        if event == "fail":
            run.append(None)
            continue
        stamp_s += {"next": STEP_S, "move": STEP_S, "size": STEP_S, "jitter": -0.2, "back": -10.0}[event]
        if event == "size":
            size = None if size else (560, 420)
        shift += {"next": 4, "move": 24}.get(event, 0)   # 2 and 12 px at the motion policy's 320
        run.append(frame(shift, stamp_s=stamp_s, size=size))
    return runs + [run]


def summary(outcome) -> tuple:
    def outputs(items):
        return [(o.index, o.stamp_ns, o.is_keyframe, o.provisional, o.trusted, o.camera_pose.tobytes(),
                 o.result.depth.numpy().tobytes()) for o in items]
    return (outcome.taken.stamp_ns if outcome.taken is not None else None, outputs(outcome.new),
            outputs(outcome.final), outputs(outcome.revised), [(n.kind, n.text) for n in outcome.notices])


def run_both(tiny_mapper, monkeypatch, overrides: dict, runs: list) -> tuple[list, list, object, object]:
    frames = [f for run in runs for f in run]
    # None in the input: the next step call fails (the same frame's, in both modes).
    plain, queued = (tiny_mapper(num_scale_frames=2, scale_frames=2, sliding_window=3, warmup=False, **overrides)
                     for _ in range(2))
    seen_plain, seen_queued = [], []
    fail_next = {"plain": [False], "queued": [False]}
    for name, mapper in (("plain", plain), ("queued", queued)):
        step = mapper.session.step

        def maybe_failing(*args, name=name, step=step, **kwargs):
            if fail_next[name][0]:
                fail_next[name][0] = False
                raise RuntimeError("CUDA out of memory (simulated)")
            return step(*args, **kwargs)

        monkeypatch.setattr(mapper.session, "step", maybe_failing)
    for item in frames:
        if item is None:
            fail_next["plain"][0] = True
            continue
        seen_plain.append(summary(plain.process(item)))

    def fed(run):
        for item in run:
            if item is None:
                fail_next["queued"][0] = True
                continue
            yield item

    for run in runs:
        seen_queued += [summary(outcome) for outcome in queued.process_queued(fed(run))]
    return seen_plain, seen_queued, plain, queued


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=EVENTS, overrides=SETTINGS)
def test_queued_frames_get_the_outcomes_of_one_at_a_time(tiny_mapper, monkeypatch, events, overrides):
    runs = inputs(events)
    seen_plain, seen_queued, plain, queued = run_both(tiny_mapper, monkeypatch, overrides, runs)
    monkeypatch.undo()
    assert len(seen_queued) == len(seen_plain)
    for i, (a, b) in enumerate(zip(seen_plain, seen_queued)):
        assert a == b, f"frame {i} of {events}"
    counters = ("processed", "rejected", "failed", "restarts", "cleared", "keyframes", "trajectory_poses")
    assert [getattr(queued.snapshot, c) for c in counters] == [getattr(plain.snapshot, c) for c in counters]
    end_plain, end_queued = summary(plain.finish()), summary(queued.finish())
    assert end_queued == end_plain
    (xyz_plain, rgb_plain), (xyz_queued, rgb_queued) = plain.map_points(), queued.map_points()   # merged by finish
    assert np.array_equal(xyz_queued, xyz_plain) and np.array_equal(rgb_queued, rgb_plain)
    assert not queued.step_running


def test_a_queued_frame_waits_in_flight_and_is_placed_when_the_next_is_queued(tiny_mapper):
    """The pipeline's order: a phase-2 frame's outcome comes only after the next frame was taken,
    or when no next frame comes."""
    mapper = tiny_mapper(num_scale_frames=2, scale_frames=2, sliding_window=3, warmup=False, long_run_policy="reset")
    asked = []

    def frames():
        for i in range(5):
            asked.append(i)
            yield frame(4 * i, stamp_s=1.0 + STEP_S * i)

    order = []
    for outcome in mapper.process_queued(frames()):
        order.append((len(asked), [o.index for o in outcome.new]))
    # Phase 1 (frames 0, 1) is placed before the next frame is asked for; frames 2 and 3 once
    # the frame after them was taken; frame 4 at the end.
    assert order == [(1, []), (2, [0, 1]), (4, [2]), (5, [3]), (5, [4])]


def test_a_placing_failure_loses_the_frame_queued_behind_it(tiny_mapper, monkeypatch):
    """A frame whose outputs are not finite fails when placed; the frame already queued behind it
    ran in the stream that ends there: it is lost too, counted, and the next frames map on. (No
    resume point is stored while mapping: one due places every frame before the next is queued.)"""
    mapper = tiny_mapper(num_scale_frames=2, scale_frames=2, sliding_window=3, warmup=False, long_run_policy="reset",
                         map_database_continuation_s=0.0)
    for i in range(3):
        mapper.process(frame(4 * i, stamp_s=1.0 + STEP_S * i))
    step = mapper.session.step
    poisoned = [True]

    def poisoning(*args, **kwargs):
        results = step(*args, **kwargs)
        if poisoned[0]:
            poisoned[0] = False
            bad = results[0].depth.clone()
            bad.view(-1)[0] = float("nan")
            return [dataclasses.replace(results[0], depth=bad)]
        return results

    monkeypatch.setattr(mapper.session, "step", poisoning)
    outcomes = list(mapper.process_queued(frame(4 * i, stamp_s=1.0 + STEP_S * i) for i in range(3, 8)))
    assert [o.index for o in outcomes[0].new] == [] and [n.kind for n in outcomes[0].notices] == [FAILED]
    assert outcomes[1].new == [] and mapper.snapshot.failed == 2
    assert [len(o.new) for o in outcomes[2:]] == [0, 2, 1]   # a new stream: phase 1, then on
    assert np.isfinite(mapper.map_points()[0]).all()


def test_an_abandoned_run_places_what_it_queued(tiny_mapper):
    mapper = tiny_mapper(num_scale_frames=2, scale_frames=2, sliding_window=3, warmup=False, long_run_policy="reset")
    outcomes = mapper.process_queued(frame(4 * i, stamp_s=1.0 + STEP_S * i) for i in range(6))
    for _ in range(3):
        next(outcomes)
    outcomes.close()
    assert not mapper.step_running and mapper.snapshot.processed == 4   # frames 0-3 placed
    assert [o.index for o in mapper.process(InputFrame(rgb=frame(40).rgb, stamp_ns=2 * 10**9)).new] == [4]
