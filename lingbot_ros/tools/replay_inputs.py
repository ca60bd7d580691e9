"""lingbot-ros-replay's inputs: one or several bags played as one, and a camera rig's image topics.

Several bags play together on one timeline, their messages merged in receive-time order (the
order they were recorded in: bags recorded side by side stay in step; bags recorded at different
times play one after the other, and the player warns). ``--camera NAME[:=TOPIC]`` gives an image
topic to a camera of a rig node (``cameras:=[NAME, ...]``), published where that node subscribes:
``<node>/NAME/image``, or ``<node>/NAME/image/compressed`` for a compressed topic (map_node's
``~/<name>/image``; remap that on the node's side, as ``~/image`` for one camera). With several
bags, the i-th ``--camera`` takes the i-th bag's image topic (TOPIC names it where the bag has
several); with one bag, each ``--camera`` names its TOPIC in it. The camera_info recorded beside
a camera's image topic (/cam/image_raw[/compressed] -> /cam/camera_info) goes to that camera's
``<node>/NAME/camera_info``. Every other topic is published under its recorded name (or its
--remap).
"""
from __future__ import annotations

import dataclasses
import heapq
from pathlib import Path
from typing import Iterator

from lingbot_ros.mapping.rig.grouping import camera_name_error
from lingbot_ros.ros.topics import camera_info_topic, image_topic, transport_topic
from lingbot_ros.tools.replay_pacing import IMAGE_TYPES

COMPRESSED = "sensor_msgs/msg/CompressedImage"
CAMERA_INFO = "sensor_msgs/msg/CameraInfo"


@dataclasses.dataclass(frozen=True)
class CameraArg:
    """One --camera NAME[:=TOPIC]."""

    name: str
    topic: str | None   # the bag's image topic; None: the bag's only one


@dataclasses.dataclass(frozen=True)
class Track:
    """One recorded topic of one bag, and where it is published."""

    bag: int            # index into the bags given
    connection: object  # rosbags Connection
    topic: str
    camera: str = ""    # the --camera it plays, if any

    @property
    def key(self) -> tuple[int, int]:
        return self.bag, self.connection.id


def bag_folder(arg: str) -> Path | None:
    """The rosbag2 folder ``arg`` names (the folder, or its .mcap / .db3 file); None if it is none."""
    bag = Path(arg)
    if bag.is_file():
        bag = bag.parent
    return bag if (bag / "metadata.yaml").exists() else None


def parse_cameras(items: list[str]) -> list[CameraArg]:
    """--camera values; a ValueError names the first bad one."""
    cameras = []
    for item in items:
        name, sep, topic = item.partition(":=")
        error = camera_name_error(name)
        if error:
            raise ValueError(f"--camera {item}: {error}")
        if sep and not topic:
            raise ValueError(f"--camera {item}: expects NAME or NAME:=TOPIC")
        cameras.append(CameraArg(name, topic or None))
    names = [camera.name for camera in cameras]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"--camera: each camera once; repeated: {', '.join(repeated)}")
    return cameras


def camera_topic(node: str, name: str, msgtype: str) -> str:
    """Where a rig node (its full name) subscribes to camera ``name``'s images of ``msgtype``, or
    to its camera_info, without remaps (its ``~`` expanded)."""
    raw = f"/{node.strip('/')}{image_topic(name)[1:]}"
    if msgtype == CAMERA_INFO:
        return camera_info_topic(raw)
    return transport_topic(raw, "compressed" if msgtype == COMPRESSED else "raw")


def recorded_camera_info(image_topic: str, msgtype: str) -> str:
    """The camera_info a recorded image topic has beside it, as the node derives its own
    (/cam/image_raw[/compressed] -> /cam/camera_info)."""
    return camera_info_topic(image_topic.removesuffix("/compressed") if msgtype == COMPRESSED else image_topic)


def choose_tracks(bag_connections: list[list], cameras: list[CameraArg], remaps: dict[str, str],
                  topics: list[str] | None, node: str) -> list[Track]:
    """The tracks to play from each bag's connections (``bag_connections[i]``: bag i's): the
    cameras' image topics and the camera_info recorded beside each (published for ``node``), and
    every other topic ``topics`` selects (all: None) under its --remap. A ValueError says what
    does not fit."""
    owners = _camera_owners(bag_connections, cameras)
    owners.update(_camera_info_owners(bag_connections, owners))
    for source in remaps:
        taken = [name for (bag, topic), name in owners.items() if topic == source]
        if taken:
            raise ValueError(f"--remap {source}:=...: that topic is --camera {taken[0]}'s, published as the "
                             f"node {node} reads it (<node>/{taken[0]}/image...): use --node to name "
                             "another node")
    tracks = []
    for bag, connections in enumerate(bag_connections):
        for connection in connections:
            name = owners.get((bag, connection.topic))
            if name is not None:
                tracks.append(Track(bag, connection, camera_topic(node, name, connection.msgtype), name))
            elif topics is None or connection.topic in topics:
                tracks.append(Track(bag, connection, remaps.get(connection.topic, connection.topic)))
    return tracks


def _camera_owners(bag_connections: list[list], cameras: list[CameraArg]) -> dict[tuple[int, str], str]:
    """(bag, recorded image topic) -> camera name."""
    if not cameras:
        return {}
    if len(bag_connections) == 1:
        if len(cameras) > 1 and any(camera.topic is None for camera in cameras):
            raise ValueError("several --camera for one bag: give each its image topic, NAME:=TOPIC")
        wanted = [(0, camera) for camera in cameras]
    elif len(cameras) != len(bag_connections):
        raise ValueError(f"{len(bag_connections)} bags and {len(cameras)} --camera: with several bags, give one "
                         "--camera per bag, in the same order")
    else:
        wanted = list(enumerate(cameras))
    owners = {}
    for bag, camera in wanted:
        images = sorted({c.topic for c in bag_connections[bag] if c.msgtype in IMAGE_TYPES})
        topic = camera.topic
        if topic is None:
            if len(images) != 1:
                raise ValueError(f"--camera {camera.name}: bag {bag + 1} has {len(images)} image topics "
                                 f"({', '.join(images) or 'none'}): name one, {camera.name}:=TOPIC")
            topic = images[0]
        elif topic not in images:
            raise ValueError(f"--camera {camera.name}:={topic}: no image topic of that name in bag {bag + 1} "
                             f"(its image topics: {', '.join(images) or 'none'})")
        if (bag, topic) in owners:
            raise ValueError(f"--camera {camera.name}: {topic} is already --camera {owners[(bag, topic)]}'s")
        owners[(bag, topic)] = camera.name
    return owners


def _camera_info_owners(bag_connections: list[list], owners: dict[tuple[int, str], str]) -> dict[tuple[int, str], str]:
    """(bag, recorded camera_info topic) -> camera name, for the cameras' image topics that have one."""
    infos = {}
    for bag, connections in enumerate(bag_connections):
        recorded = {c.topic for c in connections if c.msgtype == CAMERA_INFO}
        for c in connections:
            name = owners.get((bag, c.topic))
            if name is not None and c.msgtype in IMAGE_TYPES and recorded_camera_info(c.topic, c.msgtype) in recorded:
                infos[(bag, recorded_camera_info(c.topic, c.msgtype))] = name
    return infos


def merged_messages(readers: list, tracks: list[Track], start_ns: int,
                    stop_ns: int | None) -> Iterator[tuple[Track, int, memoryview]]:
    """(track, receive time, raw CDR) of every track's messages in [start_ns, stop_ns), over all
    bags in receive-time order (a tie: the bag given first)."""
    by_key = {track.key: track for track in tracks}

    def one_bag(bag: int, reader):
        connections = [track.connection for track in tracks if track.bag == bag]
        if not connections:
            return
        for connection, timestamp, raw in reader.messages(connections=connections, start=start_ns, stop=stop_ns):
            yield timestamp, bag, by_key[(bag, connection.id)], raw

    # heapq.merge is stable: equal receive times come out in the order of the bags given.
    for timestamp, _, track, raw in heapq.merge(*(one_bag(i, r) for i, r in enumerate(readers)),
                                                key=lambda message: (message[0], message[1])):
        yield track, timestamp, raw


def apart(readers: list, names: list[str]) -> str | None:
    """A warning when some bags do not overlap in receive time (they play one after the other)."""
    if len(readers) < 2:
        return None
    latest_start = max(reader.start_time for reader in readers)
    earliest_end = min(reader.end_time for reader in readers)
    if latest_start <= earliest_end:
        return None
    return (f"the bags do not overlap in time ({', '.join(names)}): they play one after the other, "
            f"{(latest_start - earliest_end) / 1e9:.1f} s apart at the least (receive times are kept)")
