"""lingbot-ros-replay --wait-for-node: hold the images back while the node falls behind.

The node (map_node) publishes a latched lingbot_ros/MapStatus on NODE/status at every processed
frame and state change. An image is accounted for once it is processed, rejected, failed or
dropped; the player publishes the next image only while fewer than ``max_lead`` of its images
are unaccounted for, so a bag replayed faster than the node runs loses nothing in DDS.
"""
from __future__ import annotations

import threading
import time

from lingbot_ros.ros.status import frames_accounted

IMAGE_TYPES = ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage")


class NodeNotKeepingUpError(RuntimeError):
    """The node sent no status, or never subscribed to the images, within --node-timeout."""


class NodePacing:
    """Counts the node's accounted images from its status and waits for it (thread-safe: the
    status callback runs on the player's executor thread, the waits on the playback thread)."""

    def __init__(self, ros_node, status_type, target: str, max_lead: int, timeout_s: float):
        """``status_type`` is lingbot_ros.msg.MapStatus (passed in: the generated interfaces
        may be missing, which the caller reports)."""
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

        assert max_lead >= 1, "a lead of 0 would wait for an image that was never sent"
        self.target = "/" + target.strip("/")
        self.status_topic = f"{self.target}/status"
        self.max_lead = max_lead
        self.timeout_s = timeout_s
        self.published = 0      # images of the paced topics published so far
        self.waited_s = 0.0     # wall time spent holding images back
        self._accounted = 0     # of them, the ones the node's status accounts for
        self._last_total = None
        self._last_status = None
        self._changed = threading.Condition()
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        ros_node.create_subscription(status_type, self.status_topic, self._on_status, latched)

    def paced_topics(self, ros_node, image_publishers: dict[str, object]) -> set[str]:
        """Wait until the node has a status and subscribes to (and matched) at least one of
        ``image_publishers`` (topic -> publisher); return the topics it reads, which get paced."""
        deadline = time.monotonic() + self.timeout_s
        with self._changed:
            while self._last_total is None:
                if not self._changed.wait(deadline - time.monotonic()):
                    raise NodeNotKeepingUpError(
                        f"no status on {self.status_topic} within {self.timeout_s:g} s: is "
                        f"{self.target} running and active? (--node-timeout)")
        while True:
            topics = {topic for topic, publisher in image_publishers.items()
                      if publisher.get_subscription_count() and self._subscribes(ros_node, topic)}
            if topics:
                return topics
            if time.monotonic() >= deadline:
                raise NodeNotKeepingUpError(
                    f"{self.target} subscribes to none of the image topics "
                    f"{', '.join(sorted(image_publishers))} after {self.timeout_s:g} s "
                    f"(check --remap and the node's image topic)")
            time.sleep(0.05)

    def before_image(self) -> float:
        """Block until one more image keeps the lead within max_lead; returns the seconds waited."""
        return self._wait_for(self.published + 1 - self.max_lead)

    def image_published(self) -> None:
        self.published += 1

    def wait_until_caught_up(self) -> float:
        """Block until the node has accounted for every published image (end of the bag)."""
        return self._wait_for(self.published)

    def _wait_for(self, accounted: int) -> float:
        start = time.monotonic()
        with self._changed:
            while self._accounted < accounted:
                # A node idle between far-apart images sends nothing; only silence while
                # waiting counts.
                silent_since = max(self._last_status, start)
                remaining = silent_since + self.timeout_s - time.monotonic()
                if remaining <= 0:
                    raise NodeNotKeepingUpError(
                        f"{self.target} accounted for {self._accounted} of {self.published} "
                        f"images and sent no status for {self.timeout_s:g} s (did it stop?)")
                self._changed.wait(remaining)
        waited = time.monotonic() - start
        self.waited_s += waited
        return waited

    def _on_status(self, status) -> None:
        # Frames buffered for phase 1 or held past a stamp jump are not processed yet, but the
        # node holds them: counting them keeps a phase 1 longer than the lead (or a held frame,
        # which only the next one decides) from waiting on frames that are held back.
        total = frames_accounted(status)
        with self._changed:
            if self._last_total is not None:
                # The counters restart at 0 when the node is configured again.
                self._accounted += total - self._last_total if total >= self._last_total else total
            # The first status is the baseline: frames from before this replay are not ours.
            self._last_total = total
            self._last_status = time.monotonic()
            self._changed.notify_all()

    def _subscribes(self, ros_node, topic: str) -> bool:
        for info in ros_node.get_subscriptions_info_by_topic(topic):
            if f"{info.node_namespace.rstrip('/')}/{info.node_name}" == self.target:
                return True
        return False
