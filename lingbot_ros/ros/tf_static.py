"""The static TF tree without tf2_ros: a /tf_static listener that chains a robot's URDF frames.

For the venv install (PyPI wheels, no tf2_ros), where the node still needs its camera mount
T_base_camera: ``base_link -> camera_link -> camera_optical_frame`` as robot_state_publisher or a
static_transform_publisher sends it. ``StaticTfListener`` subscribes to /tf_static with the QoS of
tf2's static broadcaster (reliable, transient local, keep-last 100), so the transforms published
before the node started arrive too, keeps the newest transform of each child frame and chains
them through their nearest common ancestor.

What it does not do (tf2_ros does, where it is installed; ros/tf_lookup.py picks it then):
- no dynamic transforms: /tf is not read, so a chain through a moving joint (a pan-tilt head, a
  robot arm) is not found;
- no time: a lookup answers with the newest static transforms, there is no history, no
  interpolation between stamps and no extrapolation.
"""
from __future__ import annotations

import threading

import numpy as np
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup

from lingbot_ros.mapping.frames import rigid_inverse
from lingbot_ros.ros.input_checks import Refused, checked_transform
from lingbot_ros.ros.tf_messages import TF_STATIC_QOS, TF_STATIC_TOPIC, tf_message_type

# Frames named in a failed lookup's explanation, at most (a URDF can have hundreds).
_FRAMES_NAMED = 12


class StaticTree:
    """Transforms by child frame (the newest one of a child wins), chained between any two frames
    of one tree. Not thread-safe: StaticTfListener guards it."""

    def __init__(self):
        self._edges: dict[str, tuple[str, np.ndarray]] = {}   # child -> (parent, T_parent_child)

    def set(self, parent: str, child: str, parent_child: np.ndarray) -> None:
        self._edges[child] = (parent, np.array(parent_child, dtype=np.float64))

    def parent_of(self, child: str) -> str | None:
        edge = self._edges.get(child)
        return None if edge is None else edge[0]

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
            tf_message_type(), TF_STATIC_TOPIC, self._on_message, TF_STATIC_QOS,
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
