"""Start lingbot_ros map_node.

  ros2 launch lingbot_ros map.launch.py image:=/camera/image_raw compressed:=true \
      checkpoint:=/path/lingbot-map-long.pt device:=cuda namespace:=robot1 use_sim_time:=true

The node subscribes to ~/image (or ~/image/compressed); the launch file remaps that to `image`.
"""
import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition, UnlessCondition
from launch.substitutions import LaunchConfiguration, PythonExpression
from launch_ros.actions import Node

ARGUMENTS = [
    ("params_file", os.path.join(get_package_share_directory("lingbot_ros"), "config", "map.yaml"),
     "YAML file with map_node parameters"),
    ("checkpoint", "", "model checkpoint (.pt); empty = tiny random-weight model (not a map)"),
    ("image", "/camera/image_raw", "raw image topic; with compressed:=true, <image>/compressed is used"),
    ("compressed", "false", "subscribe to <image>/compressed (sensor_msgs/CompressedImage)"),
    ("namespace", "", "namespace of the node"),
    ("use_sim_time", "false", "use /clock (bag replay)"),
    ("device", "auto", "auto, cpu, cuda or cuda:N"),
]


def _node(compressed: bool) -> Node:
    image = LaunchConfiguration("image")
    return Node(
        package="lingbot_ros",
        executable="map_node",
        name="map_node",
        namespace=LaunchConfiguration("namespace"),
        output="screen",
        # Later entries override the params file: launch arguments win.
        parameters=[LaunchConfiguration("params_file"), {
            "checkpoint": LaunchConfiguration("checkpoint"),
            "device": LaunchConfiguration("device"),
            "use_sim_time": PythonExpression(["'", LaunchConfiguration("use_sim_time"),
                                              "'.lower() == 'true'"]),
            "image_transport": "compressed" if compressed else "raw",
        }],
        remappings=[("~/image/compressed", [image, "/compressed"])] if compressed
        else [("~/image", image)],
        condition=(IfCondition if compressed else UnlessCondition)(LaunchConfiguration("compressed")),
    )


def generate_launch_description() -> LaunchDescription:
    declared = [DeclareLaunchArgument(name, default_value=default, description=description)
                for name, default, description in ARGUMENTS]
    return LaunchDescription(declared + [_node(compressed=False), _node(compressed=True)])
