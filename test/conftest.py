"""Shared pytest fixtures. Keep additive: several layers' tests rely on them."""
import os
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _shared_dir() -> Path:
    return Path(os.environ.get("LINGBOT_SHARED", REPO.parent / "shared"))


def wait_until(condition, what: str, timeout: float, details=None):
    """Poll ``condition()`` until it returns something truthy and return that. On timeout raise
    AssertionError naming ``what``, plus ``details()`` (e.g. subprocess logs) when given."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}" + (f"; {details()}" if details else ""))


def unpack_points(msg):
    """A PointCloud2 the node published (ros.messages.point_cloud) back to ``[N, 3]`` float32
    xyz and ``[N, 3]`` uint8 RGB."""
    import numpy as np

    from lingbot_ros.ros.messages import POINT_DTYPE

    packed = np.frombuffer(msg.data, POINT_DTYPE, count=msg.width * msg.height)
    xyz = np.stack([packed["x"], packed["y"], packed["z"]], axis=1)
    rgb = np.stack([(packed["rgb"] >> s) & 0xFF for s in (16, 8, 0)], axis=1).astype(np.uint8)
    return xyz, rgb


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
