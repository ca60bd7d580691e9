"""map_node warms up on the size its images will have (issue 26, item 6): with
``warmup_image_size: auto`` configure waits a moment for the camera_info beside the image topic
and warms up on its images' size; a hostile camera_info is refused with the reason and the
default taken. The node a subprocess over DDS, the probe the camera driver."""
import re

import pytest
from lifecycle_msgs.msg import Transition
from sensor_msgs.msg import CameraInfo

from lingbot_ros.ros.qos import input_qos

pytestmark = [pytest.mark.ros, pytest.mark.slow]
T = Transition
CAMERA_INFO = "/map_node/camera_info"   # beside ~/image, which the node reads raw here


def camera_info(width: int, height: int, **fields) -> CameraInfo:
    msg = CameraInfo(width=width, height=height, k=[300.0, 0.0, width / 2, 0.0, 300.0, height / 2, 0.0, 0.0, 1.0])
    for name, value in fields.items():
        setattr(msg, name, value)
    return msg


class Driver:
    """The probe as a camera driver: ``msg`` at 20 Hz (None: silent), sensor_data QoS."""

    def __init__(self, ros, msg=None):
        self.msg = msg
        publisher = ros.node.create_publisher(CameraInfo, CAMERA_INFO, input_qos("sensor_data", 5))
        ros.node.create_timer(0.05, lambda: self.msg is not None and publisher.publish(self.msg))


def warm_up_lines(log: str) -> list[str]:
    return re.findall(r"(?:warm-up: .*|warming up on .*)", log)


def test_configure_warms_up_on_the_camera_infos_size_and_refuses_a_hostile_one(ros, tiny):
    fixture, _ = tiny
    # No checkpoint: the fixture's architecture with random weights (issue 30, item 3: the
    # warning names it).
    node = ros.start_node(fixture, "checkpoint:=\"\"", "warmup:=true", "warmup_camera_info_wait_s:=3.0",
                          autostart=False)
    driver = Driver(ros)
    cases = [
        (None, "warming up on 640x480 images (the default: camera_info on /map_node/camera_info: none arrived "
               "within 3 s; model input 112x84)"),
        (camera_info(518, 294), "warming up on 518x294 images (from camera_info on /map_node/camera_info; "
                                "model input 112x70)"),
        # REP 104: a region of interest, binned 2x2: the images are 320x240.
        (camera_info(1280, 960, binning_x=2, binning_y=2, roi=_roi(640, 480, 100, 50)),
         "warming up on 320x240 images (from camera_info on /map_node/camera_info; model input 112x84)"),
        (camera_info(100_000, 100_000), "more than 67108864 pixels"),
        (camera_info(0, 0), "camera_info: size 0x0"),
        (camera_info(640, 480, k=[float("nan")] * 9), "camera_info: non-finite K"),
        (camera_info(640, 480, roi=_roi(700, 10, 0, 0)), "region of interest 700x10 at (0, 0) is not inside"),
        (camera_info(640, 480, binning_x=1000), "binning 1000x1 is larger than the 640x480 size"),
    ]
    seen = 0
    for msg, expected in cases:
        driver.msg = msg
        ros.transition(T.TRANSITION_CONFIGURE, "inactive")
        lines = warm_up_lines(ros.output(node))[seen:]
        seen += len(lines)
        assert any(expected in line for line in lines), (expected, lines)
        if "warming up on" not in expected:   # refused: a warning with the reason, the default taken
            assert lines[0].startswith("warm-up: camera_info on /map_node/camera_info refused: "), lines
            assert "set warmup_image_size to the camera's WxH" in lines[0]
            assert "warming up on 640x480 images (the default; model input 112x84)" in lines[1], lines
            reason = lines[0].removeprefix("warm-up: ").split("; set warmup_image_size")[0]
            ros.wait(lambda: ros.statuses and (ros.statuses[-1].camera_info_rejected, ros.statuses[-1].last_error)
                     == (1, reason), "the refusal counted in the status, with its reason")
        ros.transition(T.TRANSITION_CLEANUP, "unconfigured")
    log = ros.output(node)
    assert f"running the '{fixture / 'config.json'}' architecture with RANDOM weights" in log


def test_an_explicit_size_is_taken_as_it_is(ros, tiny):
    fixture, _ = tiny
    node = ros.start_node(fixture, "warmup:=true", "warmup_image_size:=160x120")
    Driver(ros, camera_info(518, 294))   # what it says is not waited for
    ros.wait(lambda: "warm-up done" in ros.output(node), "the warm-up")
    assert warm_up_lines(ros.output(node))[0].startswith(
        "warming up on 160x120 images (warmup_image_size; model input 112x84)")


def _roi(width, height, x, y):
    from sensor_msgs.msg import RegionOfInterest

    return RegionOfInterest(x_offset=x, y_offset=y, width=width, height=height)


def test_the_demo_warms_the_node_up_on_its_sources_size(ros, tmp_path, shared_data):
    """The courthouse images are 518x294: the demo's node warms up on them, not on 640x480."""
    folder = shared_data("courthouse_jpg")
    demo = ros.start("demo", ["-m", "lingbot_ros.tools.run_demo", "--source", str(folder), "--frames", "8",
                              "--rate", "20", "--out", str(tmp_path / "out")])
    assert demo.wait(300) == 0, ros.output(demo)[-3000:]
    # The tiny model's default width without a checkpoint is 252: 294 * 252 / 518 -> 140 (spec 3).
    assert warm_up_lines(ros.output(demo))[0].startswith(
        "warming up on 518x294 images (warmup_image_size; model input 252x140)"), ros.output(demo)[-3000:]
