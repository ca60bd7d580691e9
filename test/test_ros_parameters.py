"""map_node's parameters over the real services (helpers.Ros): read-only ones refused, ranges in
the descriptors, bad values refused with the reason, live ones taking effect on the next output,
input ones only while inactive."""
import pytest
from lifecycle_msgs.msg import Transition
from rcl_interfaces.msg import Parameter, ParameterType
from rcl_interfaces.srv import DescribeParameters, GetParameters, SetParameters
from sensor_msgs.msg import CompressedImage, PointCloud2

from helpers import (BAG_TOPIC, double_parameter, integer_parameter, interrupt_and_check_exit, publish_when_matched,
                     string_parameter, synthetic_jpeg)

pytestmark = [pytest.mark.ros, pytest.mark.slow]
T = Transition
WIDTH, HEIGHT = 112, 84    # model input of the probe's 128x96 images at image_width 112
# (~/points keeps every stride-th pixel of both axes: ceil(84 / stride) * ceil(112 / stride))


def set_one(env, parameter: Parameter):
    """The node's answer to one set_parameters request: (successful, reason)."""
    result = env.call(SetParameters, "/map_node/set_parameters", SetParameters.Request(parameters=[parameter]))
    return result.results[0].successful, result.results[0].reason


def value_of(env, name: str):
    value = env.call(GetParameters, "/map_node/get_parameters", GetParameters.Request(names=[name])).values[0]
    return {ParameterType.PARAMETER_INTEGER: value.integer_value, ParameterType.PARAMETER_DOUBLE: value.double_value,
            ParameterType.PARAMETER_STRING: value.string_value}[value.type]


def test_read_only_parameters_and_ranges_are_described(ros, tiny):
    fixture, _ = tiny
    node = ros.start_node(fixture, autostart=False)
    names = ["sliding_window", "min_confidence", "path_max_length", "service_timeout_s", "image_qos"]
    described = ros.call(DescribeParameters, "/map_node/describe_parameters",
                         DescribeParameters.Request(names=names)).descriptors
    by_name = {d.name: d for d in described}
    assert set(by_name) == set(names)
    sliding = by_name["sliding_window"]
    assert sliding.read_only and "read-only" in sliding.description
    assert (sliding.integer_range[0].from_value, sliding.integer_range[0].to_value) == (1, 1024)
    confidence = by_name["min_confidence"]
    assert not confidence.read_only and "applies at once" in confidence.description
    assert confidence.floating_point_range[0].from_value == 0.0 and not confidence.integer_range
    assert by_name["path_max_length"].integer_range[0].from_value == 1
    # 'above 0' is an open bound a descriptor cannot state: the range starts at 0 and the node's
    # own check refuses 0 itself (below).
    assert by_name["service_timeout_s"].floating_point_range[0].from_value == 0.0
    image_qos = by_name["image_qos"]
    assert not image_qos.read_only and "one of: auto, sensor_data, reliable, best_effort" in image_qos.description
    interrupt_and_check_exit(ros, node)


def test_parameters_are_refused_with_the_reason_or_applied_live(ros, tiny):
    fixture, _ = tiny
    node = ros.start_node(fixture, "process_all_frames:=true", "image_qos:=reliable", "min_confidence:=0.0",
                          "max_stamp_gap_s:=0.0")
    ros.wait(lambda: ros.statuses, "the node's first status")
    assert ros.state() == "active"
    points: list = []
    ros.node.create_subscription(PointCloud2, "/map_node/points", points.append, 10)

    # Refused, with the reason, and nothing changes.
    successful, reason = set_one(ros, integer_parameter("sliding_window", 8))
    assert not successful and "read-only" in reason and "sliding_window" in reason
    successful, reason = set_one(ros, double_parameter("min_confidence", -1.0))
    assert not successful and "min_confidence" in reason and "out of range" in reason
    successful, reason = set_one(ros, integer_parameter("path_max_length", 0))
    assert not successful and "path_max_length" in reason and "out of range" in reason
    successful, reason = set_one(ros, double_parameter("service_timeout_s", 0.0))
    assert not successful and "'service_timeout_s' must be > 0" in reason
    successful, reason = set_one(ros, double_parameter("rate_tolerance", 1.5))
    assert not successful and "'rate_tolerance' must be below 1" in reason
    successful, reason = set_one(ros, string_parameter("path_max_length", "three"))
    assert not successful and "'path_max_length' must be a int" in reason
    successful, reason = set_one(ros, string_parameter("image_qos", "best_effort"))
    assert not successful and "'image_qos' is taken at activate" in reason
    assert (value_of(ros, "sliding_window"), value_of(ros, "min_confidence")) == (4, 0.0)
    assert (value_of(ros, "path_max_length"), value_of(ros, "image_qos")) == (1000, "reliable")

    # Live: the path keeps 3 poses, points come at another stride, and a confidence threshold
    # no pixel reaches empties ~/points (a Mapper setting: applied on the worker, between frames).
    ros.wait(lambda: ros.node.count_publishers("/map_node/points"), "the node's ~/points")
    frames = [synthetic_jpeg(i, 100 + 0.1 * i) for i in range(8)]
    publish_when_matched(ros, CompressedImage, BAG_TOPIC, frames[:4])
    ros.wait(lambda: ros.settled_with(4), "4 frames processed")
    ros.wait(lambda: len(ros.paths) >= 2 and points, "a path and points")   # phase 1 outputs after frame 3
    assert len(ros.paths[-1].poses) == 4
    assert points[-1].width == -(-HEIGHT // 4) * -(-WIDTH // 4)

    # An integer for a float parameter is accepted, as a YAML 1 for 1.0 is.
    for parameter in (integer_parameter("path_max_length", 3), integer_parameter("points_stride", 8),
                      integer_parameter("odom_variance", 1)):
        assert set_one(ros, parameter) == (True, "")
    assert isinstance(value_of(ros, "odom_variance"), float)   # and it stays a float parameter
    publish_when_matched(ros, CompressedImage, BAG_TOPIC, frames[4:6])
    ros.wait(lambda: ros.settled_with(6), "6 frames processed")
    ros.wait(lambda: ros.paths[-1].header.stamp == frames[5].header.stamp, "the path of frame 6")
    path = ros.paths[-1]
    assert [p.header.stamp for p in path.poses] == [f.header.stamp for f in frames[3:6]]
    ros.wait(lambda: points[-1].header.stamp == frames[5].header.stamp, "the points of frame 6")
    assert points[-1].width == -(-HEIGHT // 8) * -(-WIDTH // 8)

    assert set_one(ros, double_parameter("min_confidence", 1e30)) == (True, "")
    publish_when_matched(ros, CompressedImage, BAG_TOPIC, frames[6:7])
    ros.wait(lambda: points[-1].header.stamp == frames[6].header.stamp, "the points of frame 7")
    assert points[-1].width == 0
    assert value_of(ros, "path_max_length") == 3 and value_of(ros, "min_confidence") == 1e30

    # An input parameter changes while inactive and is taken at the next activate.
    ros.transition(T.TRANSITION_DEACTIVATE, "inactive")
    assert set_one(ros, string_parameter("image_qos", "auto")) == (True, "")
    ros.transition(T.TRANSITION_ACTIVATE, "active")
    assert value_of(ros, "image_qos") == "auto"
    publish_when_matched(ros, CompressedImage, BAG_TOPIC, frames[7:8])
    ros.wait(lambda: ros.settled_with(8), "a frame through the re-created subscription")
    interrupt_and_check_exit(ros, node)
