"""The node's input topic names, derived from one remappable name as image_transport does.

Remapping ``image`` alone is enough: the raw subscription is the resolved ``~/image``, the
compressed one ``<resolved image topic>/compressed``, camera_info the sibling ``camera_info``
of the image topic (``/cam/image_raw`` -> ``/cam/camera_info``).
"""
from __future__ import annotations

import dataclasses
import posixpath


@dataclasses.dataclass(frozen=True)
class InputTopics:
    image: str                 # the topic the image subscription uses
    camera_info: str | None    # None without use_camera_info


def input_topics(node, image_transport: str, use_camera_info: bool) -> InputTopics:
    raw = node.resolve_topic_name("~/image")
    image = raw + "/compressed" if image_transport == "compressed" else raw
    camera_info = posixpath.join(posixpath.dirname(raw), "camera_info") if use_camera_info else None
    return InputTopics(image=image, camera_info=camera_info)
