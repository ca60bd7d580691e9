#!/usr/bin/env bash
# Generates lingbot_ros's own interfaces (msg/MapStatus, srv/SaveMap) into a venv prefix, as colcon
# does in a ROS workspace: same CMakeLists.txt, interfaces only. Idempotent; scripts/setup.sh runs it.
#   bash scripts/build_interfaces.sh VENV
set -euo pipefail
venv=$(cd "${1:?usage: build_interfaces.sh VENV}" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
vpy="$venv/bin/python"

. "$root/scripts/ament_build.sh"
fix_wheel_cmake_paths

# tf2_msgs is not on PyPI; without it the node cannot publish /tf. A distro's own copy wins.
if ! "$vpy" -c "import tf2_msgs.msg" 2>/dev/null; then
  build_and_install "$root/scripts/venv_interfaces/tf2_msgs" "$venv/build/tf2_msgs"
  "$vpy" -c "from tf2_msgs.msg import TFMessage" \
    || { echo "[build_interfaces] generated tf2_msgs does not import" >&2; exit 1; }
  echo "[build_interfaces] tf2_msgs/msg/TFMessage installed into $venv"
fi

build_and_install "$root" "$venv/build/lingbot_ros" -DLINGBOT_INTERFACES_ONLY=ON

# rosidl installs an empty lingbot_ros/__init__.py and an egg-info into site-packages. The
# hand-written package (pip install .) owns both: put our __init__.py back and drop the egg-info,
# so pip sees one distribution and an earlier pip install keeps working.
site=$("$vpy" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cp "$root/lingbot_ros/__init__.py" "$site/lingbot_ros/__init__.py"
rm -rf "$site"/lingbot_ros-*.egg-info
"$vpy" -c "from lingbot_ros.msg import MapStatus; from lingbot_ros.srv import SaveMap" \
  || { echo "[build_interfaces] generated interfaces do not import" >&2; exit 1; }
echo "[build_interfaces] lingbot_ros/msg/MapStatus, lingbot_ros/srv/SaveMap installed into $venv"
