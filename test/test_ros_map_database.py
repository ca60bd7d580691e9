"""map_node writing its map database over real DDS: after a bag replay, ~/save_map and a SIGINT,
lingbot-ros-map export gives the saved files byte for byte; a database it cannot write is a WARN
in /diagnostics and ~/status while every frame is still mapped."""
import subprocess
import sys

import pycolmap
import pytest

from helpers import SaveMap, interrupt_and_check_exit
from lingbot_ros.mapping.files.export import read_ply

pytestmark = [pytest.mark.ros, pytest.mark.slow]
SETTINGS = ("process_all_frames:=true", "long_run_policy:=windowed", "window_size:=10", "overlap_size:=4",
            "min_confidence:=1.0")


def replay(ros, bag, frames: int):
    player = ros.start("replay", ["-m", "lingbot_ros.tools.replay", str(bag), "--rate", "4", "--duration",
                                  f"{frames / 10:.1f}", "--wait-for-subscribers", "20", "--wait-for-node",
                                  "/map_node", "--quiet"])
    assert player.wait(240) == 0, ros.output(player)
    return ros.wait(lambda: ros.settled_with(frames), f"{frames} frames processed", timeout=120)


def test_export_after_a_clean_stop_is_what_save_map_wrote(ros, tiny, tmp_path):
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
    # The node stored its keyframes' images: the COLMAP export of the run, read by COLMAP's own reader.
    colmap = subprocess.run(tool + ["export", "--format", "colmap", str(database), str(tmp_path / "colmap")],
                            capture_output=True, text=True)
    assert colmap.returncode == 0, colmap.stderr
    model = pycolmap.Reconstruction(str(tmp_path / "colmap" / "sparse" / "0"))
    keyframes = int(info.stdout.split(" keyframes)")[0].rsplit("(", 1)[1])
    assert len(model.images) == keyframes > 0
    assert len(model.points3D) == len(read_ply(tmp_path / "node" / "map.ply")[0])
    for image in model.images.values():
        assert (tmp_path / "colmap" / "images" / image.name).stat().st_size > 0


def test_a_database_it_cannot_write_is_a_warning_and_mapping_goes_on(ros, tiny, tmp_path):
    fixture, bag = tiny
    database = tmp_path / "corrupt.db"
    database.write_bytes(b"not a database" * 100)
    # Never STALE: on a loaded machine the first tick after the replay can come 3 s after its last
    # image, and STALE outranks the WARN looked for here.
    node = ros.start_node(fixture, *SETTINGS, f"map_database:={database}", "stale_after_s:=0.0")
    ros.wait(lambda: ros.statuses, "the node's first status")
    status = replay(ros, bag, 12)
    assert "map database:" in status.state_text and "corrupt" in status.state_text, status.state_text
    ros.wait(lambda: ros.diagnostics and ros.diagnostics[-1].status[0].level == b"\x01"
             and "map database" in ros.diagnostics[-1].status[0].message, "the map database WARN")
    assert node.poll() is None
    interrupt_and_check_exit(ros, node)
    assert database.read_bytes() == b"not a database" * 100


def reference_run(fixture, bag, stop: int, count: int, directory):
    """The same frames through one in-process Mapper with ~/new_window at ``stop``, saved mid-stream
    as ~/save_map saves (the node equals the offline pipeline: test_ros_replay.py)."""
    from lingbot_ros.io.sources import open_source
    from lingbot_ros.mapping import factory
    from lingbot_ros.mapping.mapper import Mapper
    from lingbot_ros.mapping.records import InputFrame
    from lingbot_ros.mapping.settings import MapperSettings

    settings = MapperSettings(checkpoint=str(fixture / "ckpt.pt"), model_config=str(fixture / "config.json"),
                              device="cpu", image_width=112, num_scale_frames=3, sliding_window=4, warmup=False,
                              long_run_policy="windowed", window_size=10, overlap_size=4, min_confidence=1.0,
                              map_database="")
    mapper = Mapper(settings, factory.build(settings))
    for number, item in zip(range(count), open_source(str(bag))):
        if number == stop:
            mapper.new_window()
        mapper.process(InputFrame(rgb=item.rgb, stamp_ns=item.stamp_ns))
    mapper.save(directory)
    mapper.close()


def restart_with_resume(ros, fixture, database, expected: str):
    ros.statuses.clear()
    node = ros.start_node(fixture, *SETTINGS, f"map_database:={database}", "resume:=true")
    ros.wait(lambda: ros.statuses and expected in ros.statuses[-1].state_text, f"status '{expected}'")
    return node


def test_a_restart_with_resume_continues_as_a_new_window_would(ros, tiny, tmp_path):
    fixture, bag = tiny
    database = tmp_path / "map.db"
    node = ros.start_node(fixture, *SETTINGS, f"map_database:={database}")
    ros.wait(lambda: ros.statuses, "the node's first status")
    replay(ros, bag, 24)   # frames 0-23: window 3's frames 20-23 are final (window 10, overlap 4)
    interrupt_and_check_exit(ros, node)
    node = restart_with_resume(ros, fixture, database, "resumed run 1 (clean) at frame 24")
    player = ros.start("replay", ["-m", "lingbot_ros.tools.replay", str(bag), "--rate", "4", "--start", "2.35",
                                  "--duration", "1.6", "--wait-for-subscribers", "20", "--wait-for-node",
                                  "/map_node", "--quiet"])
    assert player.wait(240) == 0, ros.output(player)
    ros.wait(lambda: ros.settled_with(16), "frames 24-39 processed", timeout=120)
    saved = ros.call(SaveMap, "/map_node/save_map", SaveMap.Request(directory=str(tmp_path / "node")))
    assert saved.success, saved.message
    interrupt_and_check_exit(ros, node)
    reference_run(fixture, bag, 24, 40, tmp_path / "reference")
    for name in ("map.ply", "trajectory.tum", "windows.csv"):
        assert (tmp_path / "node" / name).read_bytes() == (tmp_path / "reference" / name).read_bytes(), name


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill_9_at_a_random_frame_then_resume_loses_nothing_committed(ros, tiny, tmp_path, seed):
    import random
    import signal
    import sqlite3

    from lingbot_ros.mapping.database import schema as mdb
    from lingbot_ros.mapping.database import run_info

    fixture, bag = tiny
    database = tmp_path / "map.db"
    node = ros.start_node(fixture, *SETTINGS, f"map_database:={database}", "map_database_commit_s:=0.2",
                          "map_database_continuation_s:=0.5")
    ros.wait(lambda: ros.statuses, "the node's first status")
    player = ros.start("replay", ["-m", "lingbot_ros.tools.replay", str(bag), "--rate", "4", "--duration", "4.0",
                                  "--wait-for-subscribers", "20", "--wait-for-node", "/map_node", "--quiet"])
    kill_at = random.Random(seed).randint(8, 30)   # past the first continuation, committed
    ros.wait(lambda: ros.statuses and ros.statuses[-1].frames_processed >= kill_at, f"frame {kill_at}", 120)
    node.send_signal(signal.SIGKILL)
    node.wait()
    player.kill()
    player.wait()
    conn = sqlite3.connect(database)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    keys = [row[0] for row in conn.execute("SELECT idx FROM frames ORDER BY idx")]
    conn.close()
    assert keys and keys == list(range(len(keys))), "the committed frames are not a prefix of the stream"
    stored = len(keys)
    # Its first continuation was stored once window 0 had placed overlap_size frames (phase 1 of
    # 3 frames, then one more), the later ones at most every 0.5 s.
    node = restart_with_resume(ros, fixture, database, f"resumed run 1 (crashed) at frame {stored}: window ")
    assert "aligns to its stored frames" in ros.statuses[-1].state_text
    player = ros.start("replay", ["-m", "lingbot_ros.tools.replay", str(bag), "--rate", "4",
                                  "--start", f"{stored / 10 - 0.05:.2f}", "--duration", f"{(40 - stored) / 10:.1f}",
                                  "--wait-for-subscribers", "20", "--wait-for-node", "/map_node", "--quiet"])
    assert player.wait(240) == 0, ros.output(player)
    ros.wait(lambda: ros.settled_with(40 - stored), f"frames {stored}-39 processed", timeout=120)
    assert any(f"resumed run 1 (crashed) at frame {stored}, window" in s.state_text and
               "aligned with overlap error" in s.state_text for s in ros.statuses)
    saved = ros.call(SaveMap, "/map_node/save_map", SaveMap.Request(directory=str(tmp_path / "node")))
    assert saved.success, saved.message
    interrupt_and_check_exit(ros, node)
    stamps = [line.split()[0] for line in (tmp_path / "node" / "trajectory.tum").read_text().splitlines()]
    assert stamps == [f"{1_700_000_000 + k / 10:.6f}" for k in range(40)]   # every frame once, in order
    conn = mdb.connect(database, readonly=True)
    # The resumed run took run 1's records over (moved, not copied): one run holds the map.
    assert [(r.id, r.ending, r.frames) for r in run_info.runs(conn)] == [(2, mdb.CLEAN, 40)]
