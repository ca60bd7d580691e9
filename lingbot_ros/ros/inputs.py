"""The node's subscriptions: images (raw or compressed) and camera_info, decoded in the callback.

Callbacks only decode and hand frames to the worker's inbox; bad input is counted and logged
(throttled), never raised.
"""
from __future__ import annotations

import functools
import time

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.event_handler import SubscriptionEventCallbacks
from sensor_msgs.msg import CameraInfo, CompressedImage, Image

from lingbot_ros.io.image_codec import ImageDecodeError, compressed_to_rgb, image_to_rgb
from lingbot_ros.mapping.records import InputFrame
from lingbot_ros.mapping.stamps import ReceivedGaps
from lingbot_ros.ros import topics
from lingbot_ros.ros.input_checks import Refused, check_camera_info, nonzero_stamp
from lingbot_ros.ros.qos import KEEP_ALL_RELIABLE, input_qos

# Bad input is logged at most this often (the counters in ~/status see every frame).
BAD_INPUT_LOG_PERIOD_S = 5.0


class Inputs:
    def __init__(self, node, cfg, counters, deliver, group, camera: str | None = None):
        """Subscribe now (activate); ``destroy`` undoes it (deactivate). ``deliver(frame)`` hands a
        decoded frame on and returns how many frames that dropped; ``camera``: a rig's camera (its
        ~/<camera>/image and the topics derived from it), None: the one camera."""
        self.node, self.cfg, self.counters, self.deliver = node, cfg, counters, deliver
        self._whose = f"camera {camera}: " if camera else ""   # a rig camera's refusals name it
        self.camera_info_k = ""
        self._gaps = ReceivedGaps()
        names = topics.input_topics(node, cfg.image_transport, cfg.use_camera_info, camera)
        self.image_topic = names.image
        qos = KEEP_ALL_RELIABLE if cfg.process_all_frames else input_qos(
            "sensor_data" if cfg.image_qos == "auto" else cfg.image_qos, cfg.image_qos_depth)
        compressed = cfg.image_transport == "compressed"
        decode = (functools.partial(compressed_to_rgb, strict_jpeg=cfg.strict_jpeg) if compressed
                  else image_to_rgb)
        def events(index, hint=""):   # a publisher whose QoS cannot match delivers nothing: say so, naming it
            return SubscriptionEventCallbacks(incompatible_qos=node.safety.guard(
                "incompatible QoS event", lambda event: node.qos_mismatch(
                    self._subscriptions[index].topic_name, event, hint)))   # the name with remaps applied

        hint = (" (process_all_frames subscribes reliable, to make the publisher wait instead of losing "
                "frames: a best-effort camera needs process_all_frames false)" if cfg.process_all_frames else "")

        self._subscriptions = [node.create_subscription(
            CompressedImage if compressed else Image, names.image,
            node.safety.guard("image callback", lambda msg: self.accept(msg, decode)), qos,
            callback_group=group, event_callbacks=events(0, hint))]
        if names.camera_info:
            self._subscriptions.append(node.create_subscription(
                CameraInfo, names.camera_info, node.safety.guard("camera_info callback", self._on_camera_info),
                input_qos(cfg.camera_info_qos, cfg.camera_info_qos_depth),
                callback_group=MutuallyExclusiveCallbackGroup(), event_callbacks=events(1)))

    def destroy(self) -> None:
        for subscription in self._subscriptions:
            self.node.destroy_subscription(subscription)
        self._subscriptions = []

    def accept(self, msg, decode) -> None:
        """Image callback: decode and hand over; blocks only while a full keep-all queue waits."""
        received_ns = time.monotonic_ns()
        self.counters.add("received")
        try:
            stamp_ns = nonzero_stamp(msg.header.stamp, "image")
            rgb = decode(msg, self.cfg.max_image_pixels)
        except (Refused, ImageDecodeError) as error:
            self._bad_input("rejected", f"image skipped: {error}")
            return
        # Not the image clock: the worker sets it from the frames the Mapper takes (a stamp an
        # hour ahead is held there, and refused unless the next frame follows it).
        frame = InputFrame(rgb=rgb, stamp_ns=stamp_ns, frame_id=msg.header.frame_id, received_ns=received_ns,
                           gap_ns=self._gaps.gap_ns(stamp_ns))
        self.counters.add("dropped", self.deliver(frame))

    def _on_camera_info(self, msg) -> None:
        try:
            self.camera_info_k = check_camera_info(msg)
        except Refused as error:
            self._bad_input("camera_info_rejected", f"{self._subscriptions[1].topic_name}: {error} (skipped)")

    def _bad_input(self, counter: str, text: str) -> None:
        text = self._whose + text
        self.counters.refused(counter, text)
        self.node.get_logger().warning(text, throttle_duration_sec=BAD_INPUT_LOG_PERIOD_S)
