"""The node's TF output: one transform per pose on /tf, fitted into a robot's tree (REP 105),
and the watch that keeps it from stealing a link.

Modes (``tf_mode``, ros/params.py's TF_MODES), each publishing one edge, parent -> child:
  none            nothing
  map_to_odom     map_frame -> odom_frame = T_map_base(t) @ inverse(T_odom_base(t)), with the
                  robot's own odometry T_odom_base at the image stamp t (REP 105: the robot keeps
                  publishing odom -> base_frame, we correct its drift)
  map_to_base     map_frame -> base_frame = T_map_base (a robot without other odometry)
  map_to_camera   map_frame -> camera_frame_name = T_map_camera, a frame of the node's own
                  (not the camera driver's frame, which already has a parent)
Messages go out as tf2_msgs/TFMessage on /tf with tf2's broadcaster QoS.

The node never steals a link. A frame has one parent in TF; two publishers of one child frame
make it jump between them (e.g. AMCL's map -> odom against ours, or the robot's odom -> base_link
against a map_to_base output). A TfConflictWatch listens to /tf (in batches, through a tap node)
and /tf_static and reports the first transform of our child frame that is not the node's own:
- on /tf_static, every such transform (the node publishes no static transform: a child that is
  already in the static tree belongs to someone else; transient local, so the check covers what
  was published before the node started);
- on /tf, one whose publisher is another node (from the message's publisher gid and the ROS
  graph), or, where that is not known (older rclpy releases have no publisher gid in their
  message info), one whose (child, stamp, parent) the output did not report through
  ``published()`` before publishing it. The error then lists the other nodes publishing /tf.
Once one is seen the output stops for good (until destroyed), logs one ERROR naming the frame,
the other parent and the other node, and ``conflict`` keeps it for diagnostics.

Limits: a publisher that starts after the node and publishes the same child is caught when its
first transform arrives, so the node may have published a few transforms before that. Two nodes
of the same fully qualified name are indistinguishable in the graph; without a publisher gid, a
second node publishing exactly our transform (same stamp and parent) is not caught.

How the node calls it:
    tf_output, why = make_tf_output(node, cfg)          # configure; None (and why) when off
    tf_output.publish(image.header.stamp, map_base, map_camera, odom_base)   # worker, per pose
    tf_output.conflict                                   # diagnostics: TfConflict or None
    tf_output.destroy()                                  # cleanup: publisher and subscriptions gone
"""
from __future__ import annotations

import collections
import dataclasses
import struct
import threading

import numpy as np
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from lingbot_ros.mapping.placement.geometry import rigid_inverse
from lingbot_ros.ros.input_checks import Refused, deserialized
from lingbot_ros.ros.messages import (TF_STATIC_TOPIC, TF_TOPIC, TfUnavailable, stamp_ns, tf_message_type,
                                      transform_stamped)
from lingbot_ros.ros.params import TF_MODES
from lingbot_ros.ros.qos import TF_QOS, TF_STATIC_QOS
from lingbot_ros.ros.safety import net_of
from lingbot_ros.ros.tap import Tap

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
# Missing odometry is logged at most this often (it can be missing for every frame).
_SKIP_LOG_PERIOD_S = 5.0


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
    ``on_refused(text)``: a /tf message naming our child frame whose bytes are not a TFMessage
    (a truncated payload) is refused and told there (the node counts it as rejected TF).
    Raises TfUnavailable when tf2_msgs is not importable.
    """

    def __init__(self, node, child_frames, on_refused=None):
        self.child_frames = frozenset(child_frames)
        self.conflict: TfConflict | None = None
        self._node = node
        self._on_refused = on_refused
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
        self._tap = Tap(node, tf_message, TF_TOPIC, _WATCH_QOS, self._on_tf_raw, DRAIN_PERIOD_S, group,
                        "TF conflict watch (/tf)", raw=True)
        self._subscriptions = [
            node.create_subscription(tf_message, TF_STATIC_TOPIC,
                                     net_of(node).guard("TF conflict watch (/tf_static)", self._on_tf_static),
                                     TF_STATIC_QOS, callback_group=group),
        ]

    def published(self, child: str, parent: str, stamp_ns: int) -> None:
        with self._lock:
            self._own.append((child, stamp_ns, parent))

    def _on_tf_raw(self, data: bytes, info) -> None:
        if self.conflict is not None or not any(needle in data for needle in self._needles):
            return
        try:
            msg = deserialized(data, self._type, TF_TOPIC)
        except Refused as error:
            self._node.get_logger().warning(str(error), throttle_duration_sec=5.0)
            if self._on_refused is not None:
                self._on_refused(str(error))
            return
        self._on_tf(msg, info)

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


class TfOutput:
    """Publishes the ``mode``'s transform for each pose (see the module docstring).

    Raises ValueError for an unknown mode or a child frame equal to map_frame, TfUnavailable when
    tf2_msgs is not importable (not for mode none, which creates nothing).
    """

    def __init__(self, node, mode: str, map_frame: str, odom_frame: str, base_frame: str,
                 camera_frame_name: str, on_refused=None):
        if mode not in TF_MODES:
            raise ValueError(f"tf_mode {mode!r}: use one of {', '.join(TF_MODES)}")
        self.mode = mode
        self.parent = map_frame
        self.base_frame = base_frame
        self.child = {"none": "", "map_to_odom": odom_frame, "map_to_base": base_frame,
                      "map_to_camera": camera_frame_name}[mode]
        if self.child == map_frame:
            raise ValueError(f"tf_mode {mode} would publish {map_frame} -> {map_frame}: its child frame "
                             f"must differ from map_frame")
        self._node = node
        self._publisher = self._watch = None
        self.published = self.skipped = 0
        self._last_went_out: bool | None = None   # the newest pose's transform: out, skipped, none yet
        self._last_pose: np.ndarray | None = None   # the newest transform that went out, for republish
        self._waiting = ""                          # why the newest pose's transform was held back
        if mode == "none":
            return
        self._type = tf_message_type()
        self._watch = TfConflictWatch(node, [self.child], on_refused)
        self._publisher = node.create_publisher(self._type, TF_TOPIC, TF_QOS)

    @property
    def conflict(self) -> TfConflict | None:
        """The other publisher of our child frame that stopped this output, or None."""
        return None if self._watch is None else self._watch.conflict

    @property
    def skipping(self) -> bool:
        """The newest pose's transform did not go out (no odometry at its stamp)."""
        return self._last_went_out is False

    def describe(self) -> str:
        """One line for diagnostics: what is published, or why nothing is."""
        if self.mode == "none":
            return "TF off (tf_mode none)"
        if self.conflict is not None:
            return "TF refused: " + self.conflict.message
        edge = f"{self.parent} -> {self.child} ({self.mode})"
        if self._last_went_out is None:
            return f"{edge}: nothing published yet (no pose yet)"
        if not self._last_went_out:
            return (f"{edge} NOT published: {self._waiting} ({self.skipped} pose(s) skipped, "
                    f"{self.published} published)")
        return f"publishing {edge}"

    def hold(self, why: str) -> None:
        """The newest pose's transform is held back (e.g. the metric scale is not known yet)."""
        self.skipped += 1
        self._last_went_out, self._waiting = False, why

    def republish(self, stamp) -> bool:
        """The newest map -> odom again at ``stamp`` (post-dated by the caller, as slam_toolbox and
        AMCL do, so that a lookup at "now" finds it between frames). Only map_to_odom: the other
        modes' transforms are poses of a moving frame at their image's instant."""
        if self.mode != "map_to_odom" or self._last_pose is None or self.conflict is not None:
            return False
        self._send(self._last_pose, stamp)
        return True

    def _send(self, pose: np.ndarray, stamp) -> None:
        self._watch.published(self.child, self.parent, stamp_ns(stamp))   # first: the echo may come back fast
        self._publisher.publish(self._type(transforms=[transform_stamped(pose, stamp, self.parent, self.child)]))

    def publish(self, stamp, map_base: np.ndarray, map_camera: np.ndarray,
                odom_base: np.ndarray | None = None) -> bool:
        """Publish this mode's transform at ``stamp`` (the image's builtin_interfaces/Time).

        map_base = T_map_base [4, 4], map_camera = T_map_camera [4, 4], odom_base = T_odom_base
        [4, 4] at the same stamp (needed by map_to_odom only; None = not known at that stamp, the
        frame is skipped with a throttled warning). Returns whether a transform went out: False
        for mode none, a missing odom_base or a detected conflict.
        """
        if self._publisher is None or self.conflict is not None:
            return False
        if self.mode == "map_to_odom":
            if odom_base is None:
                self.hold(f"no {self.child} -> {self.base_frame} odometry at the newest image's stamp")
                self._node.get_logger().warning(
                    f"no {self.child} -> {self.base_frame} pose at this image's stamp: {self.parent} -> {self.child} "
                    f"not published for it", throttle_duration_sec=_SKIP_LOG_PERIOD_S)
                return False
            pose = map_base @ rigid_inverse(odom_base)
        elif self.mode == "map_to_base":
            pose = map_base
        else:
            pose = map_camera
        self._send(pose, stamp)
        self.published += 1
        self._last_went_out, self._last_pose = True, pose
        return True

    def destroy(self) -> None:
        """Remove the publisher and the watch's subscriptions from the node. Idempotent."""
        if self._publisher is not None:
            self._node.destroy_publisher(self._publisher)
            self._watch.destroy()
        self._publisher = None


def make_tf_output(node, cfg, on_refused=None) -> tuple[TfOutput | None, str]:
    """The TF output for ``cfg.tf_mode`` (frames from cfg: map_frame, odom_frame, base_frame,
    tf_camera_frame), or (None, why not) for tf_mode none or an install without tf2_msgs;
    ``on_refused``: TfConflictWatch's."""
    if cfg.tf_mode == "none":
        return None, "tf_mode is none"
    try:
        output = TfOutput(node, cfg.tf_mode, cfg.map_frame, cfg.odom_frame, cfg.base_frame, cfg.tf_camera_frame,
                          on_refused)
    except TfUnavailable as error:
        return None, f"TF output off: {error}; poses are still on ~/pose and ~/odom"
    return output, output.describe()
