"""ros/cameras.py: a camera rig's `cameras` refused with a reason (issue 29), and a camera topic
the graph carries with another type found on a real DDS graph."""
import pytest

from helpers import need_module  # noqa: I001 (before the ROS imports it guards)

rclpy = need_module("rclpy", module_level=True)
from sensor_msgs.msg import CompressedImage, Image  # noqa: E402
from std_msgs.msg import String  # noqa: E402

from helpers import ProbeNode, wait_until  # noqa: E402
from lingbot_ros.ros.cameras import RESERVED_NAMES, cameras_errors, expected_types, wrong_types  # noqa: E402
from lingbot_ros.ros.reference import ABOUT  # noqa: E402

pytestmark = pytest.mark.ros


def test_a_usable_rig_passes():
    assert cameras_errors(["front", "rear_left"], "") == []
    assert cameras_errors(["front", "rear_left"], "rear_left") == []


@pytest.mark.parametrize("cameras, primary, says", [
    ([], "", "'cameras' must name at least one camera"),
    (["a", "a"], "", "repeated: ['a']"),
    ([f"c{i}" for i in range(100)], "", "at most 32 cameras, not 100"),
    (["front", ""], "", "non-empty"),
    (["front", "rear/left"], "", "letters, digits and single underscores"),
    (["front", "depth"], "", "'depth' is a name of the node's own (~/depth...)"),
    (["front", "rear"], "side", "'primary_camera' ('side') must be one of cameras ['front', 'rear']"),
])
def test_cameras_that_cannot_work_are_refused_with_what_to_change(cameras, primary, says):
    errors = cameras_errors(cameras, primary)
    assert any(says in error for error in errors), errors


def test_every_name_of_the_node_is_reserved():
    """A camera named after any topic or service of the node would share its namespace: its
    input could be one of the node's outputs (~/depth/image)."""
    for _, name in ABOUT:
        if name.startswith("~/"):
            first = name[2:].split("/")[0]
            assert first in RESERVED_NAMES and cameras_errors([first], ""), name


@pytest.mark.parametrize("transport, kind", [("raw", Image), ("compressed", CompressedImage)])
def test_a_camera_topic_of_another_type_in_the_graph_is_named(tmp_path, transport, kind):
    probe = ProbeNode(tmp_path)
    try:
        suffix = "/compressed" if transport == "compressed" else ""
        expected = expected_types(probe.node, ["front", "rear"], transport)
        assert sorted(expected) == [f"/probe/front/image{suffix}", f"/probe/rear/image{suffix}"]
        probe.node.create_publisher(String, f"/probe/front/image{suffix}", 10)   # not a camera
        probe.node.create_publisher(kind, f"/probe/rear/image{suffix}", 10)      # the right type
        errors = wait_until(lambda: wrong_types(probe.node.get_topic_names_and_types(), expected),
                            "the String topic in the graph", 20)
        assert errors == [f"/probe/front/image{suffix} carries std_msgs/msg/String, not "
                          f"{expected[f'/probe/front/image{suffix}']}: remap the camera to its image topic, or set "
                          "image_transport to match it"]
    finally:
        probe.close()
