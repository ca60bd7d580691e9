"""Transform lookups for the node: the camera mount (static) and the robot's odometry (at a stamp).

``TfLookup(node)`` picks its backend once, at construction:
- ``tf2_ros`` where tf2_ros imports (a ROS distro): a tf2_ros Buffer and TransformListener on
  /tf and /tf_static. ``lookup`` and ``lookup_at`` both work (``dynamic`` is True).
- ``tf_static`` otherwise (the venv install): StaticTfListener (ros/tf_static.py), static
  transforms only, see its docstring for what it does not do. ``lookup_at`` returns None (``dynamic``
  is False): the robot's odometry must then come from a topic.

Frames follow tf2: ``lookup(target_frame, source_frame)`` is T_target_source, the pose of
``source_frame`` in ``target_frame``. Every lookup returns a [4, 4] float64 array, or None with
the reason in ``last_failure``. Lookups come from one thread (the node's worker).

How the node calls it:
    tf_lookup = TfLookup(node)                                           # configure
    base_camera = tf_lookup.lookup(cfg.base_frame, image.header.frame_id)   # T_base_camera
    odom_base = tf_lookup.lookup_at(cfg.odom_frame, cfg.base_frame,     # T_odom_base(stamp)
                                    image.header.stamp, timeout_s=0.05)
    if odom_base is None: log tf_lookup.last_failure
    tf_lookup.destroy()                                                  # cleanup: subscriptions gone
"""
from __future__ import annotations

import numpy as np

from lingbot_ros.ros.input_checks import Refused, checked_transform
from lingbot_ros.ros.tf_messages import TfUnavailable
from lingbot_ros.ros.tf_static import StaticTfListener

BACKENDS = ("auto", "tf2_ros", "tf_static")


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
            self.last_failure = str(error)
            if self._on_refused is not None:
                self._on_refused(str(error))
            return None

    def destroy(self) -> None:
        """Remove the subscriptions from the node (the tf2 listener's /tf and /tf_static too)."""
        if self._tf2_ros is not None:
            self._listener.unregister()
        else:
            self._static.destroy()
