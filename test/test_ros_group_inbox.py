"""ros/group_inbox.py: a rig's frames from the callbacks' threads to the worker, grouped by the
FrameGrouper's rule; back-pressure per camera with process_all_frames."""
import threading
import time

import numpy as np

from lingbot_ros.mapping.records import InputFrame
from lingbot_ros.mapping.rig.grouping import GroupingSettings
from lingbot_ros.ros.group_inbox import GroupInbox


def frame(stamp_s: float) -> InputFrame:
    return InputFrame(rgb=np.zeros((4, 4, 3), np.uint8), stamp_ns=round(stamp_s * 1e9), frame_id="cam",
                      received_ns=time.monotonic_ns())


def settings(**values) -> GroupingSettings:
    return GroupingSettings(**{"cameras": ("front", "back"), "camera_sync_wait_s": 0.2, **values})


def stamps(group) -> list:
    return [(member.camera, member.frame.stamp_ns / 1e9) for member in group]


def test_frames_of_one_instant_leave_as_one_group_newest_wins_per_camera():
    inbox = GroupInbox(settings())
    assert inbox.put("front", frame(1.0)) == []
    superseded = inbox.put("front", frame(1.1))
    assert [(r.camera, r.kind) for r in superseded] == [("front", "superseded")]
    assert inbox.get(0.01) is None   # the back camera's frame of that instant may still come
    assert inbox.put("back", frame(1.12)) == []
    assert stamps(inbox.get(0.01)) == [("front", 1.1), ("back", 1.12)]


def test_a_silent_camera_delays_the_other_by_the_wait_bound_only():
    inbox = GroupInbox(settings())
    inbox.put("front", frame(1.0))
    start = time.monotonic()
    group = None
    while group is None and time.monotonic() - start < 5:
        group = inbox.get(0.02)
    assert stamps(group) == [("front", 1.0)]
    assert 0.15 < time.monotonic() - start < 2.0


def test_process_all_frames_holds_back_a_full_camera_only():
    inbox = GroupInbox(settings(process_all_frames=True, queue_size=2))
    for k in range(2):
        assert inbox.put("front", frame(1.0 + k)) == []
    done = threading.Event()
    thread = threading.Thread(target=lambda: (inbox.put("front", frame(3.0)), done.set()), daemon=True)
    thread.start()
    assert not done.wait(0.3)                       # front's third frame waits for room
    assert inbox.put("back", frame(1.0)) == []      # the back camera is not held
    assert stamps(inbox.get(0.01)) == [("front", 1.0), ("back", 1.0)]
    assert done.wait(2.0)                           # room: the waiting frame went in
    assert inbox.clear() == 2


def test_a_closed_inbox_refuses_and_releases_a_waiting_camera():
    inbox = GroupInbox(settings(process_all_frames=True, queue_size=1))
    inbox.put("front", frame(1.0))
    refusals = []
    thread = threading.Thread(target=lambda: refusals.extend(inbox.put("front", frame(2.0))), daemon=True)
    thread.start()
    time.sleep(0.2)
    inbox.close()
    thread.join(2.0)
    assert not thread.is_alive() and [r.kind for r in refusals] == ["closed"]
    assert [r.kind for r in inbox.put("back", frame(1.0))] == ["closed"]
