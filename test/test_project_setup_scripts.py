"""The set-up scripts' failure paths, run for real on throwaway venvs (nothing is installed)."""
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BOGUS = "lingbot-no-such-package==0.0.1"


def _run(args, env=None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=REPO, env=dict(os.environ, **(env or {})), capture_output=True,
                          text=True, timeout=300, **kwargs)


def _offline_pip_args(tmp_path) -> list:
    # An index folder that does not exist: pip answers at once, without the network, and says
    # "... is ignored: it is neither a file nor a directory" about it.
    return ["--isolated", "--index-url", (tmp_path / "no_index").as_uri(), BOGUS]


def test_pip_quiet_fails_with_pips_own_error_and_drops_only_the_noise(tmp_path):
    raw = _run([sys.executable, "-m", "pip", "install", *_offline_pip_args(tmp_path)])
    assert raw.returncode != 0 and "is ignored: it is neither" in raw.stdout + raw.stderr

    quiet = _run(["bash", "scripts/pip_quiet.sh", sys.executable, *_offline_pip_args(tmp_path)])
    output = quiet.stdout + quiet.stderr
    assert quiet.returncode == raw.returncode
    assert f"No matching distribution found for {BOGUS}" in output
    assert "is ignored: it is neither" not in output


@pytest.fixture
def pipless_venv(tmp_path) -> Path:
    """A venv whose python has no pip: the set-up's first install must fail."""
    path = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(path)
    return path


def test_setup_stops_at_a_failed_install_with_pips_error(pipless_venv):
    done = _run(["bash", "scripts/setup.sh"], env={"LINGBOT_VENV": str(pipless_venv), "ROS_DISTRO": "jazzy"})
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "No module named pip" in output
    # It stopped there: no later step ran and nothing claims the dependencies are installed.
    assert "dependency check failed" not in output and "generating ROS interfaces" not in output
    assert not (pipless_venv / ".deps_hash").exists()


def test_setup_refuses_an_unknown_distro(tmp_path):
    done = _run(["bash", "scripts/setup.sh"], env={"LINGBOT_VENV": str(tmp_path / "v"), "ROS_DISTRO": "humble"})
    assert done.returncode == 2
    assert "ROS_DISTRO=humble" in done.stderr and "jazzy" in done.stderr
    assert not (tmp_path / "v").exists()


def test_setup_refuses_to_mix_two_distros_in_one_venv(pipless_venv):
    (pipless_venv / ".ros_distro").write_text("kilted\n")
    done = _run(["bash", "scripts/setup.sh"], env={"LINGBOT_VENV": str(pipless_venv), "ROS_DISTRO": "jazzy"})
    assert done.returncode == 2
    assert "holds ROS kilted, not jazzy" in done.stdout


def test_each_distro_has_its_own_default_venv():
    script = '. scripts/distro.sh; echo "$distro $venv requirements-ros$req_suffix.txt"'
    env = {k: v for k, v in os.environ.items() if k not in ("ROS_DISTRO", "LINGBOT_VENV")}
    lines = {}
    for distro in ("", "kilted", "jazzy"):
        done = subprocess.run(["bash", "-c", f"root={REPO}; {script}"], cwd=REPO, capture_output=True,
                              text=True, env=dict(env, ROS_DISTRO=distro) if distro else env, check=True)
        lines[distro] = done.stdout.split()
    assert lines[""] == lines["kilted"] == ["kilted", f"{REPO}/.venv", "requirements-ros.txt"]
    assert lines["jazzy"] == ["jazzy", f"{REPO}/.venv-jazzy", "requirements-ros-jazzy.txt"]
    for _, _, requirements in lines.values():
        assert (REPO / requirements).is_file()


def test_test_deps_skips_with_a_message_without_the_shared_folder(tmp_path):
    done = _run(["bash", "scripts/test_deps.sh", str(tmp_path)], env={"LINGBOT_SHARED": str(tmp_path / "absent")})
    assert done.returncode == 0
    assert f"skipped: {tmp_path / 'absent' / 'vendor'} not found" in done.stdout
    assert not (tmp_path / ".ros2cli_hash").exists()


def test_install_tf2_skips_with_a_message_without_the_vendored_geometry2(tmp_path):
    done = _run(["bash", "scripts/install_tf2.sh", str(tmp_path)], env={"LINGBOT_SHARED": str(tmp_path / "absent")})
    assert done.returncode == 0
    assert f"skipped: {tmp_path / 'absent' / 'vendor' / 'geometry2'} not found" in done.stdout
    assert not (tmp_path / ".tf2_hash").exists()


def test_install_tf2_has_the_build_only_wheels_of_each_distro():
    # The setup's one line calls it; its requirement files pin each distro's own wheels.
    assert 'bash scripts/install_tf2.sh "$venv"' in (REPO / "scripts" / "setup.sh").read_text()
    for suffix, distro in (("", "kilted"), ("-jazzy", "jazzy")):
        pins = [line for line in (REPO / f"requirements-tf2{suffix}.txt").read_text().splitlines()
                if line and not line.startswith("#")]
        assert pins and all(line.startswith(f"ros-{distro}-") and "==" in line for line in pins)
