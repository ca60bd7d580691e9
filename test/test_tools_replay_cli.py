"""lingbot-ros-replay's refusals, run as a user would (subprocess, discovery off)."""
import os
import subprocess
import sys

import pytest

from helpers import need_module, need_path

need_module("rclpy", module_level=True)
pytestmark = pytest.mark.ros   # needs rclpy: runs on Jazzy too (.ci/run runs only `ros` there)


def run_replay(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ROS_AUTOMATIC_DISCOVERY_RANGE": "OFF"}
    return subprocess.run([sys.executable, "-m", "lingbot_ros.tools.replay", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_an_empty_time_range_fails_instead_of_looping_forever(shared_dir):
    bag = need_path(shared_dir / "data" / "courthouse_bag")
    done = run_replay(str(bag), "--start", "1000", "--loop")
    assert done.returncode == 2
    assert "no messages in the selected time range" in done.stderr


def test_waiting_for_subscribers_in_vain_is_announced(shared_dir):
    bag = need_path(shared_dir / "data" / "courthouse_bag")
    done = run_replay(str(bag), "--duration", "0.25", "--rate", "10", "--wait-for-subscribers", "0.5")
    assert done.returncode == 0, done.stderr
    assert "no subscriber on every topic after 0.5 s" in done.stderr


def test_a_folder_without_metadata_is_refused(tmp_path):
    done = run_replay(str(tmp_path))
    assert done.returncode == 2 and "is not a rosbag2" in done.stderr


def test_bad_pacing_and_qos_options_are_refused(tmp_path):
    for args, message in ((["--max-lead", "0"], "--max-lead must be >= 1"),
                          (["--node-timeout", "0"], "--node-timeout must be > 0"),
                          (["--hold", "-1"], "--hold must be >= 0"),
                          (["--qos-override", "/tf_static:=fast"], "--qos-override expects PRESET or TOPIC:=PRESET")):
        done = run_replay(str(tmp_path), *args)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)


def test_waiting_for_a_node_that_sends_no_status_fails(shared_dir):
    bag = need_path(shared_dir / "data" / "courthouse_bag")
    done = run_replay(str(bag), "--wait-for-node", "/nobody", "--node-timeout", "0.5")
    assert done.returncode == 1
    assert "no status on /nobody/status within 0.5 s" in done.stderr


def test_waiting_for_a_node_without_the_generated_interfaces_says_what_to_build(tmp_path):
    # A None entry in sys.modules makes `from lingbot_ros.msg import MapStatus` fail as it does
    # when the interfaces were never generated.
    code = ("import sys; sys.modules['lingbot_ros.msg'] = None; from lingbot_ros.tools.replay import main; "
            f"sys.exit(main([{str(tmp_path)!r}, '--wait-for-node', '/map_node']))")
    (tmp_path / "metadata.yaml").write_text("")
    env = {**os.environ, "ROS_AUTOMATIC_DISCOVERY_RANGE": "OFF"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "run scripts/setup.sh" in done.stderr, done.stderr


@pytest.mark.parametrize("args, message", [
    (["--camera", "front/left"], "--camera front/left: camera name 'front/left' must start with a letter"),
    (["--camera", "a", "--camera", "a"], "each camera once; repeated: a"),
    (["--camera", "a:="], "expects NAME or NAME:=TOPIC"),
    (["--camera", "a", "--camera", "b"], "several --camera for one bag: give each its image topic"),
    (["--camera", "a:=/nothing"], "--camera a:=/nothing: no image topic of that name in bag 1 "
                                  "(its image topics: /camera/image_raw/compressed)"),
    (["--camera", "a:=/camera/image_raw/compressed", "--camera", "b:=/camera/image_raw/compressed"],
     "--camera b: /camera/image_raw/compressed is already --camera a's"),
    (["--camera", "a", "--remap", "/camera/image_raw/compressed:=/x"], "that topic is --camera a's"),
])
def test_camera_options_that_cannot_work_are_refused(shared_dir, args, message):
    bag = need_path(shared_dir / "data" / "courthouse_bag")
    done = run_replay(str(bag), *args)
    assert done.returncode == 2 and message in done.stderr, (args, done.stderr)


def test_several_bags_need_one_camera_each_and_every_one_a_bag(shared_dir, tmp_path):
    bag = need_path(shared_dir / "data" / "courthouse_bag")
    done = run_replay(str(bag), str(bag), "--camera", "a")
    assert done.returncode == 2 and "2 bags and 1 --camera" in done.stderr, done.stderr
    done = run_replay(str(bag), str(tmp_path), "--camera", "a", "--camera", "b")
    assert done.returncode == 2 and f"{tmp_path} is not a rosbag2" in done.stderr, done.stderr
