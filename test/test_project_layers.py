"""The layers of lingbot_ros: no module imports a layer above its own (docs/layout.md).

Read from the source with ast, every import counted (a lazy one inside a function too, and a
relative one resolved), so a new upward import fails here with the file and line to change.
"""
import ast
from pathlib import Path

import pytest

from helpers import REPO

PACKAGE = REPO / "lingbot_ros"

# A layer may import its own modules and those of lower ranks only. io (frames in) and process
# (signals) are the base both front ends stand on; msg/srv are the generated ROS interfaces, for
# ros/ and tools/ only (mapping/ and below have no ROS). tools/ sits over ros/: the demo and the
# replay start and drive the node, the node never calls a command line. viewer/ (the browser view)
# stands on mapping/ and serves ros/ and tools/.
RANK = {"io": 0, "process": 0, "cache": 1, "model": 2, "stream": 3, "mapping": 4,
        "viewer": 5, "msg": 5, "srv": 5, "ros": 6, "tools": 7}


def imported(path: Path, text: str | None = None) -> list[tuple[str, int]]:
    """(top-level lingbot_ros subpackage, line) for every lingbot_ros import in one file (its text
    read from path unless given)."""
    here = list(path.relative_to(REPO).with_suffix("").parts)
    package = here if here[-1] == "__init__" else here[:-1]
    package = [part for part in package if part != "__init__"]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8") if text is None else text, str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:   # relative: from the file's package, one level up per extra dot
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            # `from lingbot_ros import mapping` names the layer in the alias
            modules = [f"{base}.{alias.name}" for alias in node.names] if base == "lingbot_ros" else [base]
        else:
            continue
        found += [(name.split(".")[1], node.lineno) for name in modules
                  if name.startswith("lingbot_ros.")]
    return found


def test_every_subpackage_has_a_layer():
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert subpackages - RANK.keys() == set(), "give the new subpackage a rank in RANK (and docs/layout.md)"


def test_the_checker_sees_relative_lazy_and_package_imports():
    """The parser itself, on a text placed in ros/: a relative import, one inside a function and
    `from lingbot_ros import x`."""
    text = "from ..tools import a\ndef f():\n    from lingbot_ros import mapping\nimport lingbot_ros.io.sources\n"
    assert sorted(imported(PACKAGE / "ros" / "probe.py", text)) == [("io", 4), ("mapping", 3), ("tools", 1)]


@pytest.mark.parametrize("layer", sorted(name for name in RANK if (PACKAGE / name).is_dir()))
def test_no_module_imports_a_higher_layer(layer):
    upward = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for target, line in imported(path):
            if target != layer and RANK.get(target, RANK[layer] + 1) >= RANK[layer]:
                upward.append(f"{path.relative_to(REPO)}:{line} imports lingbot_ros.{target}")
    assert not upward, f"{layer} (rank {RANK[layer]}) may import only lower layers:\n" + "\n".join(upward)
