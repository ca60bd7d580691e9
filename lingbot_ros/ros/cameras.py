"""The node's checks of a camera rig's ``cameras`` (issue 29): the names, the primary camera, and
a camera topic that the graph already carries with another type.

A camera name becomes the namespace of its topics (``~/<name>/image``, topics.py): beyond the
grouping's rule (mapping/rig/grouping.py: non-empty, unique, at most 32, a topic name token) it
must not be one of the node's own names, or a camera's input would be one of the node's outputs
(a camera ``depth`` would read ``~/depth/image``, the node's depth image).
"""
from __future__ import annotations

from typing import Iterable, Sequence

from lingbot_ros.mapping.rig.grouping import cameras_error
from lingbot_ros.ros.reference import ABOUT, STANDARD_SERVICE_SUFFIXES, STANDARD_TOPICS
from lingbot_ros.ros.topics import input_topics

# The first token of every name the node has under ``~/`` (its topics and services, the standard
# lifecycle and parameter ones too), read from the reference table that lists them all.
RESERVED_NAMES = frozenset(
    [name[2:].split("/")[0] for _, name in ABOUT if name.startswith("~/")]
    + [suffix.strip("/") for suffix in STANDARD_SERVICE_SUFFIXES]
    + [topic.rsplit("/", 1)[1] for topic in STANDARD_TOPICS if topic.count("/") > 1])
IMAGE_TYPES = {"raw": "sensor_msgs/msg/Image", "compressed": "sensor_msgs/msg/CompressedImage"}


def cameras_errors(cameras: Sequence[str], primary_camera: str) -> list[str]:
    """What makes ``cameras`` and ``primary_camera`` (empty: the first camera) unusable, each
    saying what to change."""
    error = cameras_error(tuple(cameras))
    if error:
        return [f"'cameras' {error}"]
    errors = [f"'cameras': {name!r} is a name of the node's own (~/{name}...): name the camera otherwise"
              for name in cameras if name in RESERVED_NAMES]
    if primary_camera and primary_camera not in cameras:
        errors.append(f"'primary_camera' ({primary_camera!r}) must be one of cameras {list(cameras)}, or empty "
                      "for the first")
    return errors


def expected_types(node, cameras: Sequence[str], image_transport: str) -> dict[str, str]:
    """Each camera's image topic as ``node`` (an rclpy Node: its remaps apply) subscribes to it ->
    the message type it reads there."""
    return {input_topics(node, image_transport, False, name).image: IMAGE_TYPES[image_transport]
            for name in cameras}


def wrong_types(graph: Iterable[tuple[str, Sequence[str]]], expected: dict[str, str]) -> list[str]:
    """Errors for topics of ``expected`` (topic -> type) that ``graph`` (``node.get_topic_names_and_types()``)
    carries with another type: a subscription there would never receive a frame."""
    errors = []
    for topic, types in graph:
        want = expected.get(topic)
        others = sorted(set(types) - {want}) if want else []
        if others:
            errors.append(f"{topic} carries {', '.join(others)}, not {want}: remap the camera to its image "
                          "topic, or set image_transport to match it")
    return errors
