"""The node's TF output: one transform per pose on /tf, fitted into a robot's tree (REP 105).

Modes (``tf_mode``), each publishing one edge, parent -> child:
  none            nothing
  map_to_odom     map_frame -> odom_frame = T_map_base(t) @ inverse(T_odom_base(t)), with the
                  robot's own odometry T_odom_base at the image stamp t (REP 105: the robot keeps
                  publishing odom -> base_frame, we correct its drift)
  map_to_base     map_frame -> base_frame = T_map_base (a robot without other odometry)
  map_to_camera   map_frame -> camera_frame_name = T_map_camera, a frame of the node's own
                  (not the camera driver's frame, which already has a parent)

The node never steals a link: a TfConflictWatch (ros/tf_conflicts.py) listens for other
publishers of the child frame; once one is seen the output stops for good (until destroyed),
logs one ERROR naming the frame, the other parent and the other node, and ``conflict`` keeps it
for diagnostics. Messages go out as tf2_msgs/TFMessage on /tf with tf2's broadcaster QoS.

How the node calls it:
    tf_output, why = make_tf_output(node, cfg)          # configure; None (and why) when off
    tf_output.publish(image.header.stamp, map_base, map_camera, odom_base)   # worker, per pose
    tf_output.conflict                                   # diagnostics: TfConflict or None
    tf_output.destroy()                                  # cleanup: publisher and subscriptions gone
"""
from __future__ import annotations

import numpy as np

from lingbot_ros.mapping.frames import rigid_inverse
from lingbot_ros.ros.tf_conflicts import TfConflict, TfConflictWatch
from lingbot_ros.ros.messages import stamp_ns
from lingbot_ros.ros.tf_messages import (TF_QOS, TF_TOPIC, TfUnavailable, tf_message_type,
                                         transform_stamped)

TF_MODES = ("none", "map_to_odom", "map_to_base", "map_to_camera")
# Missing odometry is logged at most this often (it can be missing for every frame).
_SKIP_LOG_PERIOD_S = 5.0


class TfOutput:
    """Publishes the ``mode``'s transform for each pose (see the module docstring).

    Raises ValueError for an unknown mode or a child frame equal to map_frame, TfUnavailable when
    tf2_msgs is not importable (not for mode none, which creates nothing).
    """

    def __init__(self, node, mode: str, map_frame: str, odom_frame: str, base_frame: str,
                 camera_frame_name: str):
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
        self._watch = TfConflictWatch(node, [self.child])
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


def make_tf_output(node, cfg) -> tuple[TfOutput | None, str]:
    """The TF output for ``cfg.tf_mode`` (frames from cfg: map_frame, odom_frame, base_frame,
    tf_camera_frame), or (None, why not) for tf_mode none or an install without tf2_msgs."""
    if cfg.tf_mode == "none":
        return None, "tf_mode is none"
    try:
        output = TfOutput(node, cfg.tf_mode, cfg.map_frame, cfg.odom_frame, cfg.base_frame, cfg.tf_camera_frame)
    except TfUnavailable as error:
        return None, f"TF output off: {error}; poses are still on ~/pose and ~/odom"
    return output, output.describe()
