"""lingbot-ros-demo with a camera rig (--cameras, issue 29 item 4): the demo as a subprocess over
DDS (tiny random model, CPU) maps two real sequences as two cameras; the saved files are read
back. Its refusals of rig flags come before the node starts."""
import re

import numpy as np
import pytest

from helpers import need_module  # noqa: I001 (before the ROS imports it guards)

need_module("rclpy", module_level=True)
from lingbot_ros.mapping.files.export import read_ply, read_tum  # noqa: E402
from lingbot_ros.tools import run_demo  # noqa: E402

FRAMES = 8


def path_length(trajectory) -> float:
    positions = trajectory.poses()[:, :3, 3]
    return float(np.linalg.norm(np.diff(positions, axis=0), axis=1).sum())


@pytest.mark.ros
@pytest.mark.slow
def test_two_cameras_by_default_courthouse_and_loop_one_saved_map(ros, tmp_path, shared_data):
    courthouse, loop = shared_data("courthouse_jpg"), shared_data("loop_jpg")
    out = tmp_path / "out"
    demo = ros.start("demo", ["-m", "lingbot_ros.tools.run_demo", "--cameras", "front,back", "--frames", str(FRAMES),
                              "--rate", "20", "--out", str(out)])
    assert demo.wait(300) == 0, ros.output(demo)[-3000:]
    output = ros.output(demo)
    lines = output.splitlines()

    # The rig's default sources: the two real sequences, in the cameras' order.
    first = next(line for line in lines if line.startswith("lingbot-ros-demo: cameras"))
    assert f"front: folder {courthouse} " in first and f"back: folder {loop} " in first, first
    assert "active: listening on /map_node/front/image, /map_node/back/image" in output, output[-3000:]
    # The progress counts both cameras' frames and shows each camera.
    assert re.search(rf"{2 * FRAMES}/{2 * FRAMES} frame .*cameras: front \(primary\) \w+, {FRAMES} processed; "
                     rf"back \w+, {FRAMES} processed", output), output[-3000:]
    summary = next(line for line in lines if line.startswith("summary:"))
    assert summary.startswith(f"summary: {2 * FRAMES} frames of 2 cameras (front, back) processed"), summary
    assert f"{2 * FRAMES} received, 0 dropped, 0 rejected, 0 failed" in summary, summary
    front_line = next(line for line in lines if line.startswith("  camera front:"))
    back_line = next(line for line in lines if line.startswith("  camera back:"))
    assert f"{FRAMES} frames of folder {courthouse} " in front_line and f"{FRAMES} processed, 0 failed" in front_line
    assert front_line.endswith("the map's scale (primary)"), front_line
    assert f"{FRAMES} frames of folder {loop} " in back_line and f"{FRAMES} processed, 0 failed" in back_line
    scale = re.search(r"scale against front: ([0-9.e+-]+) from (\d+) base poses matched by stamp", back_line)
    assert scale and int(scale.group(2)) == FRAMES, back_line

    # The saved files, read back: one map, one trajectory per camera (and the rig's map database beside them).
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(("windows_", "map.db-"))) == [
        "map.db", "map.ply", "preview.png", "trajectory_back.tum", "trajectory_front.tum"]
    saved = next(line for line in lines if line.startswith("saved:"))
    xyz, rgb = read_ply(out / "map.ply")
    assert f"wrote {len(xyz)} points to {out / 'map.ply'}" in saved and len(xyz) > 0 and len(rgb) == len(xyz)
    assert np.isfinite(xyz).all()
    front, back = read_tum(out / "trajectory_front.tum"), read_tum(out / "trajectory_back.tum")
    assert len(front) == len(back) == FRAMES
    # One stamp per tick for every camera: each of the node's groups held both cameras.
    assert (front.stamps_ns() == back.stamps_ns()).all() and (np.diff(front.stamps_ns()) > 0).all()
    # The back camera's trajectory is saved at the primary's scale: over the same stamps, its path
    # is as long as the front camera's (the scale is the ratio of the two paths).
    assert path_length(back) == pytest.approx(path_length(front), rel=1e-4)
    assert "note: random-weight model" in output


@pytest.mark.ros
@pytest.mark.slow
def test_one_sequence_on_both_cameras_the_primary_chosen(ros, tmp_path, shared_data):
    """The same frames on both cameras (--source twice), back the primary: front's scale against
    it is 1 and the two saved trajectories are one."""
    loop = shared_data("loop_jpg")
    out = tmp_path / "out"
    demo = ros.start("demo", ["-m", "lingbot_ros.tools.run_demo", "--cameras", "front,back", "--primary-camera", "back",
                              "--source", str(loop), "--source", str(loop), "--frames", str(FRAMES), "--rate", "20",
                              "--out", str(out)])
    assert demo.wait(300) == 0, ros.output(demo)[-3000:]
    lines = ros.output(demo).splitlines()
    assert next(line for line in lines if line.startswith("  camera back:")).endswith("the map's scale (primary)")
    front_line = next(line for line in lines if line.startswith("  camera front:"))
    scale = re.search(r"scale against back: ([0-9.e+-]+) from (\d+) base poses", front_line)
    assert scale and float(scale.group(1)) == pytest.approx(1.0, rel=1e-4) and int(scale.group(2)) == FRAMES, front_line
    front, back = read_tum(out / "trajectory_front.tum"), read_tum(out / "trajectory_back.tum")
    assert (front.stamps_ns() == back.stamps_ns()).all() and len(front) == FRAMES
    np.testing.assert_allclose(front.poses(), back.poses(), atol=1e-4)


@pytest.mark.parametrize("argv, reason", [
    (["--cameras", "front,back", "--source", "synthetic:160x120"],
     "--source given 1 times for 2 cameras: one per camera, in the order of --cameras"),
    (["--source", "synthetic:160x120", "--source", "synthetic:160x120"],
     "--source given 2 times: name the cameras, --cameras NAME,NAME (one per --source)"),
    (["--cameras", "front,front"], "--cameras: 'cameras' must name each camera once; repeated: ['front']"),
    (["--cameras", "front,depth"], "'depth' is a name of the node's own (~/depth...)"),
    (["--cameras", "front,back", "--primary-camera", "rear"], "'primary_camera' ('rear') must be one of cameras"),
    (["--primary-camera", "front"], "--primary-camera needs --cameras"),
    (["--cameras", "front,back", "--source", "synthetic:160x120", "--source", "synthetic:nope"], "camera back: "),
    (["--cameras", "front,back", "--source", "synthetic:160x120", "--source", "synthetic:160x90"],
     "camera back's source gives 160x90 images"),
])
def test_rig_flags_refused_before_the_node_starts(capsys, argv, reason):
    assert run_demo.main([*argv, "--frames", str(FRAMES)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lingbot-ros-demo: ") and reason in err, err
    assert "listening" not in err
