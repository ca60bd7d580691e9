"""The command-line front ends as a user meets them: lingbot-ros-node --help, the hint a failed
model build gives, and lingbot-ros-replay --subscriber waiting for the node that matters over
real DDS (a monitor that matched first must not start the playback)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import background_spin, need_module, need_path, shut_down, wait_until

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(REPO), ROS_AUTOMATIC_DISCOVERY_RANGE="OFF")


@pytest.mark.ros
def test_node_help_prints_usage_and_every_parameter_without_starting(tmp_path):
    need_module("rclpy")
    from lingbot_ros.ros import params

    done = subprocess.run([sys.executable, "-m", "lingbot_ros.ros.main", "--help"], env=ENV, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: lingbot-ros-node")
    for name, field in params.FIELDS.items():
        assert f"\n  {name} (default " in done.stdout, name
    assert "loaded model" not in done.stdout + done.stderr and not (tmp_path / "out").exists()
    from lingbot_ros.ros.main import help_text

    assert len(re.findall(r"^  \S+ \(default ", help_text(), re.M)) == len(params.FIELDS)


def test_a_checkpoint_of_another_architecture_gets_the_model_config_hint(shared_dir):
    from lingbot_ros.mapping import factory
    from lingbot_ros.mapping.settings import MapperSettings
    from lingbot_ros.model import CheckpointError

    fixtures = shared_dir / "fixtures"
    need_path(fixtures / "tiny_default" / "ckpt.pt", "tiny fixture")
    settings = MapperSettings(checkpoint=str(fixtures / "tiny_default" / "ckpt.pt"),
                              model_config=str(fixtures / "tiny_conv2d" / "config.json"), device="cpu")
    with pytest.raises(CheckpointError) as raised:
        factory.build(settings)
    hint = factory.failure_hint(raised.value, settings)
    assert "set model_config" in hint and "tiny_conv2d" in hint and "model_config:=" in hint
    assert "fused_blocks" not in hint and "Triton" not in hint


def test_the_fused_blocks_hint_only_for_a_kernel_build_failure():
    from lingbot_ros.mapping import factory
    from lingbot_ros.mapping.settings import MapperSettings

    build_error = type("BackendCompilerFailed", (RuntimeError,), {"__module__": "torch._dynamo.exc"})
    try:
        try:
            raise build_error("no C compiler")
        except RuntimeError as inner:
            raise RuntimeError("warm-up failed") from inner
    except RuntimeError as error:
        wrapped = error
    assert "fused_blocks:=false" in factory.failure_hint(wrapped, MapperSettings())
    assert factory.failure_hint(wrapped, MapperSettings(fused_blocks=False)) == ""
    assert factory.failure_hint(RuntimeError("CUDA out of memory"), MapperSettings()) == ""


def _replay(bag: Path, env: dict, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lingbot_ros.tools.replay", str(bag), "--quiet", *extra],
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.ros
def test_replay_subscriber_options_are_checked(shared_data):
    need_module("rclpy")
    bag = shared_data("courthouse_bag")
    done = _replay(bag, ENV, "--subscriber", "/map_node")
    assert done.returncode == 2 and "--subscriber needs --wait-for-subscribers" in done.stderr
    done = _replay(bag, ENV, "--duration", "0.25", "--rate", "10", "--wait-for-subscribers", "0.5",
                   "--subscriber", "/nobody")
    assert done.returncode == 0, done.stderr
    assert ("not every --subscriber is there after 0.5 s (/nobody (subscribes to none of the played topics))"
            in done.stderr), done.stderr


@pytest.fixture
def graph(tmp_path):
    """A context with a spun executor in a domain of its own, and the player's environment in it."""
    rclpy = need_module("rclpy")
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor

    domain = 1 + (os.getpid() + 7) % 100
    env = dict(ENV, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", ROS_LOG_DIR=str(tmp_path))
    context = Context()
    rclpy.init(context=context, domain_id=domain)
    executor = SingleThreadedExecutor(context=context)
    nodes = {name: rclpy.create_node(name, context=context) for name in ("monitor", "late_node")}
    for node in nodes.values():
        executor.add_node(node)
    spin = background_spin(executor)
    processes = []
    yield env, nodes, processes
    nodes["late_node"].destroy_node()
    shut_down(processes, spin, nodes["monitor"], context)


def _player_matched(monitor, topic: str) -> bool:
    return any(i.node_name == "lingbot_replay" for i in monitor.get_publishers_info_by_topic(topic))


@pytest.mark.ros
def test_replay_waits_for_the_named_node_not_for_the_first_subscriber(shared_data, graph):
    from sensor_msgs.msg import CompressedImage

    bag = shared_data("courthouse_bag")
    env, nodes, processes = graph
    monitor, late = nodes["monitor"], nodes["late_node"]
    topic = "/camera/image_raw/compressed"
    seen = {"monitor": [], "late": []}
    monitor.create_subscription(CompressedImage, topic, seen["monitor"].append, 100)
    proc = subprocess.Popen([sys.executable, "-m", "lingbot_ros.tools.replay", str(bag), "--quiet", "--duration",
                             "1", "--rate", "10", "--wait-for-subscribers", "60", "--subscriber", "/late_node"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    processes.append(proc)
    # The monitor has matched the player; only then does the node it waits for subscribe.
    wait_until(lambda: monitor.count_publishers(topic) > 0 and _player_matched(monitor, topic),
               "the player's publisher", 60)
    assert not seen["monitor"]   # nothing played while /late_node is not there
    late.create_subscription(CompressedImage, topic, seen["late"].append, 100)
    assert proc.wait(120) == 0, proc.stdout.read()
    wait_until(lambda: len(seen["late"]) == 10, "every message of the second at /late_node", 30)
    assert len(seen["monitor"]) == 10
    first = seen["late"][0].header.stamp
    assert (first.sec, first.nanosec) == (1_700_000_000, 0)   # the bag's first frame


@pytest.mark.ros
def test_replay_waits_for_the_named_topic_only(shared_data, graph):
    """--subscriber TOPIC: playback waits for a subscriber of that topic, and starts with it although
    /clock (played too, with --clock) has none, from the bag's first frame."""
    import time

    from sensor_msgs.msg import CompressedImage

    bag = shared_data("courthouse_bag")
    env, nodes, processes = graph
    monitor, late = nodes["monitor"], nodes["late_node"]
    topic = "/camera/image_raw/compressed"
    images = []
    proc = subprocess.Popen([sys.executable, "-m", "lingbot_ros.tools.replay", str(bag), "--quiet", "--duration",
                             "1", "--rate", "10", "--clock", "--wait-for-subscribers", "60", "--subscriber", topic],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    processes.append(proc)
    wait_until(lambda: _player_matched(monitor, topic) and _player_matched(monitor, "/clock"),
               "the player's publishers", 60)
    time.sleep(1.0)
    assert proc.poll() is None   # no subscriber of the named topic yet: still waiting
    late.create_subscription(CompressedImage, topic, images.append, 100)
    # Well inside the 60 s wait: a wait for every played topic would still be waiting for /clock.
    assert proc.wait(30) == 0
    output = proc.stdout.read()
    assert "not every" not in output, output
    wait_until(lambda: len(images) == 10, "every message of the second on the named topic", 30)
    first = images[0].header.stamp
    assert (first.sec, first.nanosec) == (1_700_000_000, 0)
