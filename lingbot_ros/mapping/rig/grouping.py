"""Which frames of a camera rig run together: the one grouping rule, for the node and the offline
tool (issue 29).

Frames come in per camera (``FrameGrouper.add``); ``ready`` hands out groups, each at most one
frame per camera, that run as one batched step (``RigMapper.process``). The rule, precisely
(stamps are ``InputFrame.stamp_ns``; a frame's arrival is its ``received_ns``, the front end's
``time.monotonic_ns()`` when it got it, the clock ``ready(now_ns)`` is given):

- **Waiting frames.** Each camera keeps its frames in the order they came. Newest-frame-wins
  (the default, as the single-camera node's inbox): at most one; a newer frame replaces it (the
  older one is dropped, counted as ``dropped_superseded``; the newer takes over its stamp gap,
  ``InputFrame.after_dropped``, and its waiting time: the camera has waited since the first frame
  of its slot came, so a fast camera's slot still times out). ``process_all_frames``: a FIFO of at
  most ``queue_size`` frames; a frame beyond that is refused (``dropped_overflow``), never queued.
- **The next group.** Its anchor is the head (oldest waiting frame) of the camera whose head is
  stamped earliest (a tie: the camera listed first). The group is the anchor and every other
  camera's head stamped at most ``camera_sync_tolerance_s`` after it. Every head is at or after
  the anchor, so any two stamps of a group lie within the tolerance of each other; only heads
  join, so each camera's frames leave in the order they came. (Greedy, earliest first: a head
  just inside the tolerance joins even if that camera's next frame would have been closer.)
- **Release.** The next group is released, and the rule applied again, while one holds:
  1. *decided*: every camera is in the group, or has a head (stamped past the tolerance: a frame
     it sends later is later still), or its input has ended (``end_input``, offline);
  2. *timed out*: some camera's head, in the group or not, has waited longer than
     ``camera_sync_wait_s`` at ``now_ns``. So a missing or slow camera never blocks the others:
     after ``ready(now_ns)`` no frame has waited longer than the bound.
  Without ``now_ns`` (offline input has no wall clock) only rule 1 applies, and ``drain()``
  releases everything still waiting at the end. A front end that leaves ``received_ns`` 0 while
  passing ``now_ns`` gets every frame at once, ungrouped.
- **Stamps are not judged here.** Each camera has its own Mapper with its own stamp rule: a
  frame stamped before its camera's previous one (a looped bag, a clock jump) is passed on like
  any other. It cannot wedge the others: as the earliest head it anchors the next group, which
  is released by the same two rules. Groups leave in their anchors' stamp order among the frames
  waiting; a frame that comes after a later-stamped group has left is not dropped but runs in a
  later group.
"""
from __future__ import annotations

import collections
import dataclasses
import re

from ..records import InputFrame
from ..settings import SettingsError, field_errors, setting

# Cameras of one rig: Isaac ROS cuVSLAM takes 1-32; each is a stream in one page pool.
MAX_CAMERAS = 32
MAX_CAMERA_NAME_CHARS = 64
# A camera name becomes a topic name token (~/<name>/image): ROS 2 allows letters, digits and
# underscores, not a leading digit (rmw_validate_full_topic_name). A leading underscore and a
# double one are refused too: ROS reserves names that begin with "__".
_CAMERA_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
# A group's stamps lie within the tolerance: a second spans ten frames of a 10 Hz camera, beyond
# any one moment of a rig.
MAX_SYNC_TOLERANCE_S = 1.0
MAX_SYNC_WAIT_S = 10.0
MAX_QUEUED_FRAMES = 1000   # per camera; each queued frame is a decoded image (0.9 MB at 640x480)


def camera_name_error(name) -> str | None:
    """Why ``name`` cannot name a camera of the rig, or None."""
    if not isinstance(name, str) or not name:
        return f"a camera name must be a non-empty string, got {name!r}"
    if len(name) > MAX_CAMERA_NAME_CHARS:
        return f"camera name {name[:16]!r}... is longer than {MAX_CAMERA_NAME_CHARS} characters"
    if not _CAMERA_NAME.match(name) or "__" in name:
        return (f"camera name {name!r} must start with a letter and hold only letters, digits and single "
                "underscores (it becomes a topic name, ~/<name>/image)")
    return None


def cameras_error(value) -> str | None:
    """Why ``value`` cannot be the rig's camera names (without the setting's name), or None."""
    if not value:
        return "must name at least one camera"
    if len(value) > MAX_CAMERAS:
        return f"must name at most {MAX_CAMERAS} cameras, not {len(value)}"
    for name in value:
        error = camera_name_error(name)
        if error:
            return f"is refused: {error}"
    repeated = sorted({name for name in value if value.count(name) > 1})
    if repeated:
        return f"must name each camera once; repeated: {repeated}"
    return None


@dataclasses.dataclass(frozen=True)
class GroupingSettings:
    """How a rig's frames are grouped; validated when built (a SettingsError says what to change).
    The node's parameters and the tools' flags of the same names."""

    cameras: tuple = setting((), f"the rig's camera names, in order (1 to {MAX_CAMERAS}; letters, digits and "
                                 "single underscores, starting with a letter: each becomes the topic "
                                 "~/<name>/image)", check=cameras_error)
    camera_sync_tolerance_s: float = setting(0.05, "frames of different cameras stamped at most this far apart "
                                                   "run in one batched step (at most "
                                                   f"{MAX_SYNC_TOLERANCE_S:g} s)", minimum=0,
                                             maximum=MAX_SYNC_TOLERANCE_S)
    camera_sync_wait_s: float = setting(0.1, "how long a frame waits for the other cameras' frames before it "
                                             "runs without them (a missing or slow camera delays the others by "
                                             f"at most this; at most {MAX_SYNC_WAIT_S:g} s)", minimum=0,
                                        maximum=MAX_SYNC_WAIT_S)
    process_all_frames: bool = setting(False, "every frame of every camera, in order, in a bounded queue per "
                                              "camera, instead of newest-frame-wins per camera")
    queue_size: int = setting(30, "frames queued per camera with process_all_frames (a frame beyond it is "
                                  f"refused and counted); at most {MAX_QUEUED_FRAMES}", minimum=1,
                              maximum=MAX_QUEUED_FRAMES)

    def __post_init__(self):
        if isinstance(self.cameras, list):   # a YAML list or a ROS string array
            object.__setattr__(self, "cameras", tuple(self.cameras))
        errors = field_errors(self)
        if errors:
            raise SettingsError("invalid settings: " + "; ".join(errors))


@dataclasses.dataclass(frozen=True)
class RigFrame:
    """One camera's input frame."""

    camera: str          # a name of the rig's cameras
    frame: InputFrame    # as the single-camera Mapper takes it


SUPERSEDED, OVERFLOW, UNKNOWN = "superseded", "overflow", "unknown camera"


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A frame that will not run: replaced by a newer frame of its camera (SUPERSEDED), refused by
    its camera's full queue (OVERFLOW) or of no camera of the rig (UNKNOWN)."""

    camera: str
    stamp_ns: int
    kind: str
    text: str


@dataclasses.dataclass(frozen=True)
class CameraCounts:
    """One camera's frames through the grouper since it was built."""

    taken: int = 0                # released in a group
    dropped_superseded: int = 0   # newest-frame-wins: replaced by a newer frame before it ran
    dropped_overflow: int = 0     # process_all_frames: refused by a full queue
    dropped_cleared: int = 0      # waiting when clear() ran (a reset)
    waiting: int = 0              # waiting now


@dataclasses.dataclass(frozen=True)
class GroupingStatus:
    cameras: dict[str, CameraCounts]
    groups: int = 0            # groups released
    partial_groups: int = 0    # released without a frame of every camera
    timed_out_groups: int = 0  # released by the wait bound (rule 2)
    unknown_frames: int = 0    # frames of no camera of the rig, refused


@dataclasses.dataclass
class _Waiting:
    frame: InputFrame
    since_ns: int   # when the camera's slot started waiting (its arrival in a FIFO)


class FrameGrouper:
    """The rule of the module docstring over the rig's frames. One owner (the node's worker, or
    the offline loop): it takes no lock."""

    def __init__(self, settings: GroupingSettings):
        self.settings = settings
        self._tolerance_ns = round(settings.camera_sync_tolerance_s * 1e9)
        self._wait_ns = round(settings.camera_sync_wait_s * 1e9)
        self._capacity = settings.queue_size if settings.process_all_frames else 1
        self._queues: dict[str, collections.deque[_Waiting]] = {
            name: collections.deque() for name in settings.cameras}
        self._counts = {name: CameraCounts() for name in settings.cameras}
        self._ended: set[str] = set()
        self._groups = self._partial = self._timed_out = self._unknown = 0

    def add(self, camera: str, frame: InputFrame) -> list[Refusal]:
        """Queue ``camera``'s ``frame``; return the frames this add dropped or refused (each
        counted in the status)."""
        queue = self._queues.get(camera)
        if queue is None:
            self._unknown += 1
            return [Refusal(camera, frame.stamp_ns, UNKNOWN,
                            f"{camera!r} is none of the rig's cameras {list(self.settings.cameras)}")]
        self._ended.discard(camera)   # it came back
        if not self.settings.process_all_frames and queue:
            older = queue.popleft()
            queue.append(_Waiting(frame.after_dropped(older.frame), older.since_ns))
            self._count(camera, dropped_superseded=1)
            return [Refusal(camera, older.frame.stamp_ns, SUPERSEDED,
                            f"camera {camera!r}: a newer frame came before this one ran")]
        if len(queue) >= self._capacity:
            self._count(camera, dropped_overflow=1)
            return [Refusal(camera, frame.stamp_ns, OVERFLOW,
                            f"camera {camera!r}: {len(queue)} frames already wait (queue_size)")]
        queue.append(_Waiting(frame, frame.received_ns))
        return []

    def end_input(self, camera: str) -> None:
        """``camera`` sends nothing more (offline: its input is read): groups stop waiting for
        it. A later ``add`` for it undoes this."""
        if camera in self._queues:
            self._ended.add(camera)

    def ready(self, now_ns: int | None = None) -> list[list[RigFrame]]:
        """The groups released now, in order, each listing its frames in the order of
        ``cameras``; ``now_ns`` on the clock of ``received_ns`` (None: offline, no wait bound)."""
        groups = []
        while True:
            members = self._next_group()
            if not members:
                return groups
            decided = all(name in members or self._queues[name] or name in self._ended
                          for name in self._queues)
            if not decided and not self._any_timed_out(now_ns):
                return groups
            self._timed_out += not decided
            groups.append(self._release(members))

    def drain(self) -> list[list[RigFrame]]:
        """Every waiting frame, grouped, in order (the end of offline input)."""
        groups = []
        while members := self._next_group():
            groups.append(self._release(members))
        return groups

    def clear(self) -> int:
        """Drop every waiting frame (a reset); return how many."""
        total = 0
        for name, queue in self._queues.items():
            self._count(name, dropped_cleared=len(queue))
            total += len(queue)
            queue.clear()
        return total

    def pending(self) -> dict[str, int]:
        """Frames waiting per camera."""
        return {name: len(queue) for name, queue in self._queues.items()}

    def status(self) -> GroupingStatus:
        cameras = {name: dataclasses.replace(counts, waiting=len(self._queues[name]))
                   for name, counts in self._counts.items()}
        return GroupingStatus(cameras, self._groups, self._partial, self._timed_out, self._unknown)

    def _count(self, camera: str, **added: int) -> None:
        counts = self._counts[camera]
        self._counts[camera] = dataclasses.replace(
            counts, **{key: getattr(counts, key) + value for key, value in added.items()})

    def _next_group(self) -> list[str]:
        """The cameras whose heads form the next group (empty: nothing waits)."""
        heads = [(queue[0].frame.stamp_ns, name) for name, queue in self._queues.items() if queue]
        if not heads:
            return []
        anchor_ns = min(stamp for stamp, _ in heads)   # min() keeps the first listed on a tie
        return [name for stamp, name in heads if stamp - anchor_ns <= self._tolerance_ns]

    def _any_timed_out(self, now_ns: int | None) -> bool:
        # A FIFO's head came first, so it has waited longest.
        return now_ns is not None and any(queue and now_ns - queue[0].since_ns > self._wait_ns
                                          for queue in self._queues.values())

    def _release(self, members: list[str]) -> list[RigFrame]:
        self._groups += 1
        self._partial += len(members) < len(self._queues)
        for name in members:
            self._count(name, taken=1)
        return [RigFrame(name, self._queues[name].popleft().frame) for name in members]
