"""The input topics of map_node, all derived from one name, as image_transport derives them.

Remapping ``~/image`` alone moves every input: the compressed stream is ``<image>/compressed`` and
camera_info is the sibling ``camera_info`` of the image topic (/cam/image_raw -> /cam/camera_info),
the names camera drivers and image_transport use. The names returned are resolved (absolute,
remaps applied); creating a subscription applies the remap rules once more, as image_transport's
does, so a rule for a full derived name (``-r /map_node/image/compressed:=/cam/compressed``) works.
A camera of a rig (``cameras``) has the same inputs under its name: ``~/<name>/image``,
``<image>/compressed`` and the camera_info beside it.
"""
from __future__ import annotations

import dataclasses

from lingbot_ros.ros.params import IMAGE_TRANSPORTS

IMAGE_TOPIC = "~/image"


@dataclasses.dataclass(frozen=True)
class InputTopics:
    image: str                 # the subscribed image topic: the raw one, or <raw>/compressed
    camera_info: str | None    # None when camera_info is not used


def camera_topic(camera: str, name: str) -> str:
    """A rig camera's topic ``name`` (image, pose, depth/image), unresolved: ~/<camera>/<name>."""
    return f"~/{camera}/{name}"


def image_topic(camera: str | None = None) -> str:
    """The node's unresolved image topic: ``~/image``, or ``~/<camera>/image`` for a rig's camera."""
    return camera_topic(camera, "image") if camera else IMAGE_TOPIC


def transport_topic(raw_topic: str, image_transport: str) -> str:
    """The topic ``image_transport`` reads for the raw image topic ``raw_topic``."""
    return f"{raw_topic}/compressed" if image_transport == "compressed" else raw_topic


def camera_info_topic(image_topic: str) -> str:
    """The camera_info beside a resolved image topic: /cam/image_raw -> /cam/camera_info."""
    namespace = image_topic.rsplit("/", 1)[0]
    return f"{namespace}/camera_info"


def input_topics(node, image_transport: str, use_camera_info: bool, camera: str | None = None) -> InputTopics:
    """Topics to subscribe for ``node`` (an rclpy Node, whose remap rules apply), of the rig's
    ``camera`` (None: the single camera)."""
    if image_transport not in IMAGE_TRANSPORTS:
        raise ValueError(f"image_transport {image_transport!r}: use one of {', '.join(IMAGE_TRANSPORTS)}")
    raw = node.resolve_topic_name(image_topic(camera))
    return InputTopics(image=transport_topic(raw, image_transport),
                       camera_info=camera_info_topic(raw) if use_camera_info else None)
