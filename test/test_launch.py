"""launch/map.launch.py with stub launch modules (launch and launch_ros are not on PyPI)."""
import importlib.util
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class _Recorder:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def _stubs(share: Path) -> dict:
    def module(name, **attrs):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        return mod

    class LaunchConfiguration(_Recorder):
        def __init__(self, name):
            super().__init__(name)
            self.name = name

    IfCondition = type("IfCondition", (_Recorder,), {})
    UnlessCondition = type("UnlessCondition", (_Recorder,), {})
    return {
        "launch": module("launch", LaunchDescription=lambda entities: list(entities)),
        "launch.actions": module("launch.actions", DeclareLaunchArgument=_Recorder),
        "launch.conditions": module("launch.conditions", IfCondition=IfCondition,
                                    UnlessCondition=UnlessCondition),
        "launch.substitutions": module("launch.substitutions", LaunchConfiguration=LaunchConfiguration,
                                       PythonExpression=_Recorder),
        "launch_ros": module("launch_ros"),
        "launch_ros.actions": module("launch_ros.actions", Node=_Recorder),
        "ament_index_python": module("ament_index_python"),
        "ament_index_python.packages": module(
            "ament_index_python.packages", get_package_share_directory=lambda pkg: str(share / pkg)),
    }


def test_launch_description(monkeypatch, tmp_path):
    for name, mod in _stubs(tmp_path).items():
        monkeypatch.setitem(sys.modules, name, mod)
    spec = importlib.util.spec_from_file_location("map_launch", REPO / "launch" / "map.launch.py")
    launch_file = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launch_file)
    entities = launch_file.generate_launch_description()

    arguments = {e.args[0]: e.kwargs for e in entities if "default_value" in e.kwargs}
    assert set(arguments) == {"params_file", "checkpoint", "image", "compressed", "namespace",
                              "use_sim_time", "device"}
    assert arguments["params_file"]["default_value"] == str(tmp_path / "lingbot_ros" / "config" / "map.yaml")

    nodes = [e for e in entities if "package" in e.kwargs]
    assert len(nodes) == 2      # raw and compressed, exactly one enabled by the `compressed` argument
    for node in nodes:
        kw = node.kwargs
        assert (kw["package"], kw["executable"], kw["name"]) == ("lingbot_ros", "map_node", "map_node")
        assert kw["parameters"][0].name == "params_file"
        overrides = kw["parameters"][1]
        assert overrides["checkpoint"].name == "checkpoint" and overrides["device"].name == "device"
        assert kw["namespace"].name == "namespace"
    raw, compressed = nodes
    assert raw.kwargs["parameters"][1]["image_transport"] == "raw"
    assert raw.kwargs["remappings"][0][0] == "~/image" and raw.kwargs["remappings"][0][1].name == "image"
    assert compressed.kwargs["parameters"][1]["image_transport"] == "compressed"
    source, target = compressed.kwargs["remappings"][0]
    assert source == "~/image/compressed" and target[0].name == "image" and target[1] == "/compressed"
    assert type(raw.kwargs["condition"]).__name__ == "UnlessCondition"
    assert type(compressed.kwargs["condition"]).__name__ == "IfCondition"
    assert compressed.kwargs["condition"].args[0].name == "compressed"


def test_launch_executable_is_installed_by_setup_and_cmake():
    assert (REPO / "libexec" / "map_node").stat().st_mode & 0o111
    cmake = (REPO / "CMakeLists.txt").read_text()
    assert "rosidl_generate_interfaces" in cmake and "lib/${PROJECT_NAME}" in cmake
