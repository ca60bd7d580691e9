"""A probe node for the lingbot-ros-replay tests: its own rclpy context in a random DDS domain,
spun by a background thread, plus the player as a subprocess in the same domain."""
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor

from ros_teardown import shut_down

REPO = Path(__file__).resolve().parents[1]


class Probe:
    def __init__(self, log_dir: Path, node_name: str = "probe"):
        # Domains 1..100: isolated from other test runs, and below the ids whose DDS ports fall
        # in Linux's ephemeral range.
        self.domain = 1 + (os.getpid() + time.time_ns() // 10**6) % 100
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, ROS_DOMAIN_ID=str(self.domain),
                        ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
                        FASTDDS_DEFAULT_PROFILES_FILE=str(REPO / "config" / "fastdds.xml"),
                        ROS_LOG_DIR=str(log_dir), PYTHONUNBUFFERED="1")
        # The probe's participant must use the same transports as the player.
        os.environ["FASTDDS_DEFAULT_PROFILES_FILE"] = self.env["FASTDDS_DEFAULT_PROFILES_FILE"]
        self.context = Context()
        rclpy.init(context=self.context, domain_id=self.domain)
        self.node = rclpy.create_node(node_name, context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()
        self.players: list[tuple[subprocess.Popen, Path]] = []

    def play(self, *args: str) -> subprocess.Popen:
        """Start lingbot-ros-replay with ``args``; its stdout and stderr go to one log."""
        log = self.log_dir / f"replay{len(self.players)}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "lingbot_ros.tools.replay", *args],
                                    env=self.env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        self.players.append((proc, log))
        return proc

    def output(self, proc: subprocess.Popen) -> str:
        return next(log for p, log in self.players if p is proc).read_text()

    def close(self) -> None:
        shut_down([proc for proc, _ in self.players], self.executor, self.thread, self.node, self.context)
