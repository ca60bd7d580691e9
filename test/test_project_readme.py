"""The README run as a user runs it, in the venv over real DDS: its quick-start demo, its `ros2`
commands (the launch line included) against the node that launch line starts, fed by the README's
bag replay, and its generated table of topics, services and parameters against the code. The
commands are read from the README itself, so it cannot drift from what works. They run the
installed copy (scripts/setup.sh).
"""
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import SETUP, missing, need_module, need_path, wait_until

pytestmark = [pytest.mark.ros, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
LAYOUT = REPO / "docs" / "layout.md"
BIN = Path(sys.executable).parent
# A command holding one of these is an example to adapt, not one to run as written.
PLACEHOLDERS = ("/path/", "...", "<", "$")
# Output of a ros2 command that went wrong even where its exit code is 0.
FAILURE_WORDS = ("traceback", "not found", "parameter failed", "success=false", "does not appear", "could not")
TIMEOUT = 120.0


def shell_lines(text: str) -> list[str]:
    """The logical lines (continuations joined) of the README's ```bash blocks."""
    lines, block = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            block = [] if line.strip() == "```bash" and block is None else None
            continue
        if block is not None:
            if lines and lines[-1].endswith("\\"):
                lines[-1] = lines[-1][:-1] + " " + line.strip()
            else:
                lines.append(line.strip())
    return [line for line in lines if line and not line.startswith("#")]


def commands(*programs: str) -> list[list[str]]:
    """Every README command (as argv, comments removed) that starts with one of ``programs``, in
    README order."""
    found = []
    for line in shell_lines(README.read_text()):
        for part in re.split(r"\s*&&\s*", line):
            argv = shlex.split(part, comments=True)
            if argv and argv[0] in programs:
                found.append(argv)
    return found


def runnable(argv: list[str]) -> bool:
    return not any(mark in arg for arg in argv for mark in PLACEHOLDERS)


def test_the_readme_has_ros2_commands_and_one_runnable_launch_line():
    ros2 = commands("ros2")
    launches = [argv for argv in ros2 if argv[1] == "launch" and runnable(argv)]
    assert len(launches) == 1, launches   # the one the other commands run against
    assert len([argv for argv in ros2 if argv[1] != "launch" and runnable(argv)]) >= 8


def test_every_launch_line_uses_declared_arguments():
    need_module("launch_ros", "scripts/install_ros2cli.sh installs it; scripts/setup.sh runs it")
    from ament_index_python.packages import PackageNotFoundError

    spec = importlib.util.spec_from_file_location("map_launch", REPO / "launch" / "map.launch.py")
    module = importlib.util.module_from_spec(spec)
    try:   # any other error in the launch file fails the test
        spec.loader.exec_module(module)
    except PackageNotFoundError as error:   # the package share is looked up at import
        missing(f"the installed lingbot_ros package share ({error})", SETUP)
    declared = {name for name, _, _ in module.ARGUMENTS}
    lines = [argv for argv in commands("ros2") if argv[1] == "launch"]
    assert lines
    for argv in lines:
        assert argv[2:4] == ["lingbot_ros", "map.launch.py"], argv
        given = {arg.split(":=", 1)[0] for arg in argv[4:]}
        assert given <= declared, f"{argv}: {sorted(given - declared)} are not launch arguments"


def _env(tmp_path: Path) -> dict:
    env = dict(os.environ, ROS_DOMAIN_ID=str(101 + os.getpid() % 100), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
               ROS_LOG_DIR=str(tmp_path / "ros_log"), ROS_HOME=str(tmp_path / "ros_home"), PYTHONUNBUFFERED="1",
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    # The installed copy finds ../shared beside the checkout it was installed from by itself.
    if (REPO.parent / "shared").is_dir():
        env.pop("LINGBOT_SHARED", None)
    env.pop("PYTHONPATH", None)   # the installed package, not the source tree
    return env


def _run(argv: list[str], env: dict, cwd: Path, timeout: float = 60.0) -> str:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{shlex.join(argv)} exited {done.returncode}:\n{output[-3000:]}"
    return output


@pytest.fixture
def installed():
    for name in ("ros2", "lingbot-ros-demo"):
        need_path(BIN / name, "installed command", SETUP)


def test_the_readme_ros2_commands_work_against_the_launched_node(installed, shared_data, tmp_path):
    """The launch line, then the other ros2 commands and the bag replay in README order: the replay
    feeds the node, so the commands after it see a map (poses, processed frames, a saved trajectory)."""
    shared_data("courthouse_bag")
    env = _env(tmp_path)
    (launch,) = [argv for argv in commands("ros2") if argv[1] == "launch" and runnable(argv)]
    others = [argv for argv in commands("ros2", "lingbot-ros-replay") if argv[1] != "launch" and runnable(argv)]
    replays = [argv for argv in others if argv[0] == "lingbot-ros-replay"]
    assert replays, others
    log = open(tmp_path / "launch.log", "w+")
    proc = subprocess.Popen([str(BIN / "ros2"), *launch[1:]], env=env, cwd=tmp_path, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)

    def launch_output() -> str:
        log.flush()
        log.seek(0)
        return log.read()[-4000:]

    ros2 = str(BIN / "ros2")
    try:
        wait_until(lambda: proc.poll() is not None or "active: listening on" in launch_output(),
                   "the launched map_node to go active", TIMEOUT, details=launch_output)
        assert proc.poll() is None, launch_output()
        # The daemon the commands share: up and seeing the node before they run, once each.
        _run([ros2, "daemon", "start"], env, tmp_path)
        wait_until(lambda: "/map_node" in _run([ros2, "node", "list"], env, tmp_path), "ros2 node list to show "
                   "/map_node", TIMEOUT, details=launch_output)
        outputs = {}
        for argv in others:
            if argv[0] == "lingbot-ros-replay":   # its bag path is relative to the checkout
                output = _run([str(BIN / argv[0]), *argv[1:]], env, REPO, timeout=TIMEOUT)
                assert "warning" not in output.lower(), output[-3000:]   # it waited for the node and played
            else:
                output = _run([ros2, *argv[1:]], env, tmp_path, timeout=TIMEOUT)
            lowered = output.lower()
            assert not any(word in lowered for word in FAILURE_WORDS), f"{shlex.join(argv)}:\n{output[-3000:]}"
            outputs[shlex.join(argv[1:3])] = outputs[shlex.join(argv)] = output
        assert "active" in outputs.get("lifecycle get", "active")
        # What the commands did, seen from outside: the frames the replay fed, the parameter they
        # set, the poses they asked for, the files they saved.
        processed = re.search(r"^frames_processed: (\d+)$", outputs["topic echo"], re.M)
        assert processed and int(processed.group(1)) > 0, outputs["topic echo"]
        for argv in others:
            if argv[1:3] == ["param", "set"]:
                shown = _run([ros2, "param", "get", *argv[3:5]], env, tmp_path)
                assert argv[5] in shown, shown
            if argv[1:3] == ["service", "call"] and argv[4] == "lingbot_ros/srv/GetTrajectory":
                answer = outputs[shlex.join(argv)]
                asked = int(re.search(r"max_poses:\s*(\d+)", argv[5]).group(1))
                assert "success=True" in answer, answer[-3000:]
                assert answer.count("geometry_msgs.msg.PoseStamped(") == asked, answer[-3000:]
                assert int(re.search(r"total_poses=(\d+)", answer).group(1)) >= asked, answer[-3000:]
            if argv[1:3] == ["service", "call"] and argv[4] == "lingbot_ros/srv/SaveMap":
                # A relative directory is under save_directory, under $ROS_HOME; the answer says where.
                directory = re.search(r"directory:\s*([^,}\s]+)", argv[5]).group(1)
                ply = Path(re.search(r"ply_path='([^']+)'", outputs[shlex.join(argv)]).group(1))
                assert ply.parent == tmp_path / "ros_home" / "lingbot_maps" / directory
                assert {"map.ply", "trajectory.tum", "preview.png"} <= {p.name for p in ply.parent.iterdir()}
                poses = (ply.parent / "trajectory.tum").read_text().splitlines()
                assert len(poses) >= 5 and all(len(line.split()) == 8 for line in poses), poses[:3]
    finally:
        subprocess.run([ros2, "daemon", "stop"], env=env, cwd=tmp_path, capture_output=True, timeout=60)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(30)
        log.close()


def test_the_readme_quick_start_demo_uses_the_courthouse_images(installed, tmp_path, shared_data):
    shared_data("courthouse_jpg")
    (demo,) = commands("lingbot-ros-demo")[:1]
    frames = int(demo[demo.index("--frames") + 1])
    # Run from elsewhere than the checkout: the images are found from where the package came from.
    output = _run([str(BIN / demo[0]), *demo[1:]], _env(tmp_path), tmp_path, timeout=600)
    first = next(line for line in output.splitlines() if line.startswith("lingbot-ros-demo: source"))
    assert "courthouse_jpg" in first and "checkout this package was installed from" in first, first
    summary = next(line for line in output.splitlines() if line.startswith("summary:"))
    assert f"summary: {frames} frames of folder" in summary and "courthouse_jpg" in summary, summary
    assert len((tmp_path / "out" / "trajectory.tum").read_text().splitlines()) == frames
    assert (tmp_path / "out" / "preview.png").stat().st_size > 0


def test_the_readme_reference_table_is_the_generated_one(tmp_path):
    need_module("rclpy")
    sys.path.insert(0, str(REPO))
    from lingbot_ros.ros import reference

    env = dict(os.environ, ROS_DOMAIN_ID=str(101 + (os.getpid() + 50) % 100), ROS_LOG_DIR=str(tmp_path),
               ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "lingbot_ros.ros.reference"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    text = README.read_text()
    region = text[text.index(reference.BEGIN):text.index(reference.END) + len(reference.END)]
    assert region == done.stdout.strip(), "README's reference is stale: python -m lingbot_ros.ros.reference " \
                                          "--update README.md"


@pytest.mark.parametrize("package", ["mapping", "ros"])
def test_the_layout_has_one_line_per_module(package):
    """docs/layout.md's table of lingbot_ros/<package> names every module file once, each saying
    what it owns, and no module that is gone; the README links it."""
    assert "(docs/layout.md)" in README.read_text()
    text = LAYOUT.read_text()
    heading = f"`lingbot_ros/{package}`, one job per module"
    assert heading in text, f"docs/layout.md has no '{heading}' table"
    rows = []
    table = text[text.index(heading):]
    for line in table[table.index("\n|"):].lstrip("\n").splitlines():
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    listed = [row[0].strip("`") for row in rows[2:]]   # after the header and its rule
    assert all(len(row) == 2 and row[1] for row in rows[2:]), rows
    root = REPO / "lingbot_ros" / package   # subfolders too, named by their path in the package
    modules = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py") if p.name != "__init__.py")
    missing, stale = sorted(set(modules) - set(listed)), sorted(set(listed) - set(modules))
    assert sorted(listed) == modules, f"docs/layout.md's lingbot_ros/{package} table: missing {missing}, stale " \
                                      f"{stale} (or a module listed twice)"
