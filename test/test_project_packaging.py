"""What the package declares and installs: package.xml against the code's imports, setup.py's extras
and data files against the requirement files and the tree, the CMake install of a ROS workspace,
and the shipped RViz config and Foxglove layout against the node's topics."""
import ast
import json
import os
import runpy
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import setuptools
import yaml

from helpers import missing, need_path
from lingbot_ros.viewer.live_view import VISER_PIN

REPO = Path(__file__).resolve().parents[1]
# The node's outputs that the RViz config and the Foxglove layout show.
VIEWED_TOPICS = {"/map_node/pose", "/map_node/path", "/map_node/map", "/map_node/points",
                 "/map_node/depth/image"}
# Python modules that are not ROS packages, by their rosdep keys.
ROSDEP_KEYS = {"numpy": "python3-numpy", "PIL": "python3-pil", "cv2": "python3-opencv",
               "yaml": "python3-yaml", "torch": "python3-pytorch-pip", "rosbags": "python3-rosbags-pip",
               "simplejpeg": "python3-simplejpeg-pip", "tqdm": "python3-tqdm"}
# Declared but not imported by name: rclpy.lifecycle needs lifecycle_msgs, and generated
# interfaces need rosidl_default_runtime.
INDIRECT_DEPENDS = {"lifecycle_msgs", "rosidl_default_runtime"}
# Imported only where present, never declared: FlashInfer is the [gpu] extra, viser the [viewer] one.
OPTIONAL_IMPORTS = {"flashinfer", "viser"}


def _imported_top_level_modules(paths) -> set:
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"lingbot_ros", "__future__"}


def _exec_depends() -> set:
    root = ET.parse(REPO / "package.xml").getroot()
    return {e.text for e in root.iter() if e.tag in ("exec_depend", "depend")}


def test_package_xml_declares_exactly_what_the_code_imports():
    sources = list((REPO / "lingbot_ros").rglob("*.py")) + list((REPO / "launch").glob("*.py")) \
        + list((REPO / "libexec").iterdir())
    used = {ROSDEP_KEYS.get(m, m) for m in _imported_top_level_modules(sources) - OPTIONAL_IMPORTS}
    declared = _exec_depends()
    assert used - declared == set(), "imported but not an exec_depend in package.xml"
    assert declared - used - INDIRECT_DEPENDS == set(), "declared in package.xml but never imported"
    assert {"tf2_ros", "tf2_msgs"} <= declared and "visualization_msgs" not in declared


def _setup_kwargs(monkeypatch) -> dict:
    captured = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: captured.update(kwargs))
    monkeypatch.chdir(REPO)
    runpy.run_path(str(REPO / "setup.py"))
    return captured


def _pins(path: Path) -> list:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def test_setup_extras_are_the_pinned_requirement_files(monkeypatch):
    extras = _setup_kwargs(monkeypatch)["extras_require"]
    assert extras["ros"] == _pins(REPO / "requirements-ros.txt")
    assert extras["ros-jazzy"] == _pins(REPO / "requirements-ros-jazzy.txt")
    assert all(pin.startswith("ros-kilted-") for pin in extras["ros"])
    assert all(pin.startswith("ros-jazzy-") for pin in extras["ros-jazzy"])
    # Same packages in both distros, and no visualization_msgs (nothing uses it).
    assert [p.split("==")[0][len("ros-kilted-"):] for p in extras["ros"]] == \
        [p.split("==")[0][len("ros-jazzy-"):] for p in extras["ros-jazzy"]]
    assert not any("visualization" in pin for pins in extras.values() for pin in pins)
    # The live view's viser: the one pin in the extra, the dev requirements and the error text.
    assert extras["viewer"] == [VISER_PIN] and VISER_PIN in _pins(REPO / "requirements-dev.txt")


def test_setup_installs_rviz_and_the_layout_to_share(monkeypatch):
    data_files = dict(_setup_kwargs(monkeypatch)["data_files"])
    assert sorted(data_files["share/lingbot_ros/rviz"]) == ["rviz/foxglove_layout.json", "rviz/map.rviz"]
    assert data_files["share/lingbot_ros/launch"] == ["launch/map.launch.py"]


@pytest.mark.slow
def test_cmake_install_lays_out_a_ros_workspace_package(tmp_path):
    """The colcon path: CMakeLists.txt configured and installed into a fresh prefix."""
    if shutil.which("cmake") is None:
        missing("cmake", "install it (apt-get install cmake): scripts/setup.sh generates the interfaces with it")
    prefix = Path(sys.prefix)
    need_path(prefix / "share" / "ament_cmake" / "cmake", "ament_cmake", "requirements-interfaces*.txt bring it: run scripts/setup.sh")
    env = dict(os.environ, AMENT_PREFIX_PATH=str(prefix), CMAKE_PREFIX_PATH=str(prefix))
    # A workspace's src/ copy: with the venv inside the checkout (.venv), CMake would refuse the
    # venv's numpy include folder as a path "in the source directory".
    source = tmp_path / "src" / "lingbot_ros"
    for name in ("CMakeLists.txt", "package.xml"):
        source.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, source / name)
    for name in ("lingbot_ros", "launch", "config", "rviz", "libexec", "msg", "srv"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    build, install = tmp_path / "build", tmp_path / "install"
    for cmd in (["cmake", "-S", str(source), "-B", str(build), "-DBUILD_TESTING=OFF",
                 f"-DCMAKE_INSTALL_PREFIX={install}", f"-DPython3_EXECUTABLE={sys.executable}"],
                ["cmake", "--build", str(build), "-j", "2"], ["cmake", "--install", str(build)]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    share = install / "share" / "lingbot_ros"
    for relative in ("launch/map.launch.py", "config/map.yaml", "rviz/map.rviz", "rviz/foxglove_layout.json",
                     "package.xml"):
        assert (share / relative).is_file(), relative
    assert os.access(install / "lib" / "lingbot_ros" / "map_node", os.X_OK)
    # The hand-written Python package is copied over the generated one (no
    # ament_python_install_package): our __init__.py, the sources, and the generated msg beside them.
    site = next(install.glob("lib/python3*/site-packages/lingbot_ros"))
    assert (site / "__init__.py").read_text() == (REPO / "lingbot_ros" / "__init__.py").read_text()
    assert (site / "ros" / "topics.py").is_file() and (site / "msg" / "__init__.py").is_file()


def _rviz_displays() -> list:
    config = yaml.safe_load((REPO / "rviz" / "map.rviz").read_text())
    assert config["Visualization Manager"]["Global Options"]["Fixed Frame"] == "map"
    return config["Visualization Manager"]["Displays"]


def test_rviz_config_shows_the_nodes_outputs():
    displays = {(d["Class"].split("/")[-1], d.get("Topic", {}).get("Value")): d for d in _rviz_displays()}
    assert ("TF", None) in displays
    for kind, topic in [("Pose", "/map_node/pose"), ("Path", "/map_node/path"),
                        ("PointCloud2", "/map_node/map"), ("PointCloud2", "/map_node/points"),
                        ("Image", "/map_node/depth/image")]:
        assert (kind, topic) in displays, (kind, topic)
    for cloud in ("/map_node/map", "/map_node/points"):
        assert displays[("PointCloud2", cloud)]["Color Transformer"] == "RGB8"
    # The map is latched by the node: a late RViz must ask for the last one.
    assert displays[("PointCloud2", "/map_node/map")]["Topic"]["Durability Policy"] == "Transient Local"
    topics = {topic for _, topic in displays if topic}
    assert VIEWED_TOPICS <= topics and all(t.startswith("/map_node/") for t in topics)
    assert "/map_node/status" in (REPO / "rviz" / "map.rviz").read_text()


def test_foxglove_layout_has_pose_path_map_depth_and_status_panels():
    layout = json.loads((REPO / "rviz" / "foxglove_layout.json").read_text())
    panels = layout["configById"]

    def placed(node):
        return {node} if isinstance(node, str) else placed(node["first"]) | placed(node["second"])

    assert placed(layout["layout"]) == set(panels)     # every panel is on screen, none dangling
    scene = next(config for name, config in panels.items() if name.startswith("3D!"))
    assert {"/map_node/pose", "/map_node/path", "/map_node/map", "/map_node/points"} <= set(scene["topics"])
    assert scene["followTf"] == "map"
    image = next(config for name, config in panels.items() if name.startswith("Image!"))
    assert image["imageMode"]["imageTopic"] == "/map_node/depth/image"
    raw = next(config for name, config in panels.items() if name.startswith("RawMessages!"))
    assert raw["topicPath"] == "/map_node/status"


def test_every_console_script_is_also_a_ros2_run_executable(monkeypatch):
    """`ros2 run lingbot_ros NAME` (lib/lingbot_ros/NAME, colcon and venv alike) for every tool:
    the wrapper calls the console script's own main."""
    scripts = _setup_kwargs(monkeypatch)["entry_points"]["console_scripts"]
    targets = {}
    for line in scripts:
        _, target = (part.strip() for part in line.split("="))
        module, function = target.split(":")
        targets[module] = function
    wrapped = {}
    for path in (REPO / "libexec").iterdir():
        assert os.access(path, os.X_OK), path
        tree = ast.parse(path.read_text())
        imports = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        assert len(imports) == 1, path
        wrapped[imports[0].module] = imports[0].names[0].name
    assert wrapped == targets
