"""Transform lookups for the node: the camera mount (static) and the robot's odometry (at a stamp).

``TfLookup(node)`` picks its backend once, at construction:
- ``tf2_ros`` where tf2_ros imports (a ROS distro): a tf2_ros Buffer and TransformListener on
  /tf and /tf_static. ``lookup`` and ``lookup_at`` both work (``dynamic`` is True).
- ``tf_static`` otherwise (the venv install): a StaticTfListener, static transforms only.
  ``lookup_at`` returns None (``dynamic`` is False): the robot's odometry must then come from a topic.

Frames follow tf2: ``lookup(target_frame, source_frame)`` is T_target_source, the pose of
``source_frame`` in ``target_frame``. Every lookup returns a [4, 4] float64 array, or None with
the reason in ``last_failure``. Lookups come from one thread (the node's worker).

The StaticTfListener (for the venv install's camera mount T_base_camera, e.g. ``base_link ->
camera_link -> camera_optical_frame`` as robot_state_publisher or a static_transform_publisher
sends it) subscribes to /tf_static with the QoS of tf2's static broadcaster (reliable, transient
local, keep-last 100), so the transforms published before the node started arrive too, keeps the
newest transform of each child frame and chains them through their nearest common ancestor
(StaticTree). What it does not do (tf2_ros does):
- no dynamic transforms: /tf is not read, so a chain through a moving joint (a pan-tilt head, a
  robot arm) is not found;
- no time: a lookup answers with the newest static transforms, there is no history, no
  interpolation between stamps and no extrapolation.

How the node calls it:
    tf_lookup = TfLookup(node)                                           # configure
    base_camera = tf_lookup.lookup(cfg.base_frame, image.header.frame_id)   # T_base_camera
    odom_base = tf_lookup.lookup_at(cfg.odom_frame, cfg.base_frame,     # T_odom_base(stamp)
                                    image.header.stamp, timeout_s=0.05)
    if odom_base is None: log tf_lookup.last_failure
    tf_lookup.destroy()                                                  # cleanup: subscriptions gone
"""
from __future__ import annotations

import threading

import numpy as np
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup

from lingbot_ros.mapping.placement.geometry import rigid_inverse
from lingbot_ros.ros.input_checks import Refused, checked_transform
from lingbot_ros.ros.messages import TF_STATIC_TOPIC, TfUnavailable, tf_message_type
from lingbot_ros.ros.qos import TF_STATIC_QOS
from lingbot_ros.ros.safety import net_of

# Frames named in a failed lookup's explanation, at most (a URDF can have hundreds).
_FRAMES_NAMED = 12
BACKENDS = ("auto", "tf2_ros", "tf_static")


class StaticTree:
    """Transforms by child frame (the newest one of a child wins), chained between any two frames
    of one tree. Not thread-safe: StaticTfListener guards it."""

    def __init__(self):
        self._edges: dict[str, tuple[str, np.ndarray]] = {}   # child -> (parent, T_parent_child)

    def set(self, parent: str, child: str, parent_child: np.ndarray) -> None:
        self._edges[child] = (parent, np.array(parent_child, dtype=np.float64))

    def frames(self) -> list[str]:
        """Every frame that appears in a transform, sorted."""
        return sorted(set(self._edges) | {parent for parent, _ in self._edges.values()})

    def lookup(self, target_frame: str, source_frame: str) -> np.ndarray | None:
        """T_target_source [4, 4] (the pose of ``source_frame`` in ``target_frame``), or None
        when the two frames are not connected. Equal frames give the identity, as in tf2."""
        if target_frame == source_frame:
            return np.eye(4)
        source_up = self._ancestors(source_frame)
        target_up = self._ancestors(target_frame)
        for frame, frame_source in source_up.items():   # nearest ancestor first
            if frame in target_up:
                return rigid_inverse(target_up[frame]) @ frame_source
        return None

    def _ancestors(self, frame: str) -> dict[str, np.ndarray]:
        """``frame`` and each frame above it, in order upwards, with T_ancestor_frame."""
        chain = {frame: np.eye(4)}
        pose = chain[frame]
        while frame in self._edges:
            parent, parent_child = self._edges[frame]
            if parent in chain:   # a loop in the published data: the walk stops at the repeat
                break
            pose = parent_child @ pose
            chain[parent] = pose
            frame = parent
        return chain

    def explain(self, target_frame: str, source_frame: str) -> str:
        """Why ``lookup(target_frame, source_frame)`` finds nothing, naming the known frames."""
        known = self.frames()
        missing = [f"'{frame}'" for frame in (target_frame, source_frame) if frame not in known]
        named = ", ".join(known[:_FRAMES_NAMED]) + (f" and {len(known) - _FRAMES_NAMED} more"
                                                    if len(known) > _FRAMES_NAMED else "")
        what = (f"{' and '.join(missing)} not on /tf_static" if missing
                else "the two frames are in separate static trees")
        return (f"no static transform chain {target_frame} -> {source_frame}: {what} (frames on "
                f"/tf_static: {named or 'none yet'}; without tf2_ros, transforms on /tf are not read)")


class StaticTfListener:
    """The newest static transforms from /tf_static, chained (see the module docstring).

    ``StaticTfListener(node, on_refused)`` subscribes at once; the node's executor delivers the
    messages. A transform refused at the input boundary (input_checks) is not stored and goes to
    ``on_refused(text)``; an earlier good one of the same child frame stays.
    ``lookup(target_frame, source_frame)`` may be called from any thread; ``destroy()`` removes
    the subscription from the node. Raises TfUnavailable when tf2_msgs is not importable.
    """

    def __init__(self, node, on_refused=None):
        self._node = node
        self._on_refused = on_refused
        self._tree = StaticTree()
        self._lock = threading.Lock()
        self._subscription = node.create_subscription(
            tf_message_type(), TF_STATIC_TOPIC, net_of(node).guard("/tf_static listener", self._on_message),
            TF_STATIC_QOS,
            callback_group=MutuallyExclusiveCallbackGroup())

    def _on_message(self, msg) -> None:
        for transform in msg.transforms:
            parent, child = transform.header.frame_id, transform.child_frame_id
            try:
                if not parent or not child or parent == child:
                    raise Refused(f"frames '{parent}' -> '{child}'")
                parent_child = checked_transform(transform.transform.translation, transform.transform.rotation,
                                                 f"/tf_static {parent} -> {child}")
            except Refused as error:
                text = f"/tf_static transform ignored: {error}"
                self._node.get_logger().warning(text, throttle_duration_sec=10.0)
                if self._on_refused is not None:
                    self._on_refused(text)
                continue
            with self._lock:
                self._tree.set(parent, child, parent_child)

    def lookup(self, target_frame: str, source_frame: str) -> np.ndarray | None:
        """T_target_source [4, 4] from the newest static transforms, or None if not connected."""
        with self._lock:
            return self._tree.lookup(target_frame, source_frame)

    def explain(self, target_frame: str, source_frame: str) -> str:
        with self._lock:
            return self._tree.explain(target_frame, source_frame)

    def destroy(self) -> None:
        self._node.destroy_subscription(self._subscription)




def _import_tf2_ros():
    try:
        import tf2_ros
    except ImportError:
        return None
    return tf2_ros


class TfLookup:
    """Static and stamped transform lookups through tf2_ros, or the /tf_static listener without it.

    ``backend``: ``auto`` (tf2_ros when it imports), ``tf2_ros`` (raise TfUnavailable without it)
    or ``tf_static`` (the venv listener even where tf2_ros exists). Raises TfUnavailable when
    tf2_msgs is missing too. The subscriptions live on ``node`` and its executor serves them.
    """

    def __init__(self, node, backend: str = "auto", on_refused=None):
        if backend not in BACKENDS:
            raise ValueError(f"TfLookup backend {backend!r}: use one of {', '.join(BACKENDS)}")
        tf2_ros = _import_tf2_ros() if backend != "tf_static" else None
        if backend == "tf2_ros" and tf2_ros is None:
            raise TfUnavailable("TfLookup backend tf2_ros: tf2_ros is not importable (source a ROS distro "
                                "that has it, or use backend tf_static)")
        self.last_failure = ""
        self.last_refused = False   # the last lookup found a transform and refused it (input_checks)
        self._on_refused = on_refused
        self._tf2_ros = tf2_ros
        if tf2_ros is not None:
            self.backend, self.dynamic = "tf2_ros", True
            # No node for the Buffer: with one it would add a tf2_frames service to the node.
            self._buffer = tf2_ros.Buffer()
            self._listener = tf2_ros.TransformListener(self._buffer, node)
        else:
            self.backend, self.dynamic = "tf_static", False
            self._static = StaticTfListener(node, on_refused)

    def lookup(self, target_frame: str, source_frame: str) -> np.ndarray | None:
        """T_target_source [4, 4] from the newest transforms (a mount: base_frame -> camera frame)."""
        if self._tf2_ros is None:
            pose = self._static.lookup(target_frame, source_frame)
            if pose is None:
                self.last_failure = self._static.explain(target_frame, source_frame)
            return pose
        from rclpy.time import Time

        return self._tf2_lookup(target_frame, source_frame, Time(), 0.0)

    def lookup_at(self, target_frame: str, source_frame: str, stamp, timeout_s: float = 0.0) -> np.ndarray | None:
        """T_target_source [4, 4] at ``stamp`` (builtin_interfaces/Time), e.g. odom -> base_frame at
        an image's stamp, interpolated by tf2. Waits up to ``timeout_s`` for transforms that have
        not arrived yet. Always None with the ``tf_static`` backend."""
        if self._tf2_ros is None:
            self.last_failure = (f"{target_frame} -> {source_frame} at a stamp needs tf2_ros, which is not "
                                 "installed (the /tf_static listener has static transforms only): feed "
                                 "the robot's odometry from a topic")
            return None
        from rclpy.time import Time

        return self._tf2_lookup(target_frame, source_frame, Time.from_msg(stamp), timeout_s)

    def _tf2_lookup(self, target_frame: str, source_frame: str, time, timeout_s: float) -> np.ndarray | None:
        from rclpy.duration import Duration

        self.last_refused = False
        try:
            transform = self._buffer.lookup_transform(target_frame, source_frame, time,
                                                      timeout=Duration(seconds=timeout_s))
        except self._tf2_ros.TransformException as error:   # lookup, connectivity, extrapolation
            self.last_failure = f"no {target_frame} -> {source_frame} transform: {error}"
            return None
        try:   # tf2 stores what it is sent: the input boundary applies to its answers too
            return checked_transform(transform.transform.translation, transform.transform.rotation,
                                     f"TF {target_frame} -> {source_frame}")
        except Refused as error:
            self.last_failure, self.last_refused = str(error), True
            if self._on_refused is not None:
                self._on_refused(str(error))
            return None

    def destroy(self) -> None:
        """Remove the subscriptions from the node (the tf2 listener's /tf and /tf_static too)."""
        if self._tf2_ros is not None:
            self._listener.unregister()
        else:
            self._static.destroy()
