"""map_node's lifecycle over real DDS: repeated cycles with a failing activate, and shutdown by
SIGINT / SIGTERM in every state, the node a subprocess driven through its lifecycle services."""
import signal

import pytest
from lifecycle_msgs.msg import Transition

from helpers import BAG_TOPIC, TIMEOUT, MapStatus, courthouse_jpegs, jpeg_message, string_parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy

pytestmark = [pytest.mark.ros, pytest.mark.slow]
T = Transition


class Camera:
    """The probe as a camera: courthouse frames (518x294, another aspect than the warm-up's
    640x480) on the bag's topic, reliable, stamped 0.1 s apart and never going back."""

    def __init__(self, ros, shared_dir):
        self.ros, self.jpegs = ros, courthouse_jpegs(shared_dir, 40)
        self.publisher = ros.node.create_publisher(
            type(jpeg_message(b"", 0.0)), BAG_TOPIC, QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
        self.sent = 0

    def send(self, count: int) -> None:
        ros = self.ros
        ros.wait(self.publisher.get_subscription_count, "the node's image subscription")
        for _ in range(count):
            self.publisher.publish(jpeg_message(self.jpegs[self.sent % len(self.jpegs)], 100 + 0.1 * self.sent))
            self.sent += 1


def test_lifecycle_cycles_resume_exactly_and_release_everything(ros, tiny, shared_dir):
    fixture, _ = tiny
    node = ros.start_node(fixture, "process_all_frames:=true", "warmup:=true", "warmup_image_size:=640x480",
                          "max_stamp_gap_s:=0.0", "long_run_policy:=none", "diagnostics_period_s:=0.2",
                          autostart=False)
    camera = Camera(ros, shared_dir)

    def one_of_each(what: str):
        for topic in ("/map_node/pose", "/map_node/status", "/map_node/depth/image", "/diagnostics"):
            assert ros.node.count_publishers(topic) == 1, f"{what}: {ros.node.count_publishers(topic)} on {topic}"
        ros.wait(lambda: ros.diagnostic("worker_threads") == "1" and ros.diagnostic("map_builder_threads") == "1",
                 f"{what}: one worker and one map builder thread")

    def processed(count: int) -> MapStatus:
        return ros.wait(lambda: ros.settled_with(count), f"{count} frames processed")

    for cycle in range(3):
        ros.transition(T.TRANSITION_CONFIGURE, "inactive")
        ros.statuses.clear()
        one_of_each(f"cycle {cycle}, configured")
        ros.transition(T.TRANSITION_ACTIVATE, "active")
        camera.send(5)
        first = processed(5)
        assert first.keyframes == 5 and first.restarts == 0 and first.state == MapStatus.STATE_TRACKING
        poses_before = len(ros.poses)

        ros.transition(T.TRANSITION_DEACTIVATE, "inactive")
        paused = ros.wait(lambda: ros.statuses and ros.statuses[-1].state_text.startswith("inactive")
                          and ros.statuses[-1], "an inactive status")
        assert "paused" in paused.state_text
        if cycle == 1:
            # A failing activate: process_all_frames cannot keep its promise over best effort. The
            # node stays inactive with nothing created, and activates once the value is fixed.
            ros.set_parameter(string_parameter("image_qos", "best_effort"))
            ros.transition(T.TRANSITION_ACTIVATE, "inactive", succeeds=False)
            assert "set image_qos to auto or reliable" in ros.output(node)
            one_of_each("after the failed activate")
            ros.set_parameter(string_parameter("image_qos", "auto"))

        ros.transition(T.TRANSITION_ACTIVATE, "active")
        camera.send(4)
        resumed = processed(9)
        # No warm-up, no restart: the stream went on where it stopped.
        assert resumed.keyframes == 9 and resumed.restarts == 0, resumed.state_text
        stamps = ros.pose_stamps(4, start=poses_before)
        assert len(stamps) == 4 and stamps == sorted(stamps)
        one_of_each(f"cycle {cycle}, active again")

        ros.transition(T.TRANSITION_DEACTIVATE, "inactive")
        ros.transition(T.TRANSITION_CLEANUP, "unconfigured")
        ros.wait(lambda: ros.node.count_publishers("/map_node/pose") == 0, "the publishers gone at cleanup")
    assert "Traceback" not in ros.output(node)
    node.send_signal(signal.SIGINT)
    assert node.wait(TIMEOUT) == 0


STATES = ("unconfigured", "inactive", "active", "initialising", "inference")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("state", STATES)
def test_a_signal_in_every_state_exits_0_without_a_traceback(ros, tiny, shared_dir, state, signum):
    fixture, _ = tiny
    node = ros.start_node(fixture, "process_all_frames:=true", "num_scale_frames:=3", autostart=False)
    assert ros.state() == "unconfigured"      # the node is up (a signal before that is not ours)
    if state != "unconfigured":
        ros.transition(T.TRANSITION_CONFIGURE, "inactive")
    if state in ("active", "initialising", "inference"):
        ros.transition(T.TRANSITION_ACTIVATE, "active")
    camera = Camera(ros, shared_dir)
    if state == "initialising":
        camera.send(2)
        ros.wait(lambda: ros.statuses and ros.statuses[-1].init_frames == 2, "2 of 3 scale frames buffered")
    if state == "inference":
        camera.send(30)          # a queue of frames: the signal lands while the model runs
        ros.wait(lambda: ros.statuses and ros.statuses[-1].frames_processed >= 4, "tracking under way")
    node.send_signal(signum)
    assert node.wait(TIMEOUT) == 0, ros.output(node)[-3000:]
    output = ros.output(node)
    assert "Traceback" not in output and "RCLError" not in output, output[-3000:]
