#!/usr/bin/env bash
# What the tests need beyond scripts/setup.sh. The ROS 2 launch packages the real-launch tests use
# are run-time parts now (the `ros2 launch` command): scripts/install_ros2cli.sh, which setup.sh
# runs, installs them; this makes sure of them for a venv set up before that (idempotent, hashed).
#   bash scripts/test_deps.sh VENV
set -euo pipefail
venv=${1:?usage: test_deps.sh VENV}
exec bash "$(dirname "$0")/install_ros2cli.sh" "$venv"
