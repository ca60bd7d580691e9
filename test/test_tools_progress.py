"""lingbot-ros-replay and lingbot-ros-offline show their progress as a user sees it: run as
subprocesses with a pseudo-terminal (a tqdm bar redrawn in place: position, rate, time left) and
with a pipe (plain lines, no carriage returns, the final one at 100%)."""
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from helpers import need_module, need_path

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, ROS_AUTOMATIC_DISCOVERY_RANGE="OFF", PYTHONPATH=str(REPO), COLUMNS="100")


def run_in_pty(argv: list[str], cwd: Path) -> tuple[int, str]:
    """The command with stdout and stderr on a pseudo-terminal; its exit code and all it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))   # a 120-column terminal
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=ENV, cwd=cwd)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:   # EIO: the child closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return proc.wait(120), b"".join(chunks).decode(errors="replace")


def run_in_pipe(argv: list[str], cwd: Path) -> tuple[int, str]:
    done = subprocess.run(argv, env=ENV, cwd=cwd, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def replay_argv(bag: Path) -> list[str]:
    return [sys.executable, "-m", "lingbot_ros.tools.replay", str(bag), "--duration", "2", "--rate", "10"]


def offline_argv(shared_dir: Path, out: Path) -> list[str]:
    fixture = shared_dir / "fixtures" / "tiny_default"
    return [sys.executable, "-m", "lingbot_ros.tools.offline", "--model-config", str(fixture / "config.json"),
            "--checkpoint", str(fixture / "ckpt.pt"), "--input", str(shared_dir / "data" / "loop_jpg"),
            "--output", str(out), "--device", "cpu", "--max-frames", "6", "--num-scale-frames", "3",
            "--scale-frames", "3", "--sliding-window", "4", "--image-width", "112"]


@pytest.fixture
def bag(shared_data):
    need_module("rclpy")
    return shared_data("courthouse_bag")


@pytest.fixture
def offline_inputs(shared_dir, shared_data):
    shared_data("loop_jpg")
    need_path(shared_dir / "fixtures" / "tiny_default" / "ckpt.pt", "tiny fixture")
    return shared_dir


@pytest.mark.ros
def test_replay_draws_a_bar_on_a_terminal(bag, tmp_path):
    code, output = run_in_pty(replay_argv(bag), tmp_path)
    assert code == 0, output
    assert "\r" in output   # redrawn in place
    # The last draw: the whole range, bag seconds played of the selection, elapsed < left, the rate.
    assert re.search(r"lingbot-ros-replay: 100%\|[^|]+\| 2\.0/2\.0 s \[\d\d:\d\d<00:00, +[\d.]+s/s\], 20 messages",
                     output), output[-2000:]


@pytest.mark.ros
def test_replay_writes_plain_lines_into_a_pipe(bag, tmp_path):
    code, output = run_in_pipe(replay_argv(bag), tmp_path)
    assert code == 0, output
    assert "\r" not in output
    assert re.search(r"^lingbot-ros-replay: 2\.0/2\.0 s \(100%\), +[\d.?]+s/s, elapsed \d\d:\d\d, ETA 00:00, "
                     r"20 messages$", output, re.M), output
    quiet = run_in_pipe(replay_argv(bag) + ["--quiet"], tmp_path)[1]
    assert "(100%)" not in quiet and "messages" not in quiet


def test_offline_draws_a_bar_on_a_terminal(offline_inputs, tmp_path):
    code, output = run_in_pty(offline_argv(offline_inputs, tmp_path / "out"), tmp_path)
    assert code == 0, output
    assert "\r" in output
    assert re.search(r"lingbot-ros-offline: 100%\|[^|]+\| 6/6 frame \[\d\d:\d\d<00:00, +[\d.?]+(frame/s|s/frame)\]",
                     output), output[-2000:]


def test_offline_writes_plain_lines_into_a_pipe(offline_inputs, tmp_path):
    code, output = run_in_pipe(offline_argv(offline_inputs, tmp_path / "out"), tmp_path)
    assert code == 0, output
    assert "\r" not in output
    assert re.search(r"^lingbot-ros-offline: 6/6 frame \(100%\), +[\d.?]+(frame/s|s/frame), elapsed \d\d:\d\d, "
                     r"ETA 00:00$", output, re.M), output


def test_a_terminal_that_reports_no_size_still_gets_a_bar():
    import io

    from lingbot_ros.tools.progress import Progress

    class Console(io.StringIO):   # a serial console: a terminal, no size
        def isatty(self):
            return True

    stream = Console()
    progress = Progress(4, "x", "frame", stream=stream)
    for done in range(1, 5):
        progress.update(done)
    progress.close()
    assert "| 4/4 frame [" in stream.getvalue()
