"""Optional /tf output: map -> tf_camera_frame, or map -> odom (needs tf2_ros for odom -> camera).

tf2_msgs is not on PyPI, so TF is only available where ROS is installed normally (or tf2_msgs
was generated locally). ``make_tf_output`` returns None, with the reason, when it is not.
The node never publishes a transform it does not own: map_to_camera publishes to its own child
frame (tf_camera_frame, not the camera driver's frame), map_to_odom only the map -> odom edge.
"""
from __future__ import annotations

import numpy as np
from geometry_msgs.msg import TransformStamped

from lingbot_ros.mapping import quaternion_to_rotation, rotation_to_quaternion


def _transform(pose: np.ndarray, stamp, parent: str, child: str) -> TransformStamped:
    msg = TransformStamped()
    msg.header.stamp, msg.header.frame_id, msg.child_frame_id = stamp, parent, child
    msg.transform.translation.x, msg.transform.translation.y, msg.transform.translation.z = (
        float(v) for v in pose[:3, 3])
    (msg.transform.rotation.x, msg.transform.rotation.y, msg.transform.rotation.z,
     msg.transform.rotation.w) = (float(v) for v in rotation_to_quaternion(pose[:3, :3]))
    return msg


def _matrix(transform) -> np.ndarray:
    t, q = transform.translation, transform.rotation
    pose = np.eye(4)
    pose[:3, :3] = quaternion_to_rotation(np.array([q.x, q.y, q.z, q.w]))
    pose[:3, 3] = [t.x, t.y, t.z]
    return pose


class TfOutput:
    def __init__(self, node, cfg, tf_message_type, buffer=None, listener=None):
        self.cfg = cfg
        self._type = tf_message_type
        self._pub = node.create_publisher(tf_message_type, "/tf", 100)
        self._buffer, self._listener = buffer, listener
        self._node = node

    def publish(self, pose_map: np.ndarray, stamp, camera_frame: str) -> None:
        if self.cfg.tf_mode == "map_to_camera":
            transform = _transform(pose_map, stamp, self.cfg.map_frame, self.cfg.tf_camera_frame)
        else:
            from rclpy.time import Time

            try:
                odom_camera = self._buffer.lookup_transform(self.cfg.odom_frame, camera_frame,
                                                            Time.from_msg(stamp))
            except Exception as error:   # tf2 raises several lookup exception types
                self._node.get_logger().warning(
                    f"no {self.cfg.odom_frame} -> {camera_frame} transform at this stamp, "
                    f"map -> odom not published: {error}", throttle_duration_sec=5.0)
                return
            map_odom = pose_map @ np.linalg.inv(_matrix(odom_camera.transform))
            transform = _transform(map_odom, stamp, self.cfg.map_frame, self.cfg.odom_frame)
        self._pub.publish(self._type(transforms=[transform]))

    def destroy(self) -> None:
        self._node.destroy_publisher(self._pub)


def make_tf_output(node, cfg) -> tuple[TfOutput | None, str]:
    """The TF output for ``cfg.tf_mode``, or (None, why not)."""
    if cfg.tf_mode == "none":
        return None, "tf_mode is none"
    try:
        from tf2_msgs.msg import TFMessage
    except ImportError:
        return None, ("tf2_msgs is not installed (it is not on PyPI): TF output disabled; poses "
                      "are still on ~/pose and ~/odom")
    if cfg.tf_mode == "map_to_camera":
        return TfOutput(node, cfg, TFMessage), "map -> " + cfg.tf_camera_frame
    try:
        import tf2_ros
    except ImportError:
        return None, "tf_mode map_to_odom needs tf2_ros to look up odom -> camera: TF disabled"
    buffer = tf2_ros.Buffer()
    listener = tf2_ros.TransformListener(buffer, node)
    return TfOutput(node, cfg, TFMessage, buffer, listener), f"map -> {cfg.odom_frame}"
