"""/diagnostics of map_node over real DDS (helpers.Ros): reported while unconfigured, an ERROR
for a failed configure, OK while images come, STALE when they stop, OK again when they return,
and the input frequency against an expected rate set live."""
import pytest
from lifecycle_msgs.msg import Transition
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue

from helpers import BAG_TOPIC, double_parameter, interrupt_and_check_exit, synthetic_jpeg
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage

from lingbot_ros.ros.health import ERROR, OK, STALE, WARN

pytestmark = [pytest.mark.ros, pytest.mark.slow]
T = Transition


class Camera:
    """The probe as a 4 Hz camera (a timer on the probe's executor), stamps 0.25 s apart."""

    def __init__(self, env):
        self.publisher = env.node.create_publisher(CompressedImage, BAG_TOPIC, QoSProfile(
            depth=10, reliability=ReliabilityPolicy.RELIABLE))
        self.sent = 0
        self.timer = env.node.create_timer(0.25, self._send)
        self.timer.cancel()

    def _send(self):
        self.publisher.publish(synthetic_jpeg(self.sent % 8, 100 + 0.25 * self.sent))
        self.sent += 1


def statuses(env):
    """(main status, frequency status) of the newest /diagnostics array, or None."""
    return tuple(env.diagnostics[-1].status) if env.diagnostics else None


def newest(env, level: int, what: str, name_index: int = 0, contains: str = ""):
    def match():
        pair = statuses(env)
        status = pair and pair[name_index]
        return status if status and status.level == bytes([level]) and contains in status.message else None
    return env.wait(match, what)


def test_diagnostics_levels_follow_the_images(ros, tiny):
    fixture, _ = tiny
    node = ros.start_node(fixture, "process_all_frames:=true", "image_qos:=reliable", "max_stamp_gap_s:=0.0",
                          "stale_after_s:=1.5", "diagnostics_window_s:=2.0", "path_max_length:=0",
                          autostart=False)
    status = newest(ros, OK, "diagnostics while unconfigured", contains="unconfigured")
    assert status.name == "map_node: LingBot-Map" and status.hardware_id == "/map_node"
    assert statuses(ros)[1].name == "map_node: image input frequency"

    # A configure that fails for a bad parameter is an ERROR that says why.
    ros.transition(T.TRANSITION_CONFIGURE, "unconfigured", succeeds=False)
    status = newest(ros, ERROR, "an ERROR after the failed configure", contains="configure failed")
    assert "'path_max_length' must be >= 1" in status.message
    # A live parameter can be fixed before the next configure (a read-only one would need a restart).
    ros.set_parameter(Parameter(name="path_max_length", value=ParameterValue(
        type=ParameterType.PARAMETER_INTEGER, integer_value=3)))
    ros.transition(T.TRANSITION_CONFIGURE, "inactive")
    newest(ros, OK, "OK once configured", contains="inactive")
    ros.transition(T.TRANSITION_ACTIVATE, "active")

    camera = Camera(ros)
    ros.wait(camera.publisher.get_subscription_count, "the node's image subscription")
    camera.timer.reset()
    status = newest(ros, OK, "OK while images come")
    ros.wait(lambda: int(ros.diagnostic("frames_processed") or 0) >= 4, "4 frames processed")
    assert int(ros.diagnostic("frames_received_in_window")) > 0

    camera.timer.cancel()
    status = newest(ros, STALE, "STALE once the images stop", contains="no image for")
    assert float(ros.diagnostic("seconds_since_image")) >= 1.5
    newest(ros, STALE, "the frequency entry STALE too", name_index=1)

    camera.timer.reset()
    newest(ros, OK, "OK again when the images return")
    frequency = newest(ros, OK, "the frequency entry OK again", name_index=1)
    assert {kv.key for kv in frequency.values} == {"Events in window", "Events since startup",
                                                   "Duration of window (s)", "Actual frequency (Hz)"}

    # An expected rate far above the camera's, set live: the input frequency is too low.
    ros.set_parameter(double_parameter("expected_rate_hz", 100.0))
    frequency = newest(ros, WARN, "the frequency entry WARN below 90 Hz", name_index=1, contains="too low")
    values = {kv.key: kv.value for kv in frequency.values}
    assert values["Minimum acceptable frequency (Hz)"] == "90.000000"
    newest(ros, WARN, "the main status WARN for the input frequency", contains="input frequency too low")
    camera.timer.cancel()
    interrupt_and_check_exit(ros, node)
