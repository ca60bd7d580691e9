"""lingbot-ros-replay --wait-for-subscribers: hold the first message back until the subscribers
that matter are there.

Without --subscriber: until every played topic (and /clock with --clock) has a subscriber. With
--subscriber NAME (repeatable): NAME is a played topic (after --remap), waited for until it has a
subscriber, or else a node (/ns/name), waited for until it subscribes to one of the played topics
and the player has matched every subscription the graph shows on that topic. The second part
matters: a monitor that matched first must not start the playback while the node that needs the
first frames is still being matched.
"""
from __future__ import annotations

import time

POLL_S = 0.05


def full_name(name: str) -> str:
    return "/" + name.strip("/")


def pending(ros_node, publishers: dict, names: list[str]) -> list[str]:
    """What is still awaited, as text (empty: start). ``publishers`` maps topic -> publisher."""
    if not names:
        return [f"{topic} (no subscriber)" for topic, publisher in publishers.items()
                if not publisher.get_subscription_count()]
    missing = []
    for name in map(full_name, names):
        if name in publishers:
            if not publishers[name].get_subscription_count():
                missing.append(f"{name} (no subscriber)")
        elif not any(_node_matched(ros_node, name, topic, publisher) for topic, publisher in publishers.items()):
            missing.append(f"{name} (subscribes to none of the played topics)")
    return missing


def wait_for_subscribers(ros_node, publishers: dict, names: list[str], timeout_s: float) -> list[str]:
    """Wait up to ``timeout_s``; returns what is still missing then (empty: all there)."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = pending(ros_node, publishers, names)
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(POLL_S)


def _node_matched(ros_node, node_name: str, topic: str, publisher) -> bool:
    subscriptions = ros_node.get_subscriptions_info_by_topic(topic)
    if not any(f"{info.node_namespace.rstrip('/')}/{info.node_name}" == node_name for info in subscriptions):
        return False
    return publisher.get_subscription_count() >= len(subscriptions)
