"""lingbot-ros-replay's refusals, run as a user would (subprocess, discovery off)."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("rclpy")


def run_replay(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ROS_AUTOMATIC_DISCOVERY_RANGE": "OFF"}
    return subprocess.run([sys.executable, "-m", "lingbot_ros.tools.replay", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_an_empty_time_range_fails_instead_of_looping_forever(shared_dir):
    bag = shared_dir / "data" / "courthouse_bag"
    if not bag.is_dir():
        pytest.skip(f"{bag} is absent")
    done = run_replay(str(bag), "--start", "1000", "--loop")
    assert done.returncode == 2
    assert "no messages in the selected time range" in done.stderr


def test_waiting_for_subscribers_in_vain_is_announced(shared_dir):
    bag = shared_dir / "data" / "courthouse_bag"
    if not bag.is_dir():
        pytest.skip(f"{bag} is absent")
    done = run_replay(str(bag), "--duration", "0.25", "--rate", "10", "--wait-for-subscribers", "0.5")
    assert done.returncode == 0, done.stderr
    assert "no subscriber on every topic after 0.5 s" in done.stderr


def test_a_folder_without_metadata_is_refused(tmp_path):
    done = run_replay(str(tmp_path))
    assert done.returncode == 2 and "is not a rosbag2" in done.stderr
