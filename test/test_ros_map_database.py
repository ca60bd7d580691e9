"""map_node writing its map database over real DDS: after a bag replay, ~/save_map and a SIGINT,
lingbot-ros-map export gives the saved files byte for byte; a database it cannot write is a WARN
in /diagnostics and ~/status while every frame is still mapped."""
import subprocess
import sys

import pytest

from ros_harness import SaveMap, interrupt_and_check_exit
from ros_harness import ros, tiny  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.ros, pytest.mark.slow]
SETTINGS = ("process_all_frames:=true", "long_run_policy:=windowed", "window_size:=10", "overlap_size:=4",
            "min_confidence:=1.0")


def replay(ros, bag, frames: int):
    player = ros.start("replay", ["-m", "lingbot_ros.tools.replay", str(bag), "--rate", "4", "--duration",
                                  f"{frames / 10:.1f}", "--wait-for-subscribers", "20", "--wait-for-node",
                                  "/map_node", "--quiet"])
    assert player.wait(240) == 0, ros.output(player)
    return ros.wait(lambda: ros.settled_with(frames), f"{frames} frames processed", timeout=120)


def test_export_after_a_clean_stop_is_what_save_map_wrote(ros, tiny, tmp_path):  # noqa: F811
    fixture, bag = tiny
    database = tmp_path / "map.db"
    node = ros.start_node(fixture, *SETTINGS, f"map_database:={database}")
    ros.wait(lambda: ros.statuses, "the node's first status")
    replay(ros, bag, 24)
    saved = ros.call(SaveMap, "/map_node/save_map", SaveMap.Request(directory=str(tmp_path / "node")))
    assert saved.success, saved.message
    assert ros.diagnostic("map_database").startswith("writing run 1 to ")
    interrupt_and_check_exit(ros, node)
    tool = [sys.executable, "-m", "lingbot_ros.tools.map_db"]
    exported = subprocess.run(tool + ["export", str(database), str(tmp_path / "export")], capture_output=True,
                              text=True)
    assert exported.returncode == 0, exported.stderr
    for name in ("map.ply", "trajectory.tum", "windows.csv"):
        assert (tmp_path / "node" / name).read_bytes() == (tmp_path / "export" / name).read_bytes(), name
    info = subprocess.run(tool + ["info", str(database)], capture_output=True, text=True)
    assert "run 1: clean;" in info.stdout and "24 frames" in info.stdout, info.stdout


def test_a_database_it_cannot_write_is_a_warning_and_mapping_goes_on(ros, tiny, tmp_path):  # noqa: F811
    fixture, bag = tiny
    database = tmp_path / "corrupt.db"
    database.write_bytes(b"not a database" * 100)
    node = ros.start_node(fixture, *SETTINGS, f"map_database:={database}")
    ros.wait(lambda: ros.statuses, "the node's first status")
    status = replay(ros, bag, 12)
    assert "map database:" in status.state_text and "corrupt" in status.state_text, status.state_text
    ros.wait(lambda: ros.diagnostics and ros.diagnostics[-1].status[0].level == b"\x01"
             and "map database" in ros.diagnostics[-1].status[0].message, "the map database WARN")
    assert node.poll() is None
    interrupt_and_check_exit(ros, node)
    assert database.read_bytes() == b"not a database" * 100
