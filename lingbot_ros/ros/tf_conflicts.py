"""Who else publishes our TF child frames: the node must never steal a link of a robot's tree.

A frame has one parent in TF; two publishers of one child frame make it jump between them (e.g.
AMCL's map -> odom against ours, or the robot's odom -> base_link against a map_to_base output).
``TfConflictWatch(node, child_frames)`` listens to /tf (in batches, through a tap node) and
/tf_static and reports the first
transform of one of ``child_frames`` that is not the node's own:
- on /tf_static, every such transform (the node publishes no static transform: a child that is
  already in the static tree belongs to someone else; transient local, so the check covers what
  was published before the node started);
- on /tf, one whose publisher is another node (from the message's publisher gid and the ROS
  graph), or, where that is not known (older rclpy releases have no publisher gid in their
  message info), one whose (child, stamp, parent) the node did not report through ``published()``
  before publishing it. The error then lists the other nodes publishing /tf instead.

How the TF output uses it:
    watch = TfConflictWatch(node, [child])
    if watch.conflict is None:
        watch.published(child, parent, stamp_ns)   # before publish, so the echo is recognised
        publisher.publish(...)
    ...
    watch.destroy()

Limits: a publisher that starts after the node and publishes the same child is caught when its
first transform arrives, so the node may have published a few transforms before that. Two nodes
of the same fully qualified name are indistinguishable in the graph; without a publisher gid, a
second node publishing exactly our transform (same stamp and parent) is not caught.
"""
from __future__ import annotations

import collections
import dataclasses
import struct
import threading

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message

from lingbot_ros.ros.tap import Tap
from lingbot_ros.ros.messages import stamp_ns
from lingbot_ros.ros.tf_messages import TF_STATIC_QOS, TF_STATIC_TOPIC, TF_TOPIC, tf_message_type

# Best effort matches every /tf publisher, reliable or not; a dropped sample costs nothing here,
# the next one of the same publisher is checked the same way. The history holds what arrives
# between two drains (DRAIN_PERIOD_S) at 1,000 messages/s with room.
_WATCH_QOS = QoSProfile(reliability=ReliabilityPolicy.BEST_EFFORT, durability=DurabilityPolicy.VOLATILE,
                        history=HistoryPolicy.KEEP_LAST, depth=1000)
# /tf (a robot's tree, other robots' at hundreds of messages a second) is read in batches
# (ros/tap.py), this often.
DRAIN_PERIOD_S = 0.2
# Own transforms remembered for recognising their echo: at 30 Hz, about 8 s of them.
_OWN_RECORD = 256


@dataclasses.dataclass(frozen=True)
class TfConflict:
    child: str          # the frame both publish
    parent: str         # the parent the other publisher gives it
    topic: str          # /tf or /tf_static
    publisher: str      # the other node's fully qualified name, or "" where it is not known
    suspects: tuple[str, ...] = ()   # without ``publisher``: the other nodes publishing ``topic``

    @property
    def message(self) -> str:
        if self.publisher:
            who = f"node {self.publisher}"
        elif self.suspects:
            who = f"another publisher (other nodes publishing {self.topic}: {', '.join(self.suspects)})"
        else:
            who = "another publisher"
        return (f"frame '{self.child}' already has parent '{self.parent}' on {self.topic} from {who}: "
                f"publishing it too would make TF jump between two parents, so this node's TF output "
                f"is off. Pick another tf_mode, or stop the other publisher, then reconfigure")


class TfConflictWatch:
    """Subscribes to /tf and /tf_static on ``node`` and records the first ``TfConflict``.

    ``conflict`` is that first conflict (sticky: it stays until ``destroy``) or None. On detection
    it logs one ERROR naming the frame, the other parent and the other publisher, before
    ``conflict`` is set.
    ``published(child, parent, stamp_ns)`` records a transform the node is about to publish.
    Raises TfUnavailable when tf2_msgs is not importable.
    """

    def __init__(self, node, child_frames):
        self.child_frames = frozenset(child_frames)
        self.conflict: TfConflict | None = None
        self._node = node
        self._own_name = node.get_fully_qualified_name()
        self._lock = threading.Lock()
        self._own = collections.deque(maxlen=_OWN_RECORD)   # (child, stamp_ns, parent), newest last
        self._publishers: dict[bytes, str] = {}               # publisher gid -> node name, from the graph
        group = MutuallyExclusiveCallbackGroup()
        tf_message = self._type = tf_message_type()
        # /tf is read raw: a message that names none of our child frames (another robot's tree,
        # at hundreds of messages a second) is skipped with a byte search, never deserialised. A
        # CDR string is its length (NUL included) then its bytes and a NUL, little or big endian.
        self._needles = tuple(struct.pack(order + "I", len(name.encode()) + 1) + name.encode() + b"\0"
                              for name in self.child_frames for order in "<>")
        self._tap = Tap(node, tf_message, TF_TOPIC, _WATCH_QOS, self._on_tf_raw, DRAIN_PERIOD_S, group, raw=True)
        self._subscriptions = [
            node.create_subscription(tf_message, TF_STATIC_TOPIC, self._on_tf_static, TF_STATIC_QOS,
                                     callback_group=group),
        ]

    def published(self, child: str, parent: str, stamp_ns: int) -> None:
        with self._lock:
            self._own.append((child, stamp_ns, parent))

    def _on_tf_raw(self, data: bytes, info) -> None:
        if self.conflict is not None or not any(needle in data for needle in self._needles):
            return
        self._on_tf(deserialize_message(data, self._type), info)

    def _on_tf(self, msg, info) -> None:
        if self.conflict is not None:   # sticky: nothing left to find out
            return
        for transform in msg.transforms:
            if transform.child_frame_id not in self.child_frames:
                continue
            publisher = self._publisher_name(info, TF_TOPIC)
            if publisher is not None:
                own = publisher == self._own_name
            else:
                with self._lock:
                    own = (transform.child_frame_id, stamp_ns(transform.header.stamp),
                           transform.header.frame_id) in self._own
            if not own:
                self._report(transform, TF_TOPIC, publisher)
                return

    def _on_tf_static(self, msg, info) -> None:
        if self.conflict is not None:
            return
        for transform in msg.transforms:
            if transform.child_frame_id in self.child_frames:
                self._report(transform, TF_STATIC_TOPIC, self._publisher_name(info, TF_STATIC_TOPIC))
                return

    def _publisher_name(self, info, topic: str) -> str | None:
        """The publishing node's fully qualified name, or None where the message info has no
        publisher gid (older rclpy releases) or the graph does not list the publisher (yet)."""
        gid = (info.get("publisher_gid") or {}).get("data")
        if gid is None:
            return None
        gid = bytes(gid)
        if gid not in self._publishers:   # refresh on a miss: a new publisher
            for endpoint in self._node.get_publishers_info_by_topic(topic):
                self._publishers[bytes(endpoint.endpoint_gid[:len(gid)])] = _full_name(endpoint)
        return self._publishers.get(gid)

    def _report(self, transform, topic: str, publisher: str | None) -> None:
        suspects = () if publisher else tuple(sorted(
            {_full_name(endpoint) for endpoint in self._node.get_publishers_info_by_topic(topic)}
            - {self._own_name}))
        conflict = TfConflict(transform.child_frame_id, transform.header.frame_id, topic, publisher or "", suspects)
        self._node.get_logger().error(conflict.message)
        self.conflict = conflict   # after the log: whoever sees the conflict can find the ERROR

    def destroy(self) -> None:
        for subscription in self._subscriptions:
            self._node.destroy_subscription(subscription)
        self._subscriptions = []
        self._tap.destroy()


def _full_name(endpoint) -> str:
    """A graph endpoint's node as a fully qualified name (/ns/name)."""
    return f"{endpoint.node_namespace.rstrip('/')}/{endpoint.node_name}"
