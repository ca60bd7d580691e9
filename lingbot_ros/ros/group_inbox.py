"""The worker's inbox for a camera rig: the cameras' frames grouped by mapping/rig/grouping.py.

The image callbacks of every camera ``put`` frames; the worker ``get``s groups (at most one frame
per camera, run as one batched step). The FrameGrouper is the rule (newest-frame-wins per camera,
or every frame with process_all_frames; the sync tolerance and wait bound); this module only makes
it safe between the callbacks' threads and the worker, as FrameInbox does for one camera. With
process_all_frames a camera's full queue makes its callback wait (back-pressure on a reliable
publisher, as FrameInbox) instead of refusing the frame; the other cameras go on.
"""
from __future__ import annotations

import collections
import time

from lingbot_ros.mapping.records import InputFrame
from lingbot_ros.mapping.rig.grouping import FrameGrouper, GroupingSettings, Refusal
from lingbot_ros.ros.worker import Inbox


# A Refusal's kind for a frame that came after deactivate (counted as dropped, like FrameInbox's).
CLOSED = "closed"


class GroupInbox(Inbox):
    def __init__(self, settings: GroupingSettings):
        super().__init__()
        self.settings = settings
        self._grouper = FrameGrouper(settings)
        self._groups: collections.deque = collections.deque()   # released, not taken by the worker yet

    def put(self, camera: str, frame: InputFrame) -> list[Refusal]:
        """Queue ``camera``'s frame; the frames it dropped (a superseded one). A closed inbox
        (deactivated) drops the frame itself: counted as one dropped frame by the caller."""
        with self._cond:
            if self.settings.process_all_frames:
                while self._grouper.pending()[camera] >= self.settings.queue_size and not self._closed:
                    self._cond.wait(0.1)
            if self._closed:
                return [Refusal(camera, frame.stamp_ns, CLOSED, f"camera {camera!r}: the node is not active")]
            refusals = self._grouper.add(camera, frame)
            self._cond.notify_all()
            return refusals

    def get(self, timeout: float):
        """The next group (a list of RigFrame), or None after ``timeout``. Polled by the worker,
        so a group held for a missing camera is released once the wait bound passes."""
        with self._cond:
            if not self._groups:
                self._groups.extend(self._grouper.ready(time.monotonic_ns()))
            if not self._groups:
                self._cond.wait(timeout)
                self._groups.extend(self._grouper.ready(time.monotonic_ns()))
            if not self._groups:
                return None
            group = self._groups.popleft()
            self._cond.notify_all()   # a camera waiting for room in its queue
            return group

    def clear(self) -> int:
        """Drop every waiting frame (deactivate); return how many."""
        with self._cond:
            count = self._grouper.clear() + sum(len(group) for group in self._groups)
            self._groups.clear()
            self._cond.notify_all()
            return count
