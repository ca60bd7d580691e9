"""launch/map.launch.py run for real: launch.LaunchService in a subprocess starts map_node, and a
probe node in an isolated DDS domain reads the node's parameters, lifecycle state and
subscriptions from the ROS graph.

The launch packages come from ../shared/vendor (scripts/install_ros2cli.sh, run by setup.sh). The
files under test are this checkout's: an overlay prefix links launch/, config/, rviz/ and the
map_node executable, and PYTHONPATH points at the sources. The node loads the tiny fixture
checkpoint on CPU. No fixed sleeps: every wait polls with a deadline of at least 30 s.
"""
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import missing, need_module, need_path  # noqa: I001 (before the ROS imports it guards)

INSTALL = "scripts/install_ros2cli.sh installs it from ../shared/vendor; scripts/setup.sh runs it"
need_module("launch_ros", INSTALL, module_level=True)
import launch  # noqa: E402

if not hasattr(launch, "LaunchService"):   # the repo's launch/ folder seen as a namespace package
    missing("the ROS launch package", INSTALL, module_level=True)
import rclpy  # noqa: E402
import rclpy.parameter  # noqa: E402
from lifecycle_msgs.srv import GetState  # noqa: E402
from rcl_interfaces.srv import GetParameters  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402

from helpers import background_spin, call_service, wait_until  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 60.0
# Runs a launch file as `ros2 launch` does: arguments NAME:=VALUE, SIGINT shuts it down.
RUNNER = """
import sys
import launch
from launch.actions import IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
service = launch.LaunchService()
service.include_launch_description(IncludeLaunchDescription(
    PythonLaunchDescriptionSource(sys.argv[1]),
    launch_arguments=[tuple(a.split(":=", 1)) for a in sys.argv[2:]]))
sys.exit(service.run())
"""
NODE_TOPICS = ["/map_node/pose", "/map_node/path", "/map_node/map", "/map_node/points",
               "/map_node/depth/image"]


def make_overlay(prefix: Path, packages: dict) -> Path:
    """An ament prefix holding the given packages: name -> {relative path: file to link}."""
    for name, files in packages.items():
        marker = prefix / "share" / "ament_index" / "resource_index" / "packages" / name
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        for relative, target in files.items():
            link = prefix / relative
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(target)
    return prefix


@pytest.fixture(scope="module")
def overlay(tmp_path_factory) -> Path:
    """This checkout installed as the ament package lingbot_ros (links, nothing copied)."""
    share = "share/lingbot_ros"
    return make_overlay(tmp_path_factory.mktemp("overlay"), {"lingbot_ros": {
        f"{share}/package.xml": REPO / "package.xml", f"{share}/launch": REPO / "launch",
        f"{share}/config": REPO / "config", f"{share}/rviz": REPO / "rviz",
        "lib/lingbot_ros/map_node": REPO / "libexec" / "map_node"}})


@pytest.fixture
def launch_file(overlay, monkeypatch):
    """The launch file as a module, resolving the package share through the overlay."""
    monkeypatch.setenv("AMENT_PREFIX_PATH", f"{overlay}{os.pathsep}{os.environ.get('AMENT_PREFIX_PATH', '')}")
    spec = importlib.util.spec_from_file_location("map_launch", overlay / "share/lingbot_ros/launch/map.launch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tiny_params(shared_dir, tmp_path) -> Path:
    """A params file that selects the tiny fixture model on CPU."""
    fixture = shared_dir / "fixtures" / "tiny_default"
    need_path(fixture / "ckpt.pt", "tiny fixture")
    path = tmp_path / "my.yaml"
    path.write_text("/**:\n  ros__parameters:\n"
                    f"    checkpoint: {fixture / 'ckpt.pt'}\n    model_config: {fixture / 'config.json'}\n"
                    "    image_width: 112\n    device: cpu\n    warmup: false\n")
    return path


class LaunchRun:
    """One launch subprocess (its own process group) plus a probe node in the same DDS domain."""

    def __init__(self, tmp_path: Path, overlay: Path):
        # Domains 1..100: isolated from other test runs, below the ids whose DDS ports fall in
        # Linux's ephemeral range.
        self.domain = 1 + (os.getpid() + time.time_ns() // 10**6) % 100
        self.env = dict(
            os.environ, ROS_DOMAIN_ID=str(self.domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
            AMENT_PREFIX_PATH=f"{overlay}{os.pathsep}{os.environ.get('AMENT_PREFIX_PATH', '')}",
            PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            # map_node's `#!/usr/bin/env python3` must find this interpreter.
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            FASTDDS_DEFAULT_PROFILES_FILE=str(REPO / "config" / "fastdds.xml"),
            ROS_LOG_DIR=str(tmp_path / "ros_log"), PYTHONUNBUFFERED="1")
        os.environ["FASTDDS_DEFAULT_PROFILES_FILE"] = self.env["FASTDDS_DEFAULT_PROFILES_FILE"]
        self.launch_path = overlay / "share/lingbot_ros/launch/map.launch.py"
        self.tmp_path = tmp_path
        self.log = open(tmp_path / "launch.log", "w+")
        self.proc: subprocess.Popen | None = None
        self.context = Context()
        rclpy.init(context=self.context, domain_id=self.domain)
        self.node = rclpy.create_node("launch_probe", context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.spin = background_spin(self.executor)

    def start(self, *arguments: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(self.launch_path), *arguments],
                                     env=self.env, cwd=self.tmp_path, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def wait(self, condition, what: str, timeout: float = TIMEOUT):
        return wait_until(condition, what, timeout, details=lambda: "launch output:\n" + self.output()[-4000:])

    def started_pids(self) -> list[int]:
        return [int(pid) for pid in re.findall(r"process started with pid \[(\d+)\]", self.output())]

    def call(self, srv_type, name: str, request, attempts: int = 1):
        client = self.node.create_client(srv_type, name)
        self.wait(lambda: client.service_is_ready(), f"service {name}")
        try:
            return call_service(client, request, name, TIMEOUT, attempts,
                                details=lambda: "launch output:\n" + self.output()[-4000:])
        finally:
            self.node.destroy_client(client)

    def parameters(self, node: str, names: list[str]) -> dict:
        response = self.call(GetParameters, f"{node}/get_parameters", GetParameters.Request(names=names), attempts=3)
        return {name: rclpy.parameter.parameter_value_to_python(value)
                for name, value in zip(names, response.values)}

    def state(self, node: str) -> str:
        return self.call(GetState, f"{node}/get_state", GetState.Request(), attempts=3).current_state.label

    def subscriptions(self, name: str, namespace: str) -> dict:
        if (name, namespace) not in self.node.get_node_names_and_namespaces():
            return {}
        return dict(self.node.get_subscriber_names_and_types_by_node(name, namespace))

    def wait_subscribed(self, name: str, namespace: str, topic: str, msg_type: str) -> dict:
        """The node's subscriptions once it subscribes to ``topic`` (map_node does at activate)."""
        def subscribed():
            subscriptions = self.subscriptions(name, namespace)
            return subscriptions if msg_type in subscriptions.get(topic, []) else None

        return self.wait(subscribed, f"{namespace}/{name} to subscribe to {topic} ({msg_type})")

    def close(self) -> None:
        """Ctrl-C as a terminal sends it (SIGINT to the whole process group: launch does not
        forward a user's SIGINT); then kill whatever of the group is left, and check that every
        process launch started is gone."""
        if self.proc is not None:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGINT)
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(30)
        pids = self.started_pids()
        self.spin.stop()
        self.node.destroy_node()
        self.context.try_shutdown()
        self.log.close()
        wait_until(lambda: not any(_alive(pid) for pid in pids), f"launched processes {pids} to exit", 30)


def _node_lines(output: str) -> str:
    """What map_node itself logged, from launch's output (launch prefixes it with the process name)."""
    return "".join(line for line in output.splitlines(True) if line.startswith("[map_node-1] ["))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def run(tmp_path, overlay):
    session = LaunchRun(tmp_path, overlay)
    yield session
    session.close()


# -- the launch file's argument handling (no processes) -----------------------------------------

def test_arguments_not_given_override_nothing(launch_file):
    not_given = {name: default for name, default, _ in launch_file.ARGUMENTS}
    assert launch_file.parameter_overrides(not_given) == {}


def test_given_arguments_become_typed_parameters(launch_file):
    overrides = launch_file.parameter_overrides({
        "checkpoint": "/w/x.pt", "model_config": "tiny", "device": "cuda:1", "compressed": "True", "use_camera_info": "false",
        "use_sim_time": "1", "autostart": "false", "image": "/cam/image_raw", "namespace": "r1"})
    assert overrides == {"checkpoint": "/w/x.pt", "model_config": "tiny", "device": "cuda:1",
                         "image_transport": "compressed",
                         "use_camera_info": False, "use_sim_time": True, "autostart": False}
    assert launch_file.parameter_overrides({"compressed": "false"}) == {"image_transport": "raw"}


def test_a_camera_rig_from_arguments(launch_file):
    given = {"cameras": "front, back", "primary_camera": "back", "camera_images": "/f/image_raw,/b/image_raw",
             "image": "/camera/image_raw"}
    assert launch_file.parameter_overrides(given) == {"cameras": ["front", "back"], "primary_camera": "back"}
    assert launch_file.image_remappings(given) == [("~/front/image", "/f/image_raw"), ("~/back/image", "/b/image_raw")]
    assert launch_file.image_remappings({"image": "/cam"}) == [("~/image", "/cam")]
    with pytest.raises(launch_file.LaunchArgumentError, match="1 topic.* for 2 camera"):
        launch_file.image_remappings({**given, "camera_images": "/f/image_raw"})
    with pytest.raises(launch_file.LaunchArgumentError, match="camera_images needs cameras"):
        launch_file.image_remappings({"camera_images": "/f/image_raw", "image": ""})


def test_a_bad_boolean_names_the_argument(launch_file):
    with pytest.raises(launch_file.LaunchArgumentError, match="use_sim_time:=yes"):
        launch_file.parameter_overrides({"use_sim_time": "yes"})


def test_the_declared_arguments(launch_file):
    names = [name for name, _, _ in launch_file.ARGUMENTS]
    assert names == ["params_file", "checkpoint", "model_config", "device", "image", "compressed", "use_camera_info",
                     "cameras", "primary_camera", "camera_images", "namespace", "use_sim_time", "autostart",
                     "log_level", "rviz"]
    defaults = {name: default for name, default, _ in launch_file.ARGUMENTS}
    assert Path(defaults["params_file"]).resolve() == (REPO / "config" / "map.yaml").resolve()


# -- the launch file run for real ------------------------------------------------------------------

def test_the_params_file_is_used_when_no_argument_overrides_it(run, tiny_params, shared_dir):
    # The defect: checkpoint/device defaults of the launch file used to replace the file's values.
    run.start(f"params_file:={tiny_params}", "image:=/foo")
    subscriptions = run.wait_subscribed("map_node", "/", "/foo", "sensor_msgs/msg/Image")
    assert "/foo/compressed" not in subscriptions and "/camera_info" not in subscriptions
    assert "/clock" not in subscriptions
    fixture = shared_dir / "fixtures" / "tiny_default"
    assert run.parameters("/map_node", ["checkpoint", "model_config", "image_width", "device", "warmup",
                                        "use_sim_time", "image_transport", "autostart"]) == {
        "checkpoint": str(fixture / "ckpt.pt"), "model_config": str(fixture / "config.json"),
        "image_width": 112, "device": "cpu", "warmup": False, "use_sim_time": False,
        "image_transport": "raw", "autostart": True}
    assert run.state("/map_node") == "active"    # configure loaded that checkpoint
    assert "[INFO]" in _node_lines(run.output())  # the default log_level (test_namespace_... lowers it)


def test_a_camera_rig_launched(run, tiny_params):
    run.start(f"params_file:={tiny_params}", "cameras:=front,back", "camera_images:=/f/image_raw,/b/image_raw")
    run.wait_subscribed("map_node", "/", "/f/image_raw", "sensor_msgs/msg/Image")
    subscriptions = run.wait_subscribed("map_node", "/", "/b/image_raw", "sensor_msgs/msg/Image")
    assert "/camera/image_raw" not in subscriptions
    assert run.parameters("/map_node", ["cameras", "primary_camera"]) == {"cameras": ["front", "back"],
                                                                         "primary_camera": ""}
    assert run.state("/map_node") == "active"


def test_given_arguments_override_the_params_file(run, tiny_params, shared_dir, tmp_path):
    other = tmp_path / "other.pt"    # the same weights under another name: visibly not the file's
    other.symlink_to(shared_dir / "fixtures" / "tiny_default" / "ckpt.pt")
    config = shared_dir / "fixtures" / "tiny_default" / "config.json"
    # The file names the released architecture, which the tiny checkpoint does not fit: only the
    # model_config argument makes configure succeed.
    tiny_params.write_text(tiny_params.read_text().replace("device: cpu", "device: cuda:7").replace(
        f"model_config: {config}", "model_config: lingbot-map"))
    run.start(f"params_file:={tiny_params}", f"checkpoint:={other}", "device:=cpu", "image:=/foo",
              "compressed:=true", "use_sim_time:=true", f"model_config:={config}")
    run.wait_subscribed("map_node", "/", "/foo/compressed", "sensor_msgs/msg/CompressedImage")
    assert run.parameters("/map_node", ["checkpoint", "model_config", "device", "image_transport", "use_sim_time",
                                        "image_width"]) == {
        "checkpoint": str(other), "model_config": str(config), "device": "cpu", "image_transport": "compressed",
        "use_sim_time": True, "image_width": 112}
    # use_sim_time: the node listens to /clock.
    assert "/clock" in run.subscriptions("map_node", "/")


def test_namespace_relative_image_and_camera_info(run, tiny_params):
    run.start(f"params_file:={tiny_params}", "namespace:=robot1", "image:=camera/image_raw",
              "use_camera_info:=true", "log_level:=warn")
    subscriptions = run.wait_subscribed("map_node", "/robot1", "/robot1/camera/image_raw",
                                        "sensor_msgs/msg/Image")
    assert subscriptions["/robot1/camera/camera_info"] == ["sensor_msgs/msg/CameraInfo"]
    assert run.state("/robot1/map_node") == "active"
    # log_level:=warn reached the node: none of its info lines (model loaded, active) were logged.
    assert "[INFO]" not in _node_lines(run.output())


def test_autostart_false_starts_an_unconfigured_lifecycle_node(run, tiny_params):
    run.start(f"params_file:={tiny_params}", "autostart:=false")
    assert run.state("/map_node") == "unconfigured"
    assert run.parameters("/map_node", ["autostart"]) == {"autostart": False}
    # The LifecycleNode action: launch's own node follows the transitions of map_node.
    watchers = run.wait(lambda: run.node.get_subscriptions_info_by_topic("/map_node/transition_event"),
                        "a subscriber of /map_node/transition_event")
    assert any(w.node_name.startswith("launch_ros") for w in watchers), [w.node_name for w in watchers]
    assert run.subscriptions("map_node", "/").get("/camera/image_raw") is None


def test_rviz_without_rviz2_says_so_and_starts_the_node(run, tiny_params):
    run.start(f"params_file:={tiny_params}", "rviz:=true")
    run.wait_subscribed("map_node", "/", "/camera/image_raw", "sensor_msgs/msg/Image")
    assert "rviz:=true, but rviz2 is not installed here" in run.output()
    assert len(run.started_pids()) == 1


def test_rviz_starts_rviz2_with_the_config_and_follows_the_namespace(run, tiny_params, tmp_path):
    # A stand-in rviz2 package that records its command line: the launch file finds it through
    # the ament index exactly as it would find the real one.
    record, params = tmp_path / "rviz2_args.txt", tmp_path / "rviz2_params.yaml"
    fake = tmp_path / "fake_rviz2"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {record}.tmp\n"
                    f"for a; do [ \"$prev\" = --params-file ] && cat \"$a\" >> {params}; prev=$a; done\n"
                    f"mv {record}.tmp {record}\nexec sleep 600\n")
    fake.chmod(0o755)
    prefix = make_overlay(tmp_path / "rviz_prefix", {"rviz2": {"lib/rviz2/rviz2": fake}})
    run.env["AMENT_PREFIX_PATH"] = f"{prefix}{os.pathsep}{run.env['AMENT_PREFIX_PATH']}"
    run.start(f"params_file:={tiny_params}", "rviz:=true", "namespace:=robot1", "use_sim_time:=true")
    run.wait_subscribed("map_node", "/robot1", "/camera/image_raw", "sensor_msgs/msg/Image")
    args = run.wait(lambda: record.exists() and record.read_text().split("\n"), "rviz2 to start")
    config = args[args.index("-d") + 1]
    assert Path(config).resolve() == (REPO / "rviz" / "map.rviz").resolve()
    remaps = {args[i + 1] for i, arg in enumerate(args) if arg == "-r"}
    assert {f"{topic}:=/robot1{topic}" for topic in NODE_TOPICS} <= remaps
    assert "use_sim_time: true" in params.read_text()
