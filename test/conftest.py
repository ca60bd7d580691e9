"""The tests' fixtures, for every test module (none imports them). Keep additive: several layers'
tests rely on them. What the tests share besides fixtures (waits, probe nodes, synthetic inputs)
is in helpers.py; a test module imports from there what it calls.

Test files are named after the layer they test: test_<layer>_<what>.py, the layer one of cache,
model, stream, io, mapping, ros (the node and its launch file, over DDS or not) and tools (the
command-line programs), or project (what the repository ships: packaging, set-up scripts, the
README). A script the tests run as a subprocess (map_db_writer.py) sits next to them.
"""
import os
from pathlib import Path

import pytest

from helpers import REPO, MapStatus, Ros


def _shared_dir() -> Path:
    return Path(os.environ.get("LINGBOT_SHARED", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The read-only shared folder (../shared next to the repo, or $LINGBOT_SHARED)."""
    path = _shared_dir()
    if not path.is_dir():
        pytest.skip(f"shared folder {path} not found (set LINGBOT_SHARED)")
    return path


@pytest.fixture(scope="session")
def parity_fixtures_dir(shared_dir) -> Path:
    """The spec-18 parity fixtures (tiny_default, tiny_kf2, tiny_conv2d)."""
    path = shared_dir / "fixtures"
    if not path.is_dir():
        pytest.skip(f"parity fixtures {path} not found (set LINGBOT_SHARED)")
    return path


@pytest.fixture(scope="session")
def fixture_files(shared_dir) -> dict:
    """Mapper settings of the tiny_default fixture's model (architecture and weights)."""
    fixture = shared_dir / "fixtures" / "tiny_default"
    if not (fixture / "ckpt.pt").exists():
        pytest.skip(f"tiny fixture missing under {shared_dir}")
    return {"checkpoint": str(fixture / "ckpt.pt"), "model_config": str(fixture / "config.json")}


@pytest.fixture()
def torch_single_thread():
    """One intra-op thread: tiny models on a shared 2-core machine run ~10x faster without OpenMP
    threads spinning against other processes."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def shared_data(shared_dir):
    """Look up a folder of ../shared/data (the real sequences), skipping when it is absent."""
    def lookup(name: str) -> Path:
        path = shared_dir / "data" / name
        if not path.exists():
            pytest.skip(f"shared data {path} is absent (see ../shared/data/README.md)")
        return path
    return lookup


@pytest.fixture(autouse=True)
def ros_home(tmp_path_factory, monkeypatch) -> Path:
    """ROS_HOME in a temporary folder for every test (and the nodes it starts): the default
    map_database ($ROS_HOME/lingbot_ros/map.db) never writes to the user's ~/.ros."""
    path = tmp_path_factory.mktemp("ros_home")
    monkeypatch.setenv("ROS_HOME", str(path))
    return path


@pytest.fixture
def tiny(shared_dir):
    """(tiny fixture folder, courthouse bag) of the tests over DDS."""
    fixture = shared_dir / "fixtures" / "tiny_default"
    bag = shared_dir / "data" / "courthouse_bag"
    if not (fixture / "ckpt.pt").exists() or not bag.is_dir():
        pytest.skip(f"tiny fixture or courthouse bag missing under {shared_dir}")
    return fixture, bag


@pytest.fixture
def ros(tmp_path):
    """The probe of the map_node tests (helpers.Ros); its subprocesses end with the test."""
    if MapStatus is None:
        pytest.skip("lingbot_ros interfaces not generated (run scripts/setup.sh)")
    env = Ros(tmp_path)
    yield env
    env.close()
