"""lingbot_ros.ros.topics with real rclpy nodes: remap rules given as command-line ROS arguments."""
import pytest

from helpers import need_module  # noqa: I001 (before the ROS imports it guards)

rclpy = need_module("rclpy", module_level=True)
from rclpy.context import Context  # noqa: E402
from sensor_msgs.msg import CompressedImage  # noqa: E402

from lingbot_ros.ros.topics import camera_info_topic, input_topics  # noqa: E402

pytestmark = pytest.mark.ros


@pytest.fixture
def make_node():
    """make_node(*remaps, namespace="") -> an rclpy node named map_node, its own context."""
    made = []

    def make(*remaps: str, namespace: str = ""):
        context = Context()
        rclpy.init(context=context, args=[])
        args = ["--ros-args"] + [a for rule in remaps for a in ("-r", rule)]
        node = rclpy.create_node("map_node", namespace=namespace, context=context, cli_args=args,
                                 use_global_arguments=False)
        made.append((node, context))
        return node

    yield make
    for node, context in made:
        node.destroy_node()
        rclpy.shutdown(context=context)


def both(node, use_camera_info=True):
    return (input_topics(node, "raw", use_camera_info), input_topics(node, "compressed", use_camera_info))


def test_without_remaps_the_inputs_are_the_nodes_private_topics(make_node):
    raw, compressed = both(make_node())
    assert raw.image == "/map_node/image"
    assert compressed.image == "/map_node/image/compressed"
    assert raw.camera_info == compressed.camera_info == "/map_node/camera_info"


def test_remapping_image_alone_moves_compressed_and_camera_info(make_node):
    raw, compressed = both(make_node("~/image:=/cam/image_raw"))
    assert raw.image == "/cam/image_raw"
    assert compressed.image == "/cam/image_raw/compressed"
    assert raw.camera_info == compressed.camera_info == "/cam/camera_info"


def test_a_rig_cameras_inputs_are_under_its_name_and_move_with_its_image_remap(make_node):
    node = make_node("~/rear/image:=/cams/rear/image_raw")
    front = input_topics(node, "compressed", True, "front")
    assert (front.image, front.camera_info) == ("/map_node/front/image/compressed", "/map_node/front/camera_info")
    rear = input_topics(node, "compressed", True, "rear")
    assert (rear.image, rear.camera_info) == ("/cams/rear/image_raw/compressed", "/cams/rear/camera_info")
    assert input_topics(node, "raw", False).image == "/map_node/image"   # the single camera's, unchanged


def test_a_relative_remap_resolves_in_the_nodes_namespace(make_node):
    raw, compressed = both(make_node("~/image:=camera/image_raw", namespace="robot1"))
    assert raw.image == "/robot1/camera/image_raw"
    assert compressed.image == "/robot1/camera/image_raw/compressed"
    assert raw.camera_info == "/robot1/camera/camera_info"


def test_the_private_name_follows_the_namespace(make_node):
    raw = input_topics(make_node(namespace="robot1"), "raw", True)
    assert (raw.image, raw.camera_info) == ("/robot1/map_node/image", "/robot1/map_node/camera_info")


def test_camera_info_is_none_unless_used(make_node):
    raw, compressed = both(make_node("~/image:=/cam/image_raw"), use_camera_info=False)
    assert raw.camera_info is None and compressed.camera_info is None


def test_a_rule_for_the_full_compressed_name_applies_when_subscribing(make_node):
    # The README's form before topics.py existed; the subscription applies remaps to the derived
    # name, as image_transport's does.
    node = make_node("/map_node/image/compressed:=/bag/image/compressed")
    topic = input_topics(node, "compressed", False).image
    assert topic == "/map_node/image/compressed"
    subscription = node.create_subscription(CompressedImage, topic, lambda msg: None, 1)
    assert subscription.topic_name == "/bag/image/compressed"


def test_an_unknown_transport_is_refused(make_node):
    with pytest.raises(ValueError, match="theora"):
        input_topics(make_node(), "theora", False)


@pytest.mark.parametrize("image, expected", [
    ("/cam/image_raw", "/cam/camera_info"),
    ("/robot1/front/left/image_rect", "/robot1/front/left/camera_info"),
    ("/image", "/camera_info"),
])
def test_camera_info_topic_is_the_sibling(image, expected):
    assert camera_info_topic(image) == expected
