"""mapping/rig/grouping.py: the rig's grouping rule against a naive reference (plain lists, the
module docstring's rule applied in the simplest way), random add/ready sequences, both modes;
and the settings' refusals."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lingbot_ros.mapping.records import InputFrame
from lingbot_ros.mapping.rig.grouping import (MAX_CAMERAS, OVERFLOW, SUPERSEDED, UNKNOWN, FrameGrouper,
                                              GroupingSettings)
from lingbot_ros.mapping.settings import SettingsError

MS = 1_000_000
RGB = np.zeros((2, 2, 3), np.uint8)


def frame(stamp_ms: float, received_ms: float = 0.0, gap_ns=None) -> InputFrame:
    return InputFrame(rgb=RGB, stamp_ns=round(stamp_ms * MS), received_ns=round(received_ms * MS), gap_ns=gap_ns)


def grouper(cameras=("a", "b"), tolerance_s=0.05, wait_s=0.1, process_all=False, queue_size=30):
    return FrameGrouper(GroupingSettings(cameras=tuple(cameras), camera_sync_tolerance_s=tolerance_s,
                                         camera_sync_wait_s=wait_s, process_all_frames=process_all,
                                         queue_size=queue_size))


def stamps(groups):
    """[[(camera, stamp_ms), ...], ...]"""
    return [[(f.camera, f.frame.stamp_ns / MS) for f in group] for group in groups]


# -- the rule, case by case ------------------------------------------------------------------------

def test_frames_within_the_tolerance_run_together_once_every_camera_has_one():
    g = grouper()
    g.add("a", frame(1000))
    assert g.ready() == []   # b may still send a frame of this moment
    g.add("b", frame(1030))
    assert stamps(g.ready()) == [[("a", 1000), ("b", 1030)]]
    assert g.pending() == {"a": 0, "b": 0}


def test_a_camera_whose_frame_is_past_the_tolerance_is_decided_without_waiting():
    g = grouper()
    g.add("a", frame(1000))
    g.add("b", frame(1070))   # 70 ms later: nothing b sends later belongs with a's frame
    assert stamps(g.ready()) == [[("a", 1000)]]
    assert g.pending() == {"a": 0, "b": 1}   # b's frame waits for a's next
    g.add("a", frame(1100))
    assert stamps(g.ready()) == [[("a", 1100), ("b", 1070)]]   # a group lists the cameras in order
    assert g.status().partial_groups == 1


def test_a_silent_camera_delays_the_others_by_the_wait_bound_only():
    g = grouper(wait_s=0.1)
    g.add("a", frame(1000, received_ms=5000))
    assert g.ready(now_ns=5100 * MS) == []          # waited exactly the bound: not longer
    assert stamps(g.ready(now_ns=5101 * MS)) == [[("a", 1000)]]
    assert g.status().timed_out_groups == 1


def test_newest_frame_wins_keeps_the_slot_waiting_since_its_first_frame():
    """A camera faster than the wait bound still runs while another is silent: the slot's wait
    does not start again with each newer frame."""
    g = grouper(wait_s=0.1)
    g.add("a", frame(1000, received_ms=5000, gap_ns=40 * MS))
    refused = g.add("a", frame(1033, received_ms=5033, gap_ns=33 * MS))
    assert [(r.kind, r.stamp_ns) for r in refused] == [(SUPERSEDED, 1000 * MS)]
    g.add("a", frame(1066, received_ms=5066, gap_ns=33 * MS))
    [[taken]] = g.ready(now_ns=5101 * MS)
    assert taken.frame.stamp_ns == 1066 * MS
    assert taken.frame.gap_ns == 40 * MS   # it spans the dropped frames (InputFrame.after_dropped)
    counts = g.status().cameras["a"]
    assert (counts.taken, counts.dropped_superseded, counts.waiting) == (1, 2, 0)


def test_process_all_frames_refuses_a_frame_beyond_the_queue_and_counts_it():
    g = grouper(process_all=True, queue_size=2)
    assert g.add("a", frame(0)) == [] and g.add("a", frame(10)) == []
    [refusal] = g.add("a", frame(20))
    assert refusal.kind == OVERFLOW and refusal.stamp_ns == 20 * MS and "queue_size" in refusal.text
    assert g.status().cameras["a"].dropped_overflow == 1
    assert g.pending() == {"a": 2, "b": 0}


def test_a_stamp_that_goes_back_is_passed_on_and_does_not_wedge_the_others():
    g = grouper(process_all=True)
    g.add("a", frame(10_000))
    g.add("b", frame(10_010))
    assert stamps(g.ready()) == [[("a", 10_000), ("b", 10_010)]]
    g.add("a", frame(1_000))    # a's bag looped: its Mapper decides what that means
    g.add("b", frame(10_110))
    g.add("a", frame(1_100))
    assert stamps(g.ready()) == [[("a", 1_000)], [("a", 1_100)]]
    g.add("a", frame(10_100))
    assert stamps(g.ready()) == [[("a", 10_100), ("b", 10_110)]]


def test_an_ended_camera_is_not_waited_for_and_drain_releases_the_rest():
    g = grouper(("a", "b", "c"), process_all=True)
    g.add("a", frame(0))
    g.add("b", frame(10))
    assert g.ready() == []
    g.end_input("c")
    assert stamps(g.ready()) == [[("a", 0), ("b", 10)]]
    g.add("a", frame(100))
    assert g.ready() == []
    assert stamps(g.drain()) == [[("a", 100)]]


def test_a_frame_of_no_camera_of_the_rig_is_refused_and_counted():
    g = grouper()
    [refusal] = g.add("c", frame(0))
    assert refusal.kind == UNKNOWN and "'c'" in refusal.text
    assert g.status().unknown_frames == 1 and g.pending() == {"a": 0, "b": 0}


def test_clear_drops_and_counts_every_waiting_frame():
    g = grouper(process_all=True)
    g.add("a", frame(0))
    g.add("a", frame(10))
    g.add("b", frame(100))
    assert g.clear() == 3
    assert g.pending() == {"a": 0, "b": 0}
    assert g.status().cameras["a"].dropped_cleared == 2


# -- the settings ----------------------------------------------------------------------------------

@pytest.mark.parametrize("values, says", [
    (dict(cameras=()), "at least one camera"),
    (dict(cameras=("a", "a")), "repeated: ['a']"),
    (dict(cameras=tuple(f"c{i}" for i in range(MAX_CAMERAS + 1))), f"at most {MAX_CAMERAS} cameras"),
    (dict(cameras=("",)), "non-empty"),
    (dict(cameras=("front/left",)), "letters, digits and single underscores"),
    (dict(cameras=("2nd",)), "start with a letter"),
    (dict(cameras=("a__b",)), "single underscores"),
    (dict(cameras=("_a",)), "start with a letter"),
    (dict(cameras=("a" * 65,)), "longer than 64"),
    (dict(cameras=("a", 3)), "non-empty string"),
    (dict(cameras="ab"), "must be a tuple"),
    (dict(camera_sync_tolerance_s=math.nan), "finite"),
    (dict(camera_sync_tolerance_s=math.inf), "finite"),
    (dict(camera_sync_tolerance_s=-0.01), ">= 0"),
    (dict(camera_sync_tolerance_s=5.0), "<= 1"),
    (dict(camera_sync_wait_s=60.0), "<= 10"),
    (dict(queue_size=0), ">= 1"),
])
def test_settings_refuse_what_cannot_work_and_say_what_to_change(values, says):
    with pytest.raises(SettingsError) as caught:
        GroupingSettings(**{"cameras": ("a", "b"), **values})
    assert says in str(caught.value)


def test_settings_take_a_list_of_names():
    assert GroupingSettings(cameras=["front", "rear_left"]).cameras == ("front", "rear_left")


# -- the rule against a naive reference, random sequences ------------------------------------------

class Reference:
    """The module docstring's rule with plain lists: what may wait, which heads form the next
    group, and whether it may (and must) be released."""

    def __init__(self, s: GroupingSettings):
        self.s = s
        self.waiting = {name: [] for name in s.cameras}   # [(frame, since_ns)]
        self.ended = set()
        self.dropped = {name: [] for name in s.cameras}   # frame_ids superseded or refused

    def add(self, camera, f):
        slot = self.waiting[camera]
        self.ended.discard(camera)
        if not self.s.process_all_frames and slot:
            older, since = slot.pop()
            self.dropped[camera].append(older.frame_id)
            slot.append((f, since))
            return SUPERSEDED
        if len(slot) >= (self.s.queue_size if self.s.process_all_frames else 1):
            self.dropped[camera].append(f.frame_id)
            return OVERFLOW
        slot.append((f, f.received_ns))
        return None

    def next_group(self):
        heads = {name: slot[0][0].stamp_ns for name, slot in self.waiting.items() if slot}
        if not heads:
            return []
        first = min(heads.values())
        return [name for name in self.s.cameras
                if name in heads and heads[name] <= first + round(self.s.camera_sync_tolerance_s * 1e9)]

    def releasable(self, now_ns):
        group = self.next_group()
        if not group:
            return False
        decided = all(n in group or self.waiting[n] or n in self.ended for n in self.s.cameras)
        wait_ns = round(self.s.camera_sync_wait_s * 1e9)
        timed_out = now_ns is not None and any(
            since < now_ns - wait_ns for slot in self.waiting.values() for _, since in slot)
        return decided or timed_out

    def release(self, group):
        return [self.waiting[name].pop(0)[0] for name in group]


CAMERAS = ("a", "b", "c")
events = st.lists(st.one_of(
    st.tuples(st.just("add"), st.sampled_from(CAMERAS), st.integers(0, 80),   # stamp step (ms)
              st.booleans(), st.integers(0, 60)),                             # it goes back; arrival step
    st.tuples(st.just("ready"), st.integers(0, 200)),                         # clock step (ms)
    st.tuples(st.just("offline_ready")),
    st.tuples(st.just("end"), st.sampled_from(CAMERAS))), max_size=80)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=events, process_all=st.booleans(), tolerance_ms=st.integers(0, 60), wait_ms=st.integers(0, 150),
       queue_size=st.integers(1, 6), silent=st.sampled_from((None, *CAMERAS)))
def test_grouping_follows_the_rule_in_random_sequences(events, process_all, tolerance_ms, wait_ms, queue_size,
                                                       silent):
    """Each released group is the reference's next group, released when the rule lets it and
    never held back when it must go; every frame given either runs exactly once or is counted
    as dropped; a camera's frames run in the order they came; a group's stamps lie within the
    tolerance; after ready(now) no frame has waited longer than the bound (``silent``: a camera
    that never sends)."""
    s = GroupingSettings(cameras=CAMERAS, camera_sync_tolerance_s=tolerance_ms / 1000,
                         camera_sync_wait_s=wait_ms / 1000, process_all_frames=process_all, queue_size=queue_size)
    g, ref = FrameGrouper(s), Reference(s)
    stamp_ms = {name: 1_000_000 for name in CAMERAS}
    now = 0
    added = {name: 0 for name in CAMERAS}
    ran = {name: [] for name in CAMERAS}   # frame_ids (each camera's frames numbered as given)

    def take(groups, now_ns, final=False):
        for group in groups:
            expected = ref.next_group()
            assert final or ref.releasable(now_ns)
            assert [f.camera for f in group] == expected
            assert [f.frame.frame_id for f in group] == [f.frame_id for f in ref.release(expected)]
            group_stamps = [f.frame.stamp_ns for f in group]
            assert max(group_stamps) - min(group_stamps) <= tolerance_ms * MS
            for f in group:
                ran[f.camera].append(f.frame.frame_id)
        assert final or not ref.releasable(now_ns), "a group the rule releases was held back"

    for event in events:
        if event[0] == "add":
            _, camera, step, back, arrive = event
            if camera == silent:
                continue
            stamp_ms[camera] += -20 * step if back else step
            now += arrive * MS
            f = InputFrame(rgb=RGB, stamp_ns=stamp_ms[camera] * MS, frame_id=str(added[camera]), received_ns=now)
            added[camera] += 1
            expected = ref.add(camera, f)
            assert [r.kind for r in g.add(camera, f)] == ([expected] if expected else [])
        elif event[0] == "ready":
            now += event[1] * MS
            take(g.ready(now_ns=now), now)
            assert all(now - since <= wait_ms * MS for slot in ref.waiting.values() for _, since in slot)
        elif event[0] == "offline_ready":
            take(g.ready(), None)
        else:
            g.end_input(event[1])
            ref.ended.add(event[1])
    take(g.drain(), None, final=True)
    assert g.pending() == {name: 0 for name in CAMERAS}

    status = g.status()
    for name in CAMERAS:
        counts, numbers = status.cameras[name], [int(i) for i in ran[name]]
        # a camera's frames run in the order they came, each at most once: newest-frame-wins never
        # runs a frame that came before one already run
        assert numbers == sorted(set(numbers))
        # every frame given ran or was counted as dropped, not both
        dropped = [int(i) for i in ref.dropped[name]]
        assert sorted(numbers + dropped) == list(range(added[name]))
        assert (counts.taken, counts.dropped_superseded + counts.dropped_overflow) == (len(numbers), len(dropped))
        assert counts.waiting == 0
        if process_all:
            assert counts.dropped_superseded == 0
        else:
            assert counts.dropped_overflow == 0
