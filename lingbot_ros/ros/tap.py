"""A high-rate side input read in batches: its messages are taken by a timer, not one callback each.

rclpy's executor costs far more per callback than the work of an odometry sample or a /tf
filter: at 1,000 messages/s the side inputs took the image path half its frames
(bench/side_input_flood.py). A ``Tap`` subscribes on a node of its own that no executor spins
(nothing wakes up per message), and a timer on the owner's node takes every message that
arrived since the last tick and hands each to ``handler(message, info)`` in order. Each call
runs under the node's safety net (ros/safety.py, named ``name``): a handler that raises loses
its one message, the rest of the batch is still handled.

    tap = Tap(node, Odometry, "/map_node/odometry_in", qos, handler, period_s=0.05, group=group,
              name="odometry callback")
    tap.topic          # the subscribed name
    tap.destroy()

``topic`` should be resolved by the owner (``node.resolve_topic_name``): the tap node's own name
would resolve ``~/`` differently. The QoS history must hold a period's messages (older ones go:
a best-effort reader loses them as it would under load). Incompatible-QoS events need an
executor and are not reported: use a QoS every publisher matches (best effort, volatile).
"""
from __future__ import annotations

import itertools

import rclpy
from rclpy.exceptions import InvalidHandle

from lingbot_ros.ros.safety import net_of

_names = itertools.count()


class Tap:
    def __init__(self, node, msg_type, topic: str, qos, handler, period_s: float, group, name: str,
                 raw: bool = False):
        net = net_of(node)
        self._node, self._type, self._raw, self._handler = node, msg_type, raw, net.guard(name, handler)
        self._tap = rclpy.create_node(f"{node.get_name()}_tap_{next(_names)}", namespace=node.get_namespace(),
                                      context=node.context, start_parameter_services=False, enable_rosout=False)
        self._subscription = self._tap.create_subscription(msg_type, topic, lambda *_: None, qos, raw=raw)
        self.topic = self._subscription.topic_name
        self._timer = node.create_timer(period_s, net.guard(f"{name} (batch)", self.drain), callback_group=group)

    def drain(self) -> None:
        """Hand every message that arrived to the handler (a callback's work, in batch)."""
        try:
            with self._subscription.handle:
                while True:
                    taken = self._subscription.handle.take_message(self._type, self._raw)
                    if taken is None:
                        return
                    self._handler(*taken)
        except InvalidHandle:   # destroyed meanwhile
            return

    def destroy(self) -> None:
        """Idempotent."""
        if self._tap is not None:
            self._node.destroy_timer(self._timer)
            self._tap.destroy_node()
            self._tap = None
