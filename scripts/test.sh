#!/usr/bin/env bash
# The whole test suite: set up (idempotent; it installs ros2 and launch too), then pytest.
# Extra arguments go to pytest. ROS_DISTRO=jazzy tests the Jazzy venv (scripts/distro.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. scripts/distro.sh
bash scripts/setup.sh
bash scripts/test_deps.sh "$venv"
. "$venv/env.sh"
exec python -m pytest "$@"
