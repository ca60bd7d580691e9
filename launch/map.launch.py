"""Start lingbot_ros map_node, and RViz with rviz:=true.

  ros2 launch lingbot_ros map.launch.py image:=/camera/image_raw compressed:=true \
      checkpoint:=/path/lingbot-map-long.pt model_config:=lingbot-map device:=cuda namespace:=robot1 \
      use_sim_time:=true

A camera rig: cameras:=front,back camera_images:=/front/image_raw,/back/image_raw remaps each
camera's ~/<name>/image (its compressed and camera_info topics derive from it, as ~/image's do).

Parameters come from params_file. An argument that sets a parameter overrides the file only when
it is given (its default is empty): params_file:=my.yaml with the checkpoint in my.yaml runs that
checkpoint. The node's inputs all derive from ~/image (<image>/compressed, and the camera_info
beside the image topic), so the launch file remaps ~/image to `image` and nothing else.
"""
import os

import yaml
from ament_index_python.packages import PackageNotFoundError, get_package_prefix, get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, LogInfo, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode, Node

SHARE = get_package_share_directory("lingbot_ros")
RVIZ_CONFIG = os.path.join(SHARE, "rviz", "map.rviz")
NOT_GIVEN = ""

# name, default, description
ARGUMENTS = [
    ("params_file", os.path.join(SHARE, "config", "map.yaml"), "YAML file with map_node parameters"),
    ("checkpoint", NOT_GIVEN, "model checkpoint (.pt); not given: params_file's (empty there = random "
                              "weights in model_config's architecture, tiny if that is empty too: not a map)"),
    ("model_config", NOT_GIVEN, "the checkpoint's architecture: a preset (lingbot-map, tiny) or a JSON "
                                "file; not given: params_file's (empty there = lingbot-map with a "
                                "checkpoint, tiny without)"),
    ("device", NOT_GIVEN, "auto, cpu, cuda or cuda:N; not given: params_file's"),
    ("image", "/camera/image_raw", "image topic (empty: the node's ~/image); compressed:=true reads "
                                   "<image>/compressed, use_camera_info:=true the camera_info beside it"),
    ("compressed", NOT_GIVEN, "true: image_transport:=compressed, false: raw; not given: params_file's"),
    ("use_camera_info", NOT_GIVEN, "true: subscribe to the camera_info beside the image topic; "
                                   "not given: params_file's"),
    ("cameras", NOT_GIVEN, "a camera rig: the cameras' names, comma-separated (front,back); each reads "
                           "~/<name>/image; not given: params_file's (empty there: one camera on image)"),
    ("primary_camera", NOT_GIVEN, "with cameras: the camera of ~/pose, ~/odom and TF; not given: params_file's "
                                  "(empty there: the first)"),
    ("camera_images", NOT_GIVEN, "with cameras: each camera's image topic, comma-separated in the cameras' "
                                 "order (remaps ~/<name>/image); not given: ~/<name>/image"),
    ("namespace", "", "namespace of the node"),
    ("use_sim_time", NOT_GIVEN, "true: use /clock (bag replay); not given: params_file's"),
    ("autostart", NOT_GIVEN, "false: the node waits for lifecycle transitions and is started as a "
                             "LifecycleNode action (for a lifecycle manager); not given: params_file's"),
    ("log_level", "info", "log level of the node: debug, info, warn, error or fatal"),
    ("rviz", "false", "true: start rviz2 with rviz/map.rviz as well (where rviz2 is installed)"),
]
BOOLEANS = {"true": True, "1": True, "false": False, "0": False}


class LaunchArgumentError(ValueError):
    """A launch argument with a value this launch file cannot use."""


def _boolean(name: str, value: str) -> bool:
    try:
        return BOOLEANS[value.lower()]
    except KeyError:
        raise LaunchArgumentError(f"{name}:={value}: use true or false") from None


def parameter_overrides(arguments: dict) -> dict:
    """The node parameters set by the given launch arguments (name -> value as text); arguments
    left at NOT_GIVEN set nothing, so params_file's values stand."""
    given = {name: value for name, value in arguments.items() if value != NOT_GIVEN}
    overrides = {name: given[name] for name in ("checkpoint", "model_config", "device", "primary_camera")
                 if name in given}
    if "cameras" in given:
        overrides["cameras"] = _names(given["cameras"])
    for name in ("use_camera_info", "use_sim_time", "autostart"):
        if name in given:
            overrides[name] = _boolean(name, given[name])
    if "compressed" in given:
        overrides["image_transport"] = "compressed" if _boolean("compressed", given["compressed"]) else "raw"
    return overrides


def _names(text: str) -> list:
    """'front, back' -> ['front', 'back'] (the node checks the names themselves)."""
    return [name.strip() for name in text.split(",")]


def image_remappings(arguments: dict) -> list:
    """~/image -> image (unused by a rig), or with camera_images each camera's ~/<name>/image."""
    cameras = arguments.get("cameras", NOT_GIVEN)
    images = arguments.get("camera_images", NOT_GIVEN)
    if images != NOT_GIVEN:
        if cameras == NOT_GIVEN:
            raise LaunchArgumentError("camera_images needs cameras:=NAME,NAME (one topic per camera)")
        names, topics = _names(cameras), _names(images)
        if len(names) != len(topics):
            raise LaunchArgumentError(f"camera_images names {len(topics)} topic(s) for {len(names)} camera(s) "
                                      f"({cameras}): give one per camera, in the same order")
        return [(f"~/{name}/image", topic) for name, topic in zip(names, topics)]
    return [("~/image", arguments["image"])] if arguments.get("image") else []


def _rviz_topics(config_path: str) -> list:
    """Every display topic named in an RViz config (its `Topic: {Value: ...}` entries)."""
    with open(config_path) as f:
        found, todo = [], [yaml.safe_load(f)]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            topic = item.get("Topic")
            if isinstance(topic, dict) and isinstance(topic.get("Value"), str):
                found.append(topic["Value"])
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return sorted(set(found))


def _rviz(namespace: str, overrides: dict) -> list:
    try:
        get_package_prefix("rviz2")
    except PackageNotFoundError:
        return [LogInfo(msg="rviz:=true, but rviz2 is not installed here (no rviz2 package on "
                            "AMENT_PREFIX_PATH): starting map_node without RViz. Install rviz2 "
                            f"(ros-$ROS_DISTRO-rviz2), or open {RVIZ_CONFIG} in RViz on another "
                            "machine (or the Foxglove layout beside it).")]
    # The config names the node's topics at the root namespace; follow the node into its namespace.
    prefix = "/" + namespace.strip("/") if namespace.strip("/") else ""
    remappings = [(topic, prefix + topic) for topic in _rviz_topics(RVIZ_CONFIG)] if prefix else []
    sim_time = [{"use_sim_time": overrides["use_sim_time"]}] if "use_sim_time" in overrides else []
    return [Node(package="rviz2", executable="rviz2", name="rviz2", arguments=["-d", RVIZ_CONFIG],
                 parameters=sim_time, remappings=remappings, output="screen")]


def _launch_setup(context) -> list:
    value = {name: LaunchConfiguration(name).perform(context) for name, _, _ in ARGUMENTS}
    overrides = parameter_overrides(value)
    namespace = value["namespace"]
    # A LifecycleNode action lets launch (and a lifecycle manager through it) drive the transitions.
    action = LifecycleNode if overrides.get("autostart") is False else Node
    node = action(
        package="lingbot_ros",
        executable="map_node",
        name="map_node",
        namespace=namespace,
        output="screen",
        # Later entries win: the given arguments over the params file.
        parameters=([value["params_file"]] if value["params_file"] else []) + ([overrides] if overrides else []),
        remappings=image_remappings(value),
        ros_arguments=["--log-level", value["log_level"]],
    )
    return [node] + (_rviz(namespace, overrides) if _boolean("rviz", value["rviz"]) else [])


def generate_launch_description() -> LaunchDescription:
    declared = [DeclareLaunchArgument(name, default_value=default, description=description)
                for name, default, description in ARGUMENTS]
    return LaunchDescription(declared + [OpaqueFunction(function=_launch_setup)])
