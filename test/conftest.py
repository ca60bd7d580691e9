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

from helpers import (GET_SHARED, MISSING, NEEDS_CUDA, REPO, REQUIRE_DATA, SETUP, MapStatus, Ros, data_required,
                     mapper_of, missing, tiny_settings)


def _shared_dir() -> Path:
    return Path(os.environ.get("LINGBOT_SHARED", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The read-only shared folder (../shared next to the repo, or $LINGBOT_SHARED)."""
    path = _shared_dir()
    if not path.is_dir():
        missing(f"shared folder {path}", GET_SHARED)
    return path


@pytest.fixture(scope="session")
def parity_fixtures_dir(shared_dir) -> Path:
    """The spec-18 parity fixtures (tiny_default, tiny_kf2, tiny_conv2d)."""
    path = shared_dir / "fixtures"
    if not path.is_dir():
        missing(f"parity fixtures {path}", GET_SHARED)
    return path


@pytest.fixture(scope="session")
def fixture_files(shared_dir) -> dict:
    """Mapper settings of the tiny_default fixture's model (architecture and weights)."""
    fixture = shared_dir / "fixtures" / "tiny_default"
    if not (fixture / "ckpt.pt").exists():
        missing(f"tiny fixture {fixture / 'ckpt.pt'}", GET_SHARED)
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
    """Look up a folder of ../shared/data (the real sequences); missing() when it is absent."""
    def lookup(name: str) -> Path:
        path = shared_dir / "data" / name
        if not path.exists():
            missing(f"shared data {path}", f"{GET_SHARED}; see ../shared/data/README.md")
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
    for path in (fixture / "ckpt.pt", bag):
        if not path.exists():
            missing(f"{path}", GET_SHARED)
    return fixture, bag


@pytest.fixture
def ros(tmp_path):
    """The probe of the map_node tests (helpers.Ros); its subprocesses end with the test."""
    if MapStatus is None:
        missing("the generated lingbot_ros interfaces (lingbot_ros.msg)", SETUP)
    env = Ros(tmp_path)
    yield env
    env.close()


@pytest.fixture(scope="session")
def tiny_mapper(fixture_files):
    """Build the tiny CPU Mapper: ``tiny_mapper(**overrides)``, helpers.TINY_MAPPER's settings over
    the tiny fixture's model, which is loaded once (helpers.mapper_of)."""
    return lambda **overrides: mapper_of(tiny_settings(fixture_files, **overrides))


def pytest_report_header(config):
    """The run's first lines say whether a missing input fails (CI) or skips, and where ../shared is."""
    shared = _shared_dir()
    where = f"shared folder {shared} ({'found' if shared.is_dir() else 'ABSENT'})"
    if data_required():
        return f"lingbot_ros: {REQUIRE_DATA}=1: a missing test input (../shared data, generated interfaces) FAILS; {where}"
    return (f"lingbot_ros: {REQUIRE_DATA} unset: a missing test input (../shared data, generated interfaces) "
            f"skips; set {REQUIRE_DATA}=1 (as CI does) to make it fail; {where}")


def pytest_terminal_summary(terminalreporter):
    """The skips by kind: missing inputs (failures under LINGBOT_REQUIRE_DATA=1), CUDA-only, other."""
    kinds = {"missing test input": [], "CUDA only": [], "other": []}
    for report in terminalreporter.stats.get("skipped", []):
        reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        kind = "missing test input" if MISSING in reason else "CUDA only" if NEEDS_CUDA in reason else "other"
        kinds[kind].append((report.nodeid, reason.removeprefix("Skipped: ")))
    if not any(kinds.values()):
        return
    terminalreporter.section("lingbot_ros skips")
    for kind, skipped in kinds.items():
        terminalreporter.write_line(f"{kind}: {len(skipped)}")
        by_reason = {}
        for nodeid, reason in skipped:
            by_reason.setdefault(reason, []).append(nodeid)
        for reason, nodeids in by_reason.items():
            terminalreporter.write_line(f"  {len(nodeids)} x {reason} (e.g. {nodeids[0]})")
    if kinds["missing test input"]:
        terminalreporter.write_line(
            f"{len(kinds['missing test input'])} tests did not run for a missing input: {GET_SHARED}, and {SETUP}. "
            f"CI runs with {REQUIRE_DATA}=1, where each of them fails.", yellow=True, bold=True)
