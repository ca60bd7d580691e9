"""map_node with a camera rig (parameter cameras, issue 29) over real DDS: two cameras fed with two
real sequences, each camera's poses on its own topic, the primary's alone on ~/pose and TF, one
saved map; a silent camera does not stop the other; hostile cameras refused at configure."""
import time

import pytest

from helpers import need_module  # noqa: I001 (before the ROS imports it guards)

need_module("rclpy", module_level=True)
from helpers import OPTICAL, SaveMap, courthouse_jpegs, interrupt_and_check_exit, jpeg_message, rigid  # noqa: E402

from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402
from geometry_msgs.msg import PoseStamped  # noqa: E402
from lifecycle_msgs.msg import Transition  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import CompressedImage  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from lingbot_ros.mapping.files.export import read_ply, read_tum  # noqa: E402
from lingbot_ros.ros.messages import stamp_msg, stamp_ns, tf_message_type, transform_stamped  # noqa: E402
from lingbot_ros.ros.qos import TF_QOS, TF_STATIC_QOS  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

RIG = ["cameras:=[front,back]", "process_all_frames:=true", "image_qos:=reliable", "image_qos_depth:=50",
       "queue_size:=50", "max_stamp_gap_s:=0.0", "tf_mode:=map_to_base", "stale_after_s:=1.0"]


def loop_jpegs(shared_dir, count: int) -> list[bytes]:
    files = sorted((shared_dir / "data" / "loop_jpg").glob("*.jpg"))[:count]
    assert len(files) == count, f"{count} images in {shared_dir / 'data' / 'loop_jpg'}"
    return [f.read_bytes() for f in files]


def publisher(ros, topic: str):
    pub = ros.node.create_publisher(CompressedImage, topic,
                                    QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE))
    ros.wait(pub.get_subscription_count, f"the node's subscription to {topic}")
    return pub


def frames(jpegs, start_s: float, frame_id: str):
    out = []
    for i, data in enumerate(jpegs):
        msg = jpeg_message(data, start_s + 0.1 * i)
        msg.header.frame_id = frame_id
        out.append(msg)
    return out


def diagnostics_text(ros) -> str:
    if not ros.diagnostics:
        return ""
    status = ros.diagnostics[-1].status[0]
    return status.message + "\n" + "\n".join(f"{kv.key}: {kv.value}" for kv in status.values)


def test_two_cameras_one_map_one_tf_owner(ros, tiny, shared_dir, tmp_path):
    fixture, _ = tiny
    poses = {"front": [], "back": []}
    for camera, got in poses.items():
        ros.node.create_subscription(PoseStamped, f"/map_node/{camera}/pose", got.append, 100)
    transforms = []
    ros.node.create_subscription(tf_message_type(), "/tf", lambda msg: transforms.extend(msg.transforms), TF_QOS)
    node = ros.start_node(fixture, *RIG)
    ros.wait(lambda: ros.statuses, "the node's first status")
    front = publisher(ros, "/map_node/front/image/compressed")
    back = publisher(ros, "/map_node/back/image/compressed")
    count = 8
    # Two real sequences, stamped alike: each group holds one frame of each camera.
    for front_msg, back_msg in zip(frames(courthouse_jpegs(shared_dir, count), 100.0, "front_optical"),
                                   frames(loop_jpegs(shared_dir, count), 100.0, "back_optical")):
        front.publish(front_msg)
        back.publish(back_msg)
    status = ros.wait(lambda: ros.settled_with(2 * count), f"{2 * count} frames processed (both cameras)", timeout=120)
    assert status.frames_received == 2 * count and status.frames_rejected == 0 and status.frames_failed == 0
    assert "front (primary) tracking" in status.state_text and "back tracking" in status.state_text, status.state_text
    stamps = [100 * 10**9 + k * 10**8 for k in range(count)]
    for camera in poses:
        ros.wait(lambda camera=camera: len(poses[camera]) == count, f"{count} poses of {camera}")
        assert [stamp_ns(p.header.stamp) for p in poses[camera]] == stamps
        assert all(p.header.frame_id == "map" for p in poses[camera])
    # ~/pose and TF are the primary's (front) only: one TF owner, one transform per front frame.
    ros.wait(lambda: len(ros.poses) == count, f"{count} poses on ~/pose")
    assert [stamp_ns(p.header.stamp) for p in ros.poses] == stamps
    ros.wait(lambda: len([t for t in transforms if t.child_frame_id == "base_link"]) >= count, "the TF of each frame")
    ours = [t for t in transforms if t.header.frame_id == "map"]
    assert {t.child_frame_id for t in ours} == {"base_link"}
    assert [stamp_ns(t.header.stamp) for t in ours] == stamps
    for pose, transform in zip(ros.poses, ours):   # ~/pose is base_link in map, as TF says
        assert abs(pose.pose.position.x - transform.transform.translation.x) < 1e-6

    # Each camera's line in /diagnostics names it.
    ros.wait(lambda: "camera back" in diagnostics_text(ros) and "camera front" in diagnostics_text(ros),
             "per-camera lines in /diagnostics")

    # One map from both cameras, one trajectory per camera.
    saved = ros.call(SaveMap, "/map_node/save_map", SaveMap.Request(directory=str(tmp_path / "rig")))
    assert saved.success, saved.message
    assert sorted(p.name for p in (tmp_path / "rig").iterdir()) == [
        "map.ply", "preview.png", "trajectory_back.tum", "trajectory_front.tum", "windows_back.csv", "windows_front.csv"]
    xyz, _ = read_ply(saved.ply_path)
    assert len(xyz) == saved.num_points > 0
    assert saved.tum_path.endswith("trajectory_front.tum") and saved.num_poses == count
    assert len(read_tum(str(tmp_path / "rig" / "trajectory_back.tum"))) == count

    # The back camera sends garbage, then goes silent: the front one keeps mapping (each frame
    # waits at most camera_sync_wait_s for the back's), and /diagnostics names the camera.
    back.publish(CompressedImage(format="jpeg", data=b"\xff\xd8 not a jpeg"))
    more = 25   # 2.5 s at 10 Hz: past stale_after_s (1 s) for the back camera
    for msg in frames(courthouse_jpegs(shared_dir, count + more)[count:], 100.0 + 0.1 * count, "front_optical"):
        front.publish(msg)
        time.sleep(0.1)
    status = ros.wait(lambda: ros.settled_with(2 * count + more),
                      f"{more} more front frames without the back camera", timeout=120)
    assert status.frames_rejected == 1 and status.frames_failed == 0 and status.restarts == 0
    assert len(ros.poses) == count + more and len(poses["back"]) == count
    ros.wait(lambda: f"back: {count + 1} received, {count} processed, 0 dropped, 1 rejected" in diagnostics_text(ros)
             and f"front (primary): {count + more} received, {count + more} processed, 0 dropped, 0 rejected"
             in diagnostics_text(ros), "each camera's counts in /diagnostics")
    silent = "camera back: no image on /map_node/back/image/compressed for"
    assert any(silent in status.message for array in ros.diagnostics for status in array.status), \
        "the silent camera named in /diagnostics while the front one sent"
    assert "camera back: image skipped: image: zero stamp" in ros.output(node)
    interrupt_and_check_exit(ros, node)


@pytest.mark.parametrize("cameras, reason", [
    ("[front,front]", "'cameras' must name each camera once; repeated: ['front']"),
    ("[front,'bad/name']", "camera name 'bad/name' must start with a letter"),
    ("[front,depth]", "'cameras': 'depth' is a name of the node's own (~/depth...)"),
    ("[front,back,side]", "'primary_camera' ('rear') must be one of cameras ['front', 'back', 'side']"),
])
def test_hostile_cameras_refused_at_configure(ros, tiny, cameras, reason):
    fixture, _ = tiny
    primary = ["primary_camera:=rear"] if "primary_camera" in reason else []
    node = ros.start_node(fixture, f"cameras:={cameras}", *primary, autostart=False)
    ros.transition(Transition.TRANSITION_CONFIGURE, "unconfigured", succeeds=False)
    assert "configure failed, fix the parameters: invalid parameters: " in ros.output(node)
    assert reason in ros.output(node)
    ros.wait(lambda: ros.diagnostics and reason in ros.diagnostics[-1].status[0].message,
             "the refusal in /diagnostics")
    assert ros.diagnostics[-1].status[0].level == DiagnosticStatus.ERROR
    interrupt_and_check_exit(ros, node)


def test_rig_lifecycle_services_and_mounts_from_tf(ros, tiny, shared_dir, tmp_path):
    """Each camera's mount from /tf_static (base_link -> its image's frame_id); a warm-up of the
    batched step; reset of every camera, rollback of the primary, new_window refused; a
    deactivate / activate cycle resumes; cleanup releases the rig."""
    fixture, _ = tiny
    static = ros.node.create_publisher(tf_message_type(), "/tf_static", TF_STATIC_QOS)
    mounts = {"front_optical": rigid(OPTICAL, [0.2, 0.0, 0.5]), "back_optical": rigid(OPTICAL, [-0.2, 0.0, 0.5])}
    static.publish(tf_message_type()(transforms=[
        transform_stamped(pose, stamp_msg(1), "base_link", child) for child, pose in mounts.items()]))
    node = ros.start_node(fixture, *RIG, "primary_camera:=back", "warmup:=true", "warmup_image_size:=518x294",
                          autostart=False)
    ros.transition(Transition.TRANSITION_CONFIGURE, "inactive")
    ros.transition(Transition.TRANSITION_ACTIVATE, "active")
    assert "warm-up done" in ros.output(node)
    front = publisher(ros, "/map_node/front/image/compressed")
    back = publisher(ros, "/map_node/back/image/compressed")
    jpegs = courthouse_jpegs(shared_dir, 12)   # 5 groups (past the 3 of phase 1), one more after the resume
    for front_msg, back_msg in zip(frames(jpegs[:5], 100.0, "front_optical"),
                                   frames(jpegs[6:11], 100.0, "back_optical")):
        front.publish(front_msg)
        back.publish(back_msg)
    before = ros.wait(lambda: ros.settled_with(10), "5 groups of 2 frames").frames_processed
    for camera, child in (("front", "front_optical"), ("back", "back_optical")):
        ros.wait(lambda camera=camera, child=child: f"mount TF base_link -> {child}" in diagnostics_text(ros),
                 f"{camera}'s mount from TF in /diagnostics")
        assert f"camera {camera}: camera mount from TF: base_link -> {child}" in ros.output(node)

    rollback = ros.call(Trigger, "/map_node/rollback_last_frame", Trigger.Request())
    assert rollback.success and rollback.message.startswith("camera back: "), rollback.message
    refused = ros.call(Trigger, "/map_node/new_window", Trigger.Request())
    assert not refused.success and "not available with cameras" in refused.message
    flushed = ros.call(Trigger, "/map_node/flush_deferred_evictions", Trigger.Request())
    assert flushed.success and "front: " in flushed.message and "back: " in flushed.message

    # Paused and resumed: the rig keeps its streams.
    ros.transition(Transition.TRANSITION_DEACTIVATE, "inactive")
    ros.transition(Transition.TRANSITION_ACTIVATE, "active")
    front = publisher(ros, "/map_node/front/image/compressed")
    back = publisher(ros, "/map_node/back/image/compressed")
    front.publish(frames(jpegs[5:6], 100.5, "front_optical")[0])
    back.publish(frames(jpegs[11:12], 100.5, "back_optical")[0])
    status = ros.wait(lambda: ros.settled_with(before + 2), "a group after the resume")
    assert status.restarts == 0, status.state_text

    reset = ros.call(Trigger, "/map_node/reset", Trigger.Request())
    assert reset.success, reset.message
    status = ros.wait(lambda: ros.statuses[-1] if ros.statuses[-1].restarts == 2 else None,
                      "both cameras restarted by the reset")
    assert status.keyframes == 0
    ros.transition(Transition.TRANSITION_DEACTIVATE, "inactive")
    ros.transition(Transition.TRANSITION_CLEANUP, "unconfigured")
    ros.wait(lambda: ros.diagnostic("worker_threads") == "0", "the worker gone after cleanup")
    interrupt_and_check_exit(ros, node)


def test_two_bags_replayed_into_a_rig_save_one_map(ros, tiny, shared_dir, tmp_path):
    """The issue's proof run: lingbot-ros-replay plays two real bags as the rig's two cameras;
    every frame of both is processed, and ~/save_map writes one map with both trajectories."""
    fixture, courthouse = tiny
    loop = shared_dir / "data" / "loop_bag"
    assert loop.is_dir(), loop
    node = ros.start_node(fixture, *RIG)
    ros.wait(lambda: ros.statuses, "the node's first status")
    replay = ros.start("replay", ["-m", "lingbot_ros.tools.replay", str(courthouse), str(loop), "--camera", "front",
                                  "--camera", "back", "--duration", "1.5", "--rate", "2",
                                  "--wait-for-subscribers", "20", "--quiet"])
    assert replay.wait(60) == 0, ros.output(replay)
    status = ros.wait(lambda: ros.settled_with(30), "15 frames of each bag processed", timeout=120)
    assert status.frames_received == 30 and status.frames_dropped == 0 and status.frames_failed == 0
    saved = ros.call(SaveMap, "/map_node/save_map", SaveMap.Request(directory=str(tmp_path / "bags")))
    assert saved.success, saved.message
    assert saved.num_poses == 15 and len(read_tum(str(tmp_path / "bags" / "trajectory_back.tum"))) == 15
    xyz, _ = read_ply(saved.ply_path)
    assert len(xyz) == saved.num_points > 0
    interrupt_and_check_exit(ros, node)
