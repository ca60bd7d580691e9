"""Bag replay into map_node over real DDS: lossless at any rate with process_all_frames, and the
node's saved trajectory and map equal the offline tool's on the same frames (one pipeline)."""
import subprocess
import sys

import pytest

from helpers import BAG_START_NS, TIMEOUT, SaveMap, interrupt_and_check_exit

pytestmark = [pytest.mark.ros, pytest.mark.slow]
BAG_FRAMES = 286


@pytest.mark.parametrize("rate, extra, frames", [
    ("1", ("--duration", "5"), 50),
    ("4", (), BAG_FRAMES),                                   # keep-all reliable alone keeps every frame
    ("20", ("--wait-for-node", "/map_node", "--max-lead", "10"), BAG_FRAMES),   # and the player waits
])
def test_process_all_frames_loses_nothing_at_any_rate(ros, tiny, rate, extra, frames):
    fixture, bag = tiny
    node = ros.start_node(fixture, "process_all_frames:=true", "max_stamp_gap_s:=0.0")
    ros.wait(lambda: ros.statuses, "the node's first status")
    replay = ros.start("replay", ["-m", "lingbot_ros.tools.replay", str(bag), "--rate", rate,
                                  "--wait-for-subscribers", "20", "--quiet", *extra])
    assert replay.wait(240) == 0, ros.output(replay)
    status = ros.wait(lambda: ros.settled_with(frames), f"all {frames} frames processed", timeout=240)
    assert status.frames_received == frames and status.frames_dropped == 0 and status.frames_rejected == 0
    assert ros.pose_stamps(frames) == [BAG_START_NS + k * 10**8 for k in range(frames)]
    interrupt_and_check_exit(ros, node)


COMMON = {"num_scale_frames": "3", "sliding_window": "4", "image_width": "112", "device": "cpu",
          "min_confidence": "1.0", "map_voxel_size_m": "0.05"}


@pytest.mark.parametrize("policy", [
    {"long_run_policy": "reset"},
    {"long_run_policy": "windowed", "window_size": "10", "overlap_size": "4"},
], ids=["stream", "windowed"])
def test_the_node_saves_what_the_offline_tool_writes(ros, tiny, tmp_path, policy):
    fixture, bag = tiny
    settings = {**COMMON, **policy}
    node = ros.start_node(fixture, "process_all_frames:=true", *(f"{k}:={v}" for k, v in settings.items()))
    ros.wait(lambda: ros.statuses, "the node's first status")
    replay = ros.start("replay", ["-m", "lingbot_ros.tools.replay", str(bag), "--rate", "4", "--duration", "3.2",
                                  "--wait-for-subscribers", "20", "--wait-for-node", "/map_node", "--quiet"])
    assert replay.wait(240) == 0, ros.output(replay)
    ros.wait(lambda: ros.settled_with(32), "32 frames processed", timeout=120)
    saved = ros.call(SaveMap, "/map_node/save_map", SaveMap.Request(directory=str(tmp_path / "node")))
    assert saved.success, saved.message

    flags = [a for k, v in settings.items() for a in (f"--{k.replace('_', '-')}", v)]
    offline = subprocess.run([sys.executable, "-m", "lingbot_ros.tools.offline", "--input", str(bag),
                              "--output", str(tmp_path / "offline"), "--checkpoint", str(fixture / "ckpt.pt"),
                              "--model-config", str(fixture / "config.json"), "--max-frames", "32", *flags],
                             capture_output=True, text=True, timeout=TIMEOUT * 8)
    assert offline.returncode == 0, offline.stderr
    names = ["trajectory.tum", "map.ply"] + (["windows.csv"] if policy["long_run_policy"] == "windowed" else [])
    for name in names:
        assert (tmp_path / "node" / name).read_bytes() == (tmp_path / "offline" / name).read_bytes(), name
    assert len((tmp_path / "node" / "trajectory.tum").read_text().splitlines()) == 32
    interrupt_and_check_exit(ros, node)
