"""Every command-line tool ends on SIGINT / SIGTERM with exit 0 and no traceback, in every phase
(process/interrupts.py): each runs as a subprocess, the test waits for a line of its output (or its
opening the database) that says which phase it is in, then sends the signal. lingbot-ros-offline
saves what it processed so far, all files or none, and says how many frames."""
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO, free_port, wait_until
from lingbot_ros.mapping.files.export import read_ply

TIMEOUT = 120.0   # the tools start torch and a model on a shared 2-core machine
SHUTDOWN_NOISE = ("Traceback", "never retrieved", "Task was destroyed")


class Tool:
    """``python -m MODULE ARGS`` with its stdout and stderr in one log."""

    def __init__(self, log: Path, args: list[str], env: dict | None = None):
        self.log = log
        environment = dict(env or os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        with open(log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT,
                                         env=environment, cwd=REPO)

    def output(self) -> str:
        return self.log.read_text()

    def wait_for(self, text: str) -> None:
        wait_until(lambda: text in self.output() or self.proc.poll() is not None, repr(text), TIMEOUT,
                   details=self.output)
        assert text in self.output(), f"it ended (exit {self.proc.poll()}) before {text!r}:\n{self.output()[-3000:]}"

    def stop(self, signum: int) -> str:
        """Send ``signum``; the tool must end with exit 0 and none of SHUTDOWN_NOISE. Returns its output."""
        self.proc.send_signal(signum)
        try:
            code = self.proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"still running {TIMEOUT:.0f} s after the signal:\n{self.output()[-3000:]}")
        out = self.output()
        assert code == 0, out[-3000:]
        for noise in SHUTDOWN_NOISE:
            assert noise not in out, out[-3000:]
        return out


def _stopped(out: str, signum: int) -> str:
    """The text after '<tool>: stopped by SIGxxx' (the line interrupts.run prints)."""
    match = re.search(rf"stopped by {signal.Signals(signum).name}(.*)", out)
    assert match, out[-3000:]
    return match.group(1)


def _temporaries(directory: Path) -> list[str]:
    return [str(p) for p in directory.rglob("*") if p.name.endswith((".tmp", ".old"))]


@pytest.fixture
def tiny_model(fixture_files) -> list[str]:
    return ["--checkpoint", fixture_files["checkpoint"], "--model-config", fixture_files["model_config"],
            "--device", "cpu", "--num-scale-frames", "3", "--sliding-window", "4", "--map-database", ""]


def test_offline_stopped_while_warming_up_writes_nothing(tmp_path, tiny_model):
    out = tmp_path / "out"
    tool = Tool(tmp_path / "offline.log", ["lingbot_ros.tools.offline", "--input", "synthetic:160x120",
                                           "--max-frames", "50", "--output", str(out), *tiny_model,
                                           "--image-width", "518", "--warmup"])
    tool.wait_for("lingbot-ros-offline: warming up on")
    assert _stopped(tool.stop(signal.SIGTERM), signal.SIGTERM) == ": before the first frame: nothing was written"
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_offline_stopped_while_processing_saves_exactly_the_frames_it_reports(tmp_path, tiny_model, signum):
    out = tmp_path / "out"
    tool = Tool(tmp_path / "offline.log", ["lingbot_ros.tools.offline", "--input", "synthetic:160x120",
                                           "--max-frames", "500", "--output", str(out), *tiny_model,
                                           "--image-width", "112", "--no-warmup"])
    tool.wait_for("lingbot-ros-offline: 1/500 frame")   # the first progress line: one frame given to the model
    text = tool.stop(signum)
    saved = int(re.search(r"stopped by \w+: saved the (\d+) frames processed so far", text).group(1))
    assert 1 <= saved < 500 and f"frames: {saved} (" in text
    rows = (out / "frames.csv").read_text().splitlines()
    assert rows[0].startswith("index,stamp_s") and len(rows) == saved + 1
    assert [int(row.split(",")[0]) for row in rows[1:]] == list(range(saved))
    assert sorted(p.name for p in (out / "depth").iterdir()) == [f"{i:06d}.png" for i in range(saved)]
    assert len(np.loadtxt(out / "trajectory.tum", ndmin=2)) == saved
    xyz, _ = read_ply(out / "map.ply")   # complete: read_ply checks the vertex count against the bytes
    assert len(xyz) > 0 and np.isfinite(xyz).all()
    assert (out / "preview.png").read_bytes()[:4] == b"\x89PNG" and _temporaries(out) == []


def test_offline_with_the_live_view_stopped_while_processing_ends(tmp_path, tiny_model):
    """A run with --viewer stopped by a signal saves and ends: the page is not served after it
    (every later signal is ignored, so it would be served until a kill)."""
    tool = Tool(tmp_path / "offline.log", ["lingbot_ros.tools.offline", "--input", "synthetic:160x120",
                                           "--max-frames", "500", "--output", str(tmp_path / "out"), *tiny_model,
                                           "--image-width", "112", "--no-warmup", "--viewer", str(free_port())])
    tool.wait_for("lingbot-ros-offline: 1/500 frame")
    text = tool.stop(signal.SIGINT)
    assert "saved the" in text and "lingbot-ros-offline: live view closed: stopped by SIGINT" in text
    assert "(Ctrl-C to stop)" not in text


def test_fixture_stopped_while_running_writes_no_output(tmp_path, fixture_files):
    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "config.json").write_bytes(Path(fixture_files["model_config"]).read_bytes())
    (reference / "ckpt.pt").write_text(fixture_files["checkpoint"])   # a pointer file
    np.save(reference / "frames.npy", np.random.default_rng(0).random((300, 3, 84, 112), dtype=np.float32))
    result = tmp_path / "result" / "out.npz"
    tool = Tool(tmp_path / "fixture.log", ["lingbot_ros.tools.fixture", str(reference), str(result)])
    tool.wait_for("frame 1/300")
    _stopped(tool.stop(signal.SIGINT), signal.SIGINT)
    assert not result.exists() and _temporaries(tmp_path) == []


def test_prebuild_stopped_while_warming_up(tmp_path):
    tool = Tool(tmp_path / "prebuild.log", ["lingbot_ros.tools.prebuild", "--device", "cpu", "--model-config",
                                            "tiny", "--image-width", "518", "--warmup-image-size", "640x480"])
    tool.wait_for("[prebuild] warm-up on")
    out = tool.stop(signal.SIGTERM)
    _stopped(out, signal.SIGTERM)
    assert "[prebuild] done" not in out


def test_map_stopped_while_reading_a_database_writes_nothing(tmp_path):
    database = tmp_path / "big.db"
    subprocess.run([sys.executable, str(REPO / "test" / "map_db_writer.py"), str(database), "0.5", "3000"],
                   check=True, capture_output=True)
    exported = tmp_path / "export"
    tool = Tool(tmp_path / "map.log", ["lingbot_ros.tools.map_db", "export", str(database), str(exported)])

    def opened() -> bool:   # the tool has the database open: past the start-up, reading the run
        try:
            return any(os.readlink(link) == str(database) for link in Path(f"/proc/{tool.proc.pid}/fd").iterdir())
        except OSError:   # a descriptor closed while listed
            return False
    wait_until(opened, "the tool opening the database", TIMEOUT, details=tool.output)
    _stopped(tool.stop(signal.SIGINT), signal.SIGINT)
    assert not exported.exists() or sorted(p.name for p in exported.iterdir()) == []


@pytest.mark.parametrize("phase", ["starting", "playing"])
def test_demo_stopped_while_starting_or_playing(ros, tmp_path, phase):
    demo = ros.start("demo", ["-m", "lingbot_ros.tools.run_demo", "--source", "synthetic:160x120", "--frames",
                              "500", "--rate", "5", "--out", str(tmp_path / "demo")])
    # The first line comes before the node configures (loads the model); the progress line's
    # "received" once frames flow.
    wait_until(lambda: ("received" if phase == "playing" else "lingbot-ros-demo: source") in ros.output(demo),
               f"the demo {phase}", TIMEOUT, details=lambda: ros.output(demo))
    signum = signal.SIGINT if phase == "starting" else signal.SIGTERM
    demo.send_signal(signum)
    assert demo.wait(TIMEOUT) == 0, ros.output(demo)[-3000:]
    out = ros.output(demo)
    for noise in SHUTDOWN_NOISE:
        assert noise not in out, out[-3000:]
    _stopped(out, signum)


@pytest.mark.parametrize("phase", ["warming up", "mapping"])
def test_node_stopped_while_warming_up_or_mapping(ros, tiny, phase):
    fixture, bag = tiny
    if phase == "warming up":
        node = ros.start_node(fixture, "warmup:=true", "image_width:=518")
        wait_until(lambda: "warming up on" in ros.output(node), "the warm-up", TIMEOUT,
                   details=lambda: ros.output(node))
        signum = signal.SIGTERM
    else:
        node = ros.start_node(fixture)
        ros.replay(bag)
        ros.wait(lambda: ros.statuses and ros.statuses[-1].frames_processed > 0, "frames processed")
        signum = signal.SIGINT
    node.send_signal(signum)
    assert node.wait(TIMEOUT) == 0, ros.output(node)[-3000:]
    out = ros.output(node)
    for noise in SHUTDOWN_NOISE:
        assert noise not in out, out[-3000:]
    if phase == "warming up":
        _stopped(out, signum)
    else:
        assert f"{signal.Signals(signum).name}: shutting down" in out
