"""The harness of the tests that run map_node over real DDS: the node and the replay tool as
subprocesses, the test as a probe node, an isolated domain. Not a test module itself.

Uses the tiny fixture checkpoint (../shared/fixtures/tiny_default) at a 112-pixel input width on
CPU, the courthouse bag, and synthetic images published by the probe. No fixed sleeps: every wait
polls a condition with a generous deadline.
"""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from lifecycle_msgs.msg import Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState, GetState  # noqa: E402
from rcl_interfaces.srv import SetParameters  # noqa: E402
from geometry_msgs.msg import PoseStamped  # noqa: E402
from nav_msgs.msg import Path as PathMsg  # noqa: E402
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from rosgraph_msgs.msg import Clock  # noqa: E402
from sensor_msgs.msg import CompressedImage, Image  # noqa: E402

from conftest import wait_until  # noqa: E402
from ros_teardown import shut_down  # noqa: E402
from lingbot_ros.io.image_codec import fill_compressed, fill_image  # noqa: E402

try:
    from lingbot_ros.msg import MapStatus
    from lingbot_ros.srv import SaveMap  # noqa: F401 (for the tests)
except ImportError:
    pytest.skip("lingbot_ros interfaces not generated (run scripts/setup.sh)", allow_module_level=True)

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 30.0
BAG_TOPIC = "/camera/image_raw/compressed"
BAG_START_NS = 1_700_000_000 * 10**9


@pytest.fixture
def tiny(shared_dir):
    fixture = shared_dir / "fixtures" / "tiny_default"
    bag = shared_dir / "data" / "courthouse_bag"
    if not (fixture / "ckpt.pt").exists() or not bag.is_dir():
        pytest.skip(f"tiny fixture or courthouse bag missing under {shared_dir}")
    return fixture, bag


class Ros:
    """Probe node in its own context and domain, plus the subprocesses of one test.

    The probe is spun by one background executor thread; the test thread only creates
    entities, publishes and waits on futures (call_async + polling, never spinning itself).
    """

    def __init__(self, domain: int, log_dir: Path):
        self.domain = domain
        self.env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
                        FASTDDS_DEFAULT_PROFILES_FILE=str(REPO / "config" / "fastdds.xml"),
                        ROS_LOG_DIR=str(log_dir), PYTHONUNBUFFERED="1")
        # The probe's participant must use the same transports as the subprocesses.
        os.environ["FASTDDS_DEFAULT_PROFILES_FILE"] = self.env["FASTDDS_DEFAULT_PROFILES_FILE"]
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain)
        self.node = rclpy.create_node("probe", context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()
        self.procs: list[subprocess.Popen] = []
        self.clients: dict = {}
        self.logs: dict = {}
        self.statuses: list = []
        self.poses: list = []
        self.paths: list = []
        self.diagnostics: list = []
        self.clock: list = []
        latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                             reliability=ReliabilityPolicy.RELIABLE)
        self.node.create_subscription(MapStatus, "/map_node/status", self.statuses.append, latched)
        self.node.create_subscription(PoseStamped, "/map_node/pose", self.poses.append, 100)
        self.node.create_subscription(PathMsg, "/map_node/path", self.paths.append, 100)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self.diagnostics.append, 10)
        self.node.create_subscription(Clock, "/clock", self.clock.append, 100)

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(Path(self.env["ROS_LOG_DIR"]) / f"{name}.log", "w+")
        proc = subprocess.Popen([sys.executable, *args], env=self.env, cwd=REPO, stdout=log,
                                stderr=subprocess.STDOUT)
        self.procs.append(proc)
        self.logs[proc.pid] = log
        return proc

    def output(self, proc) -> str:
        log = self.logs[proc.pid]
        log.flush()
        log.seek(0)
        return log.read()

    def start_node(self, fixture: Path, *params: str, autostart=True) -> subprocess.Popen:
        base = [f"checkpoint:={fixture / 'ckpt.pt'}", f"model_config:={fixture / 'config.json'}",
                "num_scale_frames:=3", "sliding_window:=4", "image_width:=112", "device:=cpu",
                "image_transport:=compressed", "diagnostics_period_s:=0.5", "warmup:=false",
                f"autostart:={'true' if autostart else 'false'}"]
        args = ["-m", "lingbot_ros.ros.main", "--ros-args", "-r", f"/map_node/image/compressed:={BAG_TOPIC}"]
        for p in base + list(params):
            args += ["-p", p]
        return self.start("map_node", args)

    def replay(self, bag: Path, *extra: str) -> subprocess.Popen:
        return self.start("replay", ["-m", "lingbot_ros.tools.replay", str(bag), "--rate", "4",
                                     "--wait-for-subscribers", "20", "--quiet", *extra])

    def wait(self, condition, what: str, timeout: float = TIMEOUT):
        return wait_until(condition, what, timeout, details=self._last_status_and_logs)

    def _last_status_and_logs(self) -> str:
        logs = "\n".join(self.output(p)[-2000:] for p in self.procs)
        return f"last status: {self.statuses[-1] if self.statuses else None}\n{logs}"

    def call(self, srv_type, name: str, request):
        """One service call from the test thread; the background executor delivers the reply."""
        client = self.clients.get(name)
        if client is None:
            client = self.clients[name] = self.node.create_client(srv_type, name)
        assert client.wait_for_service(timeout_sec=TIMEOUT), f"service {name} did not appear"
        future = client.call_async(request)
        self.wait(future.done, f"the response of {name}")
        return future.result()

    def transition(self, transition: int, expected: str, succeeds: bool = True) -> None:
        response = self.call(ChangeState, "/map_node/change_state",
                             ChangeState.Request(transition=Transition(id=transition)))
        assert response.success == succeeds, f"transition {transition}: success {response.success}"
        assert self.state() == expected

    def set_parameter(self, parameter) -> None:
        result = self.call(SetParameters, "/map_node/set_parameters", SetParameters.Request(parameters=[parameter]))
        assert result.results[0].successful, result.results[0].reason

    def state(self) -> str:
        return self.call(GetState, "/map_node/get_state", GetState.Request()).current_state.label

    def settled(self):
        """Last status once every received frame is accounted for and nothing is in flight."""
        if not self.statuses:
            return None
        s = self.statuses[-1]
        # A frame buffered for phase 1 is accounted for (init_frames) but not processed until placed.
        if s.frames_received and (s.frames_processed + s.init_frames + s.frames_dropped + s.frames_rejected
                                  == s.frames_received):
            return s
        return None

    def settled_with(self, processed: int):
        status = self.settled()
        return status if status and status.frames_processed == processed else None

    def pose_stamps(self, count: int, start: int = 0) -> list[int]:
        """Stamps of the poses from index start on, once count of them arrived: a status and the
        pose of the same frame travel on different topics, so the status may come first."""
        self.wait(lambda: len(self.poses) - start >= count, f"{count} poses")
        return [p.header.stamp.sec * 10**9 + p.header.stamp.nanosec for p in self.poses[start:]]

    def diagnostic(self, key: str) -> str | None:
        if not self.diagnostics:
            return None
        return {kv.key: kv.value for kv in self.diagnostics[-1].status[0].values}.get(key)

    def close(self):
        shut_down(self.procs, self.executor, self.thread, self.node, self.context)
        for log in self.logs.values():
            log.close()


@pytest.fixture
def ros(tmp_path):
    # Domains 1..100: isolated from other test runs, and below the ids whose DDS ports fall in
    # Linux's ephemeral range.
    domain = 1 + (os.getpid() + time.time_ns() // 10**6) % 100
    env = Ros(domain, tmp_path)
    yield env
    env.close()


def interrupt_and_check_exit(ros, proc):
    proc.send_signal(signal.SIGINT)
    assert proc.wait(20) == 0, ros.output(proc)[-3000:]


def _rgb(i: int) -> np.ndarray:
    """A 96x128 blocky random image: textured enough for the model, cheap to encode."""
    rng = np.random.default_rng(i)
    return rng.integers(0, 255, (12, 16, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1)


def _stamped(msg, stamp_s: float):
    msg.header.stamp.sec, msg.header.stamp.nanosec = int(stamp_s), round(stamp_s % 1 * 1e9)
    msg.header.frame_id = "cam"
    return msg


def _jpeg(i: int, stamp_s: float) -> CompressedImage:
    return _stamped(fill_compressed(CompressedImage(), _rgb(i)), stamp_s)


def _raw(i: int, stamp_s: float) -> Image:
    return _stamped(fill_image(Image(), _rgb(i), "rgb8"), stamp_s)


def _string_parameter(name: str, value: str) -> Parameter:
    return Parameter(name=name, value=ParameterValue(type=ParameterType.PARAMETER_STRING,
                                                     string_value=value))


def courthouse_jpegs(shared_dir, count: int) -> list[bytes]:
    """The first ``count`` courthouse JPEG files (518x294 camera frames)."""
    files = sorted((shared_dir / "data" / "courthouse_jpg").glob("*.jpg"))[:count]
    if len(files) < count:
        pytest.skip(f"courthouse_jpg missing under {shared_dir}")
    return [f.read_bytes() for f in files]


def jpeg_message(data: bytes, stamp_s: float) -> CompressedImage:
    return _stamped(CompressedImage(format="jpeg", data=data), stamp_s)


def _publish_when_matched(ros, msg_type, topic: str, messages: list) -> None:
    publisher = ros.node.create_publisher(msg_type, topic, QoSProfile(
        depth=50, reliability=ReliabilityPolicy.RELIABLE))
    ros.wait(publisher.get_subscription_count, f"the node's subscription to {topic}")
    for msg in messages:
        publisher.publish(msg)


