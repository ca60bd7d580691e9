"""map_node with a camera rig (parameter cameras, issue 29) over real DDS: two cameras fed with two
real sequences, each camera's poses on its own topic, the primary's alone on ~/pose and TF, one
saved map; a silent camera does not stop the other; hostile cameras refused at configure."""
import subprocess
import sys
import time

import cv2
import numpy as np
import pytest

from helpers import need_module  # noqa: I001 (before the ROS imports it guards)

need_module("rclpy", module_level=True)
from helpers import (OPTICAL, SaveMap, courthouse_jpegs, double_parameter, interrupt_and_check_exit,  # noqa: E402
                     jpeg_message, rigid)

from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402
from geometry_msgs.msg import PoseStamped  # noqa: E402
from lifecycle_msgs.msg import Transition  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import CameraInfo, CompressedImage, Image  # noqa: E402
from std_msgs.msg import String  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from lingbot_ros.io.image_codec import fill_image  # noqa: E402
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


def publisher(ros, topic: str, kind=CompressedImage):
    pub = ros.node.create_publisher(kind, topic,
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


def raw(jpeg_messages) -> list:
    """The same frames as sensor_msgs/Image (rgb8)."""
    out = []
    for msg in jpeg_messages:
        bgr = cv2.imdecode(np.frombuffer(bytes(msg.data), np.uint8), cv2.IMREAD_COLOR)
        out.append(fill_image(Image(header=msg.header), cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), "rgb8"))
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
        "map.ply", "preview.png", "trajectory_back.tum", "trajectory_front.tum", "windows_back.csv",
        "windows_front.csv"]
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
    # The node is up and its services matched both ways (a read, retried): Fast DDS drops the
    # response of a request sent before that on a loaded machine (CI: change_state timed out).
    assert ros.state() == "unconfigured"
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
    deactivate / activate cycle resumes; a camera changing its image size restarts alone; cleanup
    releases the rig."""
    fixture, _ = tiny
    static = ros.node.create_publisher(tf_message_type(), "/tf_static", TF_STATIC_QOS)
    mounts = {"front_optical": rigid(OPTICAL, [0.2, 0.0, 0.5]), "back_optical": rigid(OPTICAL, [-0.2, 0.0, 0.5])}
    static.publish(tf_message_type()(transforms=[
        transform_stamped(pose, stamp_msg(1), "base_link", child) for child, pose in mounts.items()]))
    node = ros.start_node(fixture, *RIG, "primary_camera:=back", "warmup:=true", "warmup_image_size:=518x294",
                          "use_camera_info:=true", "camera_info_qos:=reliable", autostart=False)
    assert ros.state() == "unconfigured"   # up and matched, as above
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
    # Each camera's camera_info beside its image topic, reported under its name.
    info = ros.node.create_publisher(CameraInfo, "/map_node/back/camera_info", QoSProfile(
        depth=5, reliability=ReliabilityPolicy.RELIABLE))
    ros.wait(info.get_subscription_count, "the node's subscription to the back camera's camera_info")
    info.publish(CameraInfo(width=518, height=294, k=[400.0, 0, 259, 0, 400.0, 147, 0, 0, 1]))
    ros.wait(lambda: "400" in (ros.diagnostic("camera_info back") or ""), "the back camera's K in /diagnostics")
    assert ros.diagnostic("camera_info front") == ""
    for camera, child in (("front", "front_optical"), ("back", "back_optical")):
        ros.wait(lambda camera=camera, child=child: f"mount TF base_link -> {child}" in diagnostics_text(ros),
                 f"{camera}'s mount from TF in /diagnostics")
        assert f"camera {camera}: camera mount from TF: base_link -> {child}" in ros.output(node)

    rollback = ros.call(Trigger, "/map_node/rollback_last_frame", Trigger.Request())
    assert rollback.success and rollback.message.startswith("camera back: "), rollback.message
    refused = ros.call(Trigger, "/map_node/new_window", Trigger.Request())
    assert not refused.success and "not available with cameras" in refused.message
    ros.set_parameter(double_parameter("min_confidence", 0.5))   # a live Mapper parameter: every camera's
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

    # The front camera changes its image size: its own stream restarts (the Mapper's rule), the
    # primary (back) maps on.
    small = cv2.imencode(".jpg", cv2.resize(cv2.imdecode(np.frombuffer(jpegs[0], np.uint8), cv2.IMREAD_COLOR),
                                            (259, 147)))[1].tobytes()
    front.publish(frames([small], 100.6, "front_optical")[0])
    back.publish(frames(jpegs[:1], 100.6, "back_optical")[0])
    status = ros.wait(lambda: ros.settled() if ros.settled() and ros.settled().frames_received == before + 4 else None,
                      "the group with the resized front frame")
    assert (status.frames_processed, status.init_frames, status.restarts, status.frames_failed) == (before + 3, 1, 1, 0)
    assert "front initialising" in status.state_text and "back (primary) tracking" in status.state_text
    assert "camera front: stream restarted (map continues from the last pose): image size changed" in ros.output(node)

    reset = ros.call(Trigger, "/map_node/reset", Trigger.Request())
    assert reset.success, reset.message
    status = ros.wait(lambda: ros.statuses[-1] if ros.statuses[-1].restarts == 1 + 2 else None,
                      "both cameras restarted by the reset")
    assert "front restarted" in status.state_text and "back (primary) restarted" in status.state_text
    assert status.keyframes == 0
    ros.transition(Transition.TRANSITION_DEACTIVATE, "inactive")
    ros.transition(Transition.TRANSITION_CLEANUP, "unconfigured")
    ros.wait(lambda: ros.diagnostic("worker_threads") == "0", "the worker gone after cleanup")
    interrupt_and_check_exit(ros, node)


def test_two_bags_replayed_into_a_rig_save_one_map(ros, tiny, shared_dir, tmp_path):
    """The issue's proof run: lingbot-ros-replay plays two real bags as the rig's two cameras;
    every frame of both is processed, ~/save_map writes one map with both trajectories, and the map
    database holds the rig (lingbot-ros-map info, a reader of its own, lists both cameras)."""
    fixture, courthouse = tiny
    loop = shared_dir / "data" / "loop_bag"
    assert loop.is_dir(), loop
    database = tmp_path / "rig.db"
    node = ros.start_node(fixture, *RIG, f"map_database:={database}")
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
    info = subprocess.run([sys.executable, "-m", "lingbot_ros.tools.map_db", "info", str(database)],
                          capture_output=True, text=True, timeout=120, env=ros.env)
    assert info.returncode == 0, info.stderr
    lines = info.stdout.splitlines()
    assert lines[1].startswith("rig 1: clean; 2 cameras"), info.stdout
    assert lines[2].startswith("  camera front (primary): run 1;") and "15 frames" in lines[2], info.stdout
    assert lines[3].startswith("  camera back: run 2;") and "15 frames" in lines[3], info.stdout


def test_a_camera_topic_of_another_type_refused_at_configure(ros, tiny):
    fixture, _ = tiny
    ros.node.create_publisher(String, "/map_node/front/image/compressed", 10)   # not a camera
    node = ros.start_node(fixture, "cameras:=[front,back]", autostart=False)
    assert ros.state() == "unconfigured"   # the node is in the graph (its participant discovered the probe's)
    time.sleep(1.0)   # margin for the probe's publisher endpoint to reach the node's graph cache
    ros.transition(Transition.TRANSITION_CONFIGURE, "unconfigured", succeeds=False)
    reason = ("/map_node/front/image/compressed carries std_msgs/msg/String, not sensor_msgs/msg/CompressedImage: "
              "remap the camera to its image topic")
    assert reason in ros.output(node)
    ros.wait(lambda: ros.diagnostics and reason in ros.diagnostics[-1].status[0].message, "the refusal in /diagnostics")
    interrupt_and_check_exit(ros, node)


def test_a_camera_jumping_its_stamps_affects_its_own_stream_only(ros, tiny, shared_dir):
    fixture, _ = tiny
    back_poses = []
    ros.node.create_subscription(PoseStamped, "/map_node/back/pose", back_poses.append, 100)
    # Raw images this time (image_transport raw: ~/<name>/image).
    node = ros.start_node(fixture, *RIG, "max_stamp_gap_s:=5.0", "primary_camera:=back", "image_transport:=raw")
    ros.wait(lambda: ros.statuses, "the node's first status")
    front = publisher(ros, "/map_node/front/image", Image)
    back = publisher(ros, "/map_node/back/image", Image)
    jpegs = courthouse_jpegs(shared_dir, 16)
    front_msgs = raw(frames(jpegs[:8], 100.0, "front_optical"))
    back_msgs = raw(frames(jpegs[8:], 100.0, "back_optical"))
    front_msgs[4].header.stamp.sec += 3600   # an hour ahead: the front camera's clock jumped
    for front_msg, back_msg in zip(front_msgs, back_msgs):
        front.publish(front_msg)
        back.publish(back_msg)
    status = ros.wait(lambda: ros.settled() if ros.settled() and len(back_poses) == 8 else None,
                      "every back frame placed")
    assert [stamp_ns(p.header.stamp) for p in back_poses] == [100 * 10**9 + k * 10**8 for k in range(8)]
    assert "back (primary) tracking" in status.state_text, status.state_text
    # The front camera's outlier is refused in its own stream; it maps on from its next frame.
    assert "front tracking, 7 processed" in status.state_text and status.frames_rejected == 1
    assert status.restarts == 0 and status.frames_failed == 0
    assert "camera front: image stamp jumped 3600.100 s ahead" in ros.output(node)
    interrupt_and_check_exit(ros, node)
