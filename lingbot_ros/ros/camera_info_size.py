"""The images' size before the first frame, from the camera_info beside the image topic: what
configure warms up on with ``warmup_image_size: auto`` (the rule: mapping/warmup_size.py).

A camera driver publishes a camera_info with every image; configure waits for one at most
``warmup_camera_info_wait_s`` and checks it at the boundary (ros/input_checks.py). Nothing in
time, or a refused one: the rule falls back to its default and the node says why.
"""
from __future__ import annotations

import time

import rclpy
from rclpy.wait_for_message import wait_for_message
from sensor_msgs.msg import CameraInfo

from lingbot_ros.mapping.warmup_size import FoundSize
from lingbot_ros.ros import topics
from lingbot_ros.ros.input_checks import Refused, camera_info_image_size
from lingbot_ros.ros.qos import input_qos


def found_image_size(node, cfg) -> FoundSize:
    """Wait up to ``cfg.warmup_camera_info_wait_s`` for a camera_info on the topic beside the
    node's image topic (remaps applied; a rig's: the primary camera's) and read its images' size."""
    primary = cfg.primary_camera or (cfg.cameras[0] if cfg.cameras else None)
    topic = topics.camera_info_topic(node.resolve_topic_name(topics.image_topic(primary)))
    where = f"camera_info on {topic}"
    wait_s = cfg.warmup_camera_info_wait_s
    if not wait_s:
        return FoundSize(where, absent="not waited for (warmup_camera_info_wait_s 0)")
    msg = _next_message(node, topic, input_qos(cfg.camera_info_qos, cfg.camera_info_qos_depth), wait_s)
    if msg is None:
        return FoundSize(where, absent=f"none arrived within {wait_s:g} s")
    try:
        return FoundSize(where, camera_info_image_size(msg))
    except Refused as error:
        return FoundSize(where, refused=str(error))


def _next_message(node, topic: str, qos, wait_s: float):
    """The next CameraInfo on ``topic`` within ``wait_s``, or None. wait_for_message takes it from
    a subscription of its own; where an executor spins the node meanwhile (the demo's thread)
    it may take the message first, and the wait starts again for the time left."""
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0 and rclpy.ok(context=node.context):
        received, msg = wait_for_message(CameraInfo, node, topic, qos_profile=qos, time_to_wait=left)
        if received:
            return msg
    return None
