"""Pure parts of the ROS layer: messages, parameters, the worker and its inbox, the path."""
import dataclasses
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from helpers import unpack_points, wait_until

from lingbot_ros.mapping.records import InputFrame
from lingbot_ros.mapping.settings import SettingsError
from lingbot_ros.ros import messages, params
from lingbot_ros.ros.safety import SafetyNet
from lingbot_ros.ros.worker import FrameInbox, Worker

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("seed", range(20))
def test_pose_message_orientation(seed):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=4)
    q /= np.linalg.norm(q)
    x, y, z, w = q
    rotation = np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                         [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                         [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])
    pose = np.eye(4)
    pose[:3, :3] = rotation
    o = messages.pose_from_matrix(pose).orientation
    np.testing.assert_allclose([o.x, o.y, o.z, o.w], q * np.sign(q[3]), atol=1e-9)


def test_pointcloud2_layout():
    xyz = np.array([[1.0, 2.0, 3.0], [-1.5, 0.25, 8.0]], np.float32)
    rgb = np.array([[255, 0, 10], [1, 2, 3]], np.uint8)
    msg = messages.point_cloud(xyz, rgb, stamp=messages.make_header(None, "map").stamp, frame_id="map")
    assert [(f.name, f.offset, f.datatype, f.count) for f in msg.fields] == [
        ("x", 0, 7, 1), ("y", 4, 7, 1), ("z", 8, 7, 1), ("rgb", 12, 7, 1)]
    assert (msg.height, msg.width, msg.point_step, msg.row_step) == (1, 2, 16, 32)
    assert not msg.is_bigendian and msg.is_dense and len(msg.data) == 32
    raw = np.frombuffer(bytes(msg.data), np.uint32).reshape(2, 4)
    assert raw[0, 3] == 0xFF000A and raw[1, 3] == 0x010203
    back_xyz, back_rgb = unpack_points(msg)
    np.testing.assert_array_equal(back_xyz, xyz)
    np.testing.assert_array_equal(back_rgb, rgb)


def test_odometry_covariance_convention():
    trusted = messages.odometry(np.eye(4), None, "map", "cam", 0.01)
    untrusted = messages.odometry(np.eye(4), None, "map", "cam", messages.UNTRUSTED_VARIANCE)
    assert np.allclose(np.diag(np.reshape(trusted.pose.covariance, (6, 6))), 0.01)
    assert np.allclose(np.diag(np.reshape(untrusted.pose.covariance, (6, 6))), 1e6)
    assert list(trusted.twist.covariance[::7]) == [1e6] * 6 and trusted.child_frame_id == "cam"


def test_camera_info_from_intrinsics():
    k = np.array([[100.0, 0, 56], [0, 101.0, 42], [0, 0, 1]])
    msg = messages.camera_info(k, 112, 84, None, "cam")
    assert (msg.width, msg.height) == (112, 84)
    assert list(msg.k) == k.reshape(-1).tolist() and msg.p[0] == 100.0 and msg.p[3] == 0.0


def test_default_parameters_validate_and_match_map_yaml():
    assert (REPO / "config" / "map.yaml").read_text() == params.defaults_yaml(), \
        "config/map.yaml is stale: python -m lingbot_ros.ros.params > config/map.yaml"
    settings, node_settings = params.split({})
    loaded = yaml.safe_load((REPO / "config" / "map.yaml").read_text())["/**"]["ros__parameters"]
    defaults = {**dataclasses.asdict(settings), **dataclasses.asdict(node_settings)}
    # An empty list cannot be written in a ROS params file (rcl reads `[]` as no value, which
    # rclpy refuses): the file shows cameras in a comment, and its default is the declared one.
    assert defaults.pop("cameras") == () and "# cameras: [front, back]" in params.defaults_yaml()
    assert loaded == defaults
    assert params.split(loaded) == (settings, node_settings)


@pytest.mark.parametrize("values, text", [
    ({"keyframe_interval": 0}, "'keyframe_interval' must be >= 1"),
    ({"image_width": 500}, "'image_width' must be a positive multiple of 14"),
    ({"image_qos": "fast"}, "'image_qos' must be one of"),
    ({"tf_mode": "map_to_world"}, "'tf_mode' must be one of"),
    ({"checkpoint": "/no/such.pt"}, "'checkpoint' names a file that does not exist"),
    ({"map_voxel_size_m": 0.0}, "'map_voxel_size_m' must be >= 0.001"),
    # Ranges are what the code can do (issue 18, item 3): each refused, naming the parameter.
    ({"map_voxel_size_m": 1e-300}, "'map_voxel_size_m' must be >= 0.001"),
    ({"camera_mount": "1e300 0 0 0 0 0"}, "'camera_mount' must have a translation of at most 100 m"),
    ({"camera_mount": "0 0 -101 0 0 0"}, "'camera_mount' must have a translation of at most 100 m"),
    ({"camera_mount": "0 0 0 0 1e300 0"}, "'camera_mount' must have angles of at most 2 pi radians"),
    ({"camera_num_iterations": 10**12}, "'camera_num_iterations' must be <= 64"),
    ({"image_width": 14 * 1000}, "'image_width' must be <= 2100"),
    ({"warmup_image_size": "100000x100000"}, "'warmup_image_size' must be at most 67108864 pixels"),
    ({"sliding_window": 2000}, "'sliding_window' must be <= 1024"),
    ({"scale_frames": 2000}, "'scale_frames' must be <= 1024"),
    ({"sliding_window": 1020}, "'sliding_window' (1020) plus scale_frames (8) must be at most 1024"),
    ({"max_input_ahead_s": 10.5}, "'max_input_ahead_s' must be <= 10"),
    ({"transform_publish_period_s": 1e-12}, "'transform_publish_period_s' must be 0 (off) or at least 0.001 s"),
    ({"map_publish_period_s": 1e-12}, "'map_publish_period_s' must be 0 (off) or at least 0.001 s"),
    ({"diagnostics_period_s": 1e-12}, "'diagnostics_period_s' must be >= 0.05"),
    ({"tf_camera_frame": "base_link"}, "'tf_camera_frame' must differ from 'base_frame' (both 'base_link')"),
    ({"tf_camera_frame": "odom"}, "'tf_camera_frame' must differ from 'odom_frame'"),
    ({"odom_frame": "base_link"}, "'odom_frame' must differ from 'base_frame'"),
    ({"base_frame": "/map"}, "'base_frame' must differ from 'map_frame'"),
    ({"camera_frame": "base_link"}, "'camera_frame' ('base_link') must not be map_frame, odom_frame or base_frame"),
    ({"camera_frame": "a camera"}, "'camera_frame' must be a TF frame name"),
    ({"queue_size": 5000}, "'queue_size' must be <= 1000"),
    ({"keyframe_interval": 2**62}, "'keyframe_interval' must be <= 1000"),
    ({"window_size": 5000, "overlap_size": 2000}, "'overlap_size' / 'overlap_keyframes': the windowed policy's "
                                                  "overlap (2000 frames) must be at most 1024"),
    ({"window_switch_ahead": True, "keyframe_policy": "motion"},
     "'window_switch_ahead' is true but the motion keyframe policy decides"),
    ({"diagnostics_window_s": 86400.0}, "'diagnostics_window_s' must be <= 3600"),
    ({"min_confidence": float("nan")}, "'min_confidence' must be a finite number"),
    ({"process_all_frames": "yes"}, "'process_all_frames' must be a bool"),
    ({"queue_size": True}, "'queue_size' must be a int"),
    ({"device": "tpu"}, "'device' must be auto, cpu, cuda"),
    ({"warmup_image_size": "640*480"}, "'warmup_image_size' must be auto or WIDTHxHEIGHT"),
    ({"warmup_image_size": "0x480"}, "'warmup_image_size' must be auto or WIDTHxHEIGHT"),
    ({"warmup_camera_info_wait_s": 31.0}, "'warmup_camera_info_wait_s' must be <= 30"),
    ({"warmup_camera_info_wait_s": -1.0}, "'warmup_camera_info_wait_s' must be >= 0"),
    ({"warmup_image_size": "7x7"}, "'warmup_image_size' (7x7): image 7x7 is smaller than one patch (14 px)"),
    ({"typo_parameter": 1}, "unknown parameter"),
])
def test_parameter_validation_names_the_parameter(values, text):
    with pytest.raises(SettingsError) as error:
        params.split(values)
    assert text in str(error.value)


def test_each_bad_parameter_is_reported_once():
    with pytest.raises(SettingsError) as error:
        params.split({"max_image_pixels": -1, "diagnostics_period_s": -1.0, "sliding_window": 0})
    text = str(error.value)
    for name in ("max_image_pixels", "diagnostics_period_s", "sliding_window"):
        assert text.count(f"'{name}'") == 1


def test_the_new_bounds_accept_their_limits():
    mapper, node = params.split({"map_voxel_size_m": 0.001, "camera_mount": "100 -100 0.5 6.28 0 -6.28",
                                 "camera_num_iterations": 64, "image_width": 2100, "scale_frames": 0,
                                 "sliding_window": 1024, "max_input_ahead_s": 10.0, "map_publish_period_s": 0.001,
                                 "transform_publish_period_s": 0.0, "diagnostics_period_s": 0.05,
                                 "camera_frame": "lingbot_camera"})
    assert (mapper.sliding_window, node.map_publish_period_s, node.camera_frame) == (1024, 0.001, "lingbot_camera")


def test_int_is_accepted_for_float_parameters():
    assert params.split({"map_publish_period_s": 2})[1].map_publish_period_s == 2.0


def test_process_all_frames_refuses_a_best_effort_subscription():
    assert params.split({"process_all_frames": True})[1].input_errors() == []
    errors = params.split({"process_all_frames": True, "image_qos": "best_effort"})[1].input_errors()
    assert len(errors) == 1 and "set image_qos to auto or reliable" in errors[0]


def test_descriptors_say_when_a_parameter_may_change():
    fields = params.FIELDS
    sliding = params.descriptor(fields["sliding_window"])
    assert sliding.read_only and sliding.integer_range[0].from_value == 1
    confidence = params.descriptor(fields["min_confidence"])
    assert not confidence.read_only and confidence.floating_point_range[0].from_value == 0.0
    assert "applies at once" in confidence.description
    assert "taken at activate" in params.descriptor(fields["image_transport"]).description


def test_newest_frame_wins_and_counts_drops():
    inbox = FrameInbox(keep_all=False, capacity=30)
    assert [inbox.put(i) for i in range(4)] == [0, 1, 1, 1]
    assert inbox.get(0.01) == 3 and inbox.get(0.01) is None


@pytest.mark.parametrize("keep_all", [False, True])
def test_a_closed_inbox_takes_no_frame(keep_all):
    # Regression: newest-frame-wins appended to a closed (deactivated) inbox, so an image callback
    # still running at deactivate had its frame processed by an inactive node.
    inbox = FrameInbox(keep_all=keep_all, capacity=2)
    inbox.close()
    assert inbox.put(1) == 1 and len(inbox) == 0 and inbox.get(0.01) is None


def test_fifo_keeps_order_and_blocks_when_full():
    inbox = FrameInbox(keep_all=True, capacity=2)
    assert inbox.put(1) == 0 and inbox.put(2) == 0
    done = threading.Event()
    threading.Thread(target=lambda: (inbox.put(3), done.set()), daemon=True).start()
    assert not done.wait(0.2)                 # full: the producer waits
    assert inbox.get(0.1) == 1
    assert done.wait(5)
    assert [inbox.get(0.1), inbox.get(0.1)] == [2, 3]


def test_worker_runs_commands_between_frames_and_fails_pending_ones_on_stop():
    seen = []
    inbox = FrameInbox(keep_all=True, capacity=10)
    errors = []
    worker = Worker(inbox, lambda f: seen.append(f) if f != "bad" else 1 / 0, errors.append)
    worker.start()
    inbox.put("bad")                          # a failing frame does not stop the worker
    inbox.put("frame")
    assert worker.submit(lambda: "done").result(timeout=5) == "done"
    assert worker.submit(lambda: 1 / 0).exception(timeout=5).__class__ is ZeroDivisionError
    assert worker.stop(5)
    assert seen == ["frame"] and [type(e) for e in errors] == [ZeroDivisionError]
    with pytest.raises(RuntimeError, match="stopped"):
        worker.submit(lambda: None).result(timeout=1)


def test_the_next_frame_is_taken_while_the_device_runs_and_not_after():
    """FrameInbox.get_while: a frame that comes while busy() is taken at once (its step goes in
    behind the running one); once busy() is False an empty inbox answers None without waiting."""
    inbox = FrameInbox(keep_all=True, capacity=4)
    busy = threading.Event()
    busy.set()
    threading.Timer(0.1, lambda: inbox.put("next")).start()
    assert inbox.get_while(busy.is_set) == "next"             # came while the device ran
    threading.Timer(0.1, busy.clear).start()
    assert inbox.get_while(busy.is_set) is None               # the device finished first
    inbox.put("waiting")
    assert inbox.get_while(lambda: False) == "waiting"       # one already waiting is taken
    inbox.close()
    busy.set()
    assert inbox.get_while(busy.is_set) is None               # closed (deactivate): never waits


def test_the_worker_takes_no_next_frame_while_a_command_waits_or_after_stop():
    inbox = FrameInbox(keep_all=True, capacity=4)
    taken, release = [], threading.Event()

    def handle(frame):   # a handler that goes on with the frames that keep coming (the node's)
        taken.append(frame)
        release.wait(5)
        following = worker.next_frame(lambda: False)
        while following is not None:
            taken.append(following)
            following = worker.next_frame(lambda: False)

    worker = Worker(inbox, handle, lambda error: None)
    worker.start()
    inbox.put(1)
    wait_until(lambda: taken == [1], "frame 1 taken", 5)
    inbox.put(2)
    command = worker.submit(lambda: list(taken))
    release.set()
    assert command.result(timeout=5) == [1]    # the command ran before frame 2: next_frame gave None
    wait_until(lambda: taken == [1, 2], "frame 2 taken after the command", 5)
    assert worker.stop(5)
    inbox.put(3)
    assert worker.next_frame(lambda: True) is None


def test_path_keeps_exact_stamps_and_rebuilds_only_replaced_poses():
    from builtin_interfaces.msg import Time

    from lingbot_ros.mapping.placement.robot import RobotFrames
    from lingbot_ros.mapping.settings import MapperSettings
    from lingbot_ros.mapping.store.trajectory import Trajectory
    from lingbot_ros.ros.outputs import PathCache

    trajectory = Trajectory()
    conversion = RobotFrames(MapperSettings()).first_stream()[1].conversion
    class Mapper:   # the verb PathCache uses
        def path_poses(self, count=None):
            return [(e, conversion) for e in trajectory.newest(len(trajectory) if count is None else count)]
    path = PathCache(Mapper(), "map", max_length=3)
    for index in range(4):
        pose = np.eye(4)
        pose[:3, 3] = (float(index), 0.0, 0.0)   # internal frame: map axes, model units
        # A stamp float seconds cannot hold exactly (ns at epoch ~1.7e9 s).
        trajectory.append((1_700_000_000 + index) * 10**9 + 123_456_789, pose, key=index)
    first = path.message(Time()).poses
    assert [p.header.stamp.sec - 1_700_000_000 for p in first] == [1, 2, 3]
    assert all(p.header.stamp.nanosec == 123_456_789 for p in first)
    assert [p.pose.position.x for p in first] == [1.0, 2.0, 3.0]

    moved = np.eye(4)
    moved[:3, 3] = (7.0, 0.0, 0.0)
    trajectory.replace(2, moved)
    trajectory.remove(3)
    second = path.message(Time()).poses   # frames 0, 1, 2 now: frame 3 left, frame 0 came back in
    assert [p.pose.position.x for p in second] == [0.0, 1.0, 7.0]
    assert second[1] is first[0]   # frame 1 unchanged: its message is reused
    assert second[2] is not first[1] and second[2].header.stamp == first[1].header.stamp


def test_the_inbox_merges_the_gaps_of_the_frames_it_drops():
    inbox = FrameInbox(keep_all=False, capacity=1, merge=InputFrame.after_dropped)
    rgb = np.zeros((2, 2, 3), np.uint8)
    for stamp_s, gap_s in ((1.0, 0.1), (9.0, 8.0), (9.1, 0.1)):
        inbox.put(InputFrame(rgb=rgb, stamp_ns=round(stamp_s * 1e9), gap_ns=round(gap_s * 1e9)))
    taken = inbox.get(0)
    assert (taken.stamp_ns, taken.gap_ns) == (9_100_000_000, 8_000_000_000)
    inbox.put(InputFrame(rgb=rgb, stamp_ns=10**10, gap_ns=None))     # the first after activate
    inbox.put(InputFrame(rgb=rgb, stamp_ns=10**10 + 1, gap_ns=1))
    assert inbox.get(0).gap_ns is None                                # unknown: the stamps decide


class _ParameterNode:
    """What params.on_set reads of the node, with a real Worker and a Mapper stand-in."""

    def __init__(self, apply_live, service_timeout_s=5.0):
        self._state_machine = SimpleNamespace(current_state=(3, "active"))
        self.refused_parameters, self.errors, self.logged = {}, [], []
        self.mapper = SimpleNamespace(apply_live=apply_live)
        self.worker = Worker(FrameInbox(keep_all=True, capacity=2), lambda frame: None, self.errors.append)
        self.worker.start()
        self.cfg = params.NodeSettings(service_timeout_s=service_timeout_s)
        self.safety = SafetyNet(SimpleNamespace(error=self.logged.append), self.errors.append)
        self._values = {name: field.default for name, field in params.FIELDS.items()}
        self._values["service_timeout_s"] = service_timeout_s

    def get_parameter(self, name):
        return SimpleNamespace(value=self._values[name])

    def get_logger(self):
        return SimpleNamespace(error=self.logged.append)


def _set_live(node, name, value):
    from rclpy.parameter import Parameter
    return params.on_set(node, [Parameter(name, value=value)])


def test_a_live_mapper_parameter_is_answered_after_the_worker_applied_it():
    applied = []
    node = _ParameterNode(lambda settings: applied.append(settings.min_confidence))
    result = _set_live(node, "min_confidence", 2.5)
    assert result.successful and applied == [2.5]          # applied before the answer
    assert node.worker.stop(5)


def test_a_worker_side_failure_of_a_live_parameter_is_the_answer_logged_and_counted():
    def apply_live(settings):
        raise RuntimeError("the Mapper could not take it (simulated)")

    node = _ParameterNode(apply_live)
    result = _set_live(node, "min_confidence", 2.5)
    assert not result.successful and "not applied: RuntimeError: the Mapper could not take it" in result.reason
    assert len(node.errors) == 1 and "live Mapper parameters" in node.errors[0]
    assert any("['min_confidence'] not applied" in text for text in node.logged)
    assert node.worker.stop(5)


def test_a_live_parameter_the_worker_does_not_get_to_in_time_is_refused_and_never_applied():
    applied, release = [], threading.Event()
    node = _ParameterNode(lambda settings: applied.append(settings.min_confidence), service_timeout_s=0.2)
    node.worker.submit(release.wait)                       # a long frame step holds the worker
    result = _set_live(node, "min_confidence", 2.5)
    assert not result.successful and "cancelled, nothing done" in result.reason
    release.set()
    assert node.worker.submit(lambda: "after").result(timeout=5) == "after"
    assert applied == []
    assert node.worker.stop(5)
