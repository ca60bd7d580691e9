"""How the node meets the robot: the camera mount from TF, the robot's odometry, the TF output.

    mount      base_frame -> the image's frame_id, looked up in TF (tf2_ros, or the /tf_static
               listener in a venv) when the first image arrives; else the camera_mount setting
    odometry   T_odom_base from ~/odometry_in (nav_msgs/Odometry, remappable) or, with
               odometry_source tf (tf2_ros only), from TF at each image stamp; fed to the
               Mapper's buffer (metric scale) and to the map -> odom transform
    TF         one edge per pose (ros/tf.py)
"""
from __future__ import annotations

import numpy as np
from nav_msgs.msg import Odometry

from lingbot_ros.mapping.trajectory import quaternion_to_rotation
from lingbot_ros.ros.tf import make_tf_output
from lingbot_ros.ros.tf_lookup import TfLookup
from lingbot_ros.ros.tf_messages import TfUnavailable, stamp_ns


def odometry_pose(msg) -> np.ndarray:
    """nav_msgs/Odometry -> T_odom_base (its pose, child_frame_id in header.frame_id)."""
    p, q = msg.pose.pose.position, msg.pose.pose.orientation
    pose = np.eye(4)
    pose[:3, :3] = quaternion_to_rotation(np.array([q.x, q.y, q.z, q.w]))
    pose[:3, 3] = (p.x, p.y, p.z)
    return pose


class RobotLink:
    def __init__(self, node, cfg, mapper, group):
        self.node, self.cfg, self.mapper = node, cfg, mapper
        self.mount_resolved = False
        try:
            self.lookup = TfLookup(node)
        except TfUnavailable as error:   # no tf2_msgs: the camera_mount setting is the mount
            self.lookup, self.lookup_failure = None, str(error)
        self.tf, why = make_tf_output(node, cfg)
        if self.tf is None and cfg.tf_mode != "none":
            node.get_logger().warning(why)
        needs_odometry = mapper.settings.scale_source == "odometry" or cfg.tf_mode == "map_to_odom"
        self.from_tf = needs_odometry and cfg.odometry_source == "tf"
        if self.from_tf and (self.lookup is None or not self.lookup.dynamic):
            node.get_logger().warning("odometry_source tf needs tf2_ros (a ROS distro): no odometry; use "
                                      "odometry_source topic and remap ~/odometry_in")
        self._subscription = (node.create_subscription(Odometry, "~/odometry_in", self._on_odometry, 50,
                                                       callback_group=group)
                              if needs_odometry and not self.from_tf else None)

    def _on_odometry(self, msg) -> None:
        self.mapper.add_odometry(stamp_ns(msg.header.stamp), odometry_pose(msg))

    def before_frame(self, frame) -> None:
        """On the worker, before the Mapper sees ``frame``: the mount (first frame only) and, from
        TF, the robot's odometry at the frame's stamp."""
        if not self.mount_resolved:
            self.mount_resolved = True
            self._resolve_mount(frame.frame_id)
        if self.from_tf and self.lookup is not None and self.lookup.dynamic:
            pose = self.lookup.lookup_at(self.cfg.odom_frame, self.cfg.base_frame, frame.source, timeout_s=0.05)
            if pose is not None:
                self.mapper.add_odometry(frame.stamp_ns, pose)

    def _resolve_mount(self, frame_id: str) -> None:
        logger, base = self.node.get_logger(), self.cfg.base_frame
        pose = self.lookup.lookup(base, frame_id) if self.lookup is not None and frame_id else None
        if pose is not None:
            self.mapper.set_camera_mount(pose, f"TF {base} -> {frame_id}")
            logger.info(f"camera mount from TF: {base} -> {frame_id}")
            return
        why = (self.lookup.last_failure if self.lookup is not None else self.lookup_failure) or "no frame_id"
        logger.info(f"camera mount from the camera_mount parameter ({self.mapper.settings.camera_mount}): "
                    f"no TF {base} -> {frame_id or '(image without frame_id)'} ({why})")

    def publish(self, output) -> None:
        if self.tf is not None:
            self.tf.publish(output.frame.source, output.base_pose, output.camera_pose,
                            self.mapper.odometry_at(output.stamp_ns))

    def describe(self) -> dict:
        """Diagnostics entries (the TF conflict, if any, comes first)."""
        out = {"camera_mount": self.mapper.snapshot.camera_mount}
        if self.tf is not None:
            out["tf"] = self.tf.describe()
        return out

    @property
    def conflict(self):
        return self.tf.conflict if self.tf is not None else None

    def destroy(self) -> None:
        if self._subscription is not None:
            self.node.destroy_subscription(self._subscription)
        if self.tf is not None:
            self.tf.destroy()
        if self.lookup is not None:
            self.lookup.destroy()
        self._subscription = self.tf = self.lookup = None
