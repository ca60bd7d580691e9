#!/usr/bin/env bash
# What the tests need beyond scripts/setup.sh. The ROS 2 launch packages the real-launch tests use
# are run-time parts now (the `ros2 launch` command): scripts/install_ros2cli.sh, which setup.sh
# runs, installs them; this makes sure of them for a venv set up before that (idempotent, hashed).
# The live view's test loads its page in a real browser: Debian's headless-capable `chromium`,
# installed with apt-get where it is missing (as root, or through sudo).
#   bash scripts/test_deps.sh VENV
set -euo pipefail
venv=${1:?usage: test_deps.sh VENV}
bash "$(dirname "$0")/install_ros2cli.sh" "$venv"
if ! command -v chromium >/dev/null 2>&1; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "[test_deps] chromium is missing and there is no apt-get: install Chromium for test/test_viewer_browser.py" >&2
    exit 1
  fi
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "[test_deps] installing chromium (the live view's browser test)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi
