"""Every command line takes its flags whole: a prefix of a flag is an unknown flag, refused with
exit 2 (argparse's default took any unambiguous prefix, so `lingbot-ros-offline
--no-map-database` ran as `--no-map-database-images` and still wrote the default database)."""
import subprocess
import sys

import pytest

from helpers import REPO


@pytest.mark.parametrize("tool, args, prefix", [
    ("offline", ["--input", "x", "--output", "out", "--no-map-database"], "--no-map-database"),
    ("map_db", ["export", "map.db", "out", "--form", "colmap"], "--form"),
    ("replay", ["bag", "--max-le", "1"], "--max-le"),
    ("camera", ["--sourc", "synthetic"], "--sourc"),
    ("run_demo", ["--fram", "3"], "--fram"),
    ("prebuild", ["--camera-num", "2"], "--camera-num"),
    ("fixture", ["ref", "out.npz", "--thr", "1"], "--thr"),
])
def test_a_prefix_of_a_flag_is_refused(tool, args, prefix, tmp_path):
    done = subprocess.run([sys.executable, "-m", f"lingbot_ros.tools.{tool}", *args], cwd=tmp_path,
                          env={"PYTHONPATH": str(REPO), "PATH": ""}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"unrecognized arguments: {prefix}" in done.stderr, done.stderr
