#!/usr/bin/env bash
# Generates lingbot_ros's own interfaces (msg/MapStatus, srv/SaveMap) into a venv prefix, as colcon
# does in a ROS workspace: same CMakeLists.txt, interfaces only. Idempotent; scripts/setup.sh runs it.
#   bash scripts/build_interfaces.sh VENV
set -euo pipefail
venv=$(cd "${1:?usage: build_interfaces.sh VENV}" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
vpy="$venv/bin/python"
build="$root/build/interfaces"

# The PyPI ROS wheels hard-code their manylinux build paths (/opt/python/...) in their CMake export
# files; point them at this interpreter's headers and numpy (notes/ros2_wheels.md section 2).
"$vpy" - <<'PY'
import pathlib, re, sys, sysconfig
import numpy
py_inc, np_inc = sysconfig.get_paths()["include"], numpy.get_include()
for f in pathlib.Path(sys.prefix, "share").glob("*/cmake/*.cmake"):
    s = f.read_text()
    if "/opt/python/" in s:
        s = re.sub(r"/opt/python/cp3\d+-cp3\d+/lib/python3\.\d+/site-packages/numpy/_?core/include", np_inc, s)
        f.write_text(re.sub(r"/opt/python/cp3\d+-cp3\d+/include/python3\.\d+", py_inc, s))
PY

export AMENT_PREFIX_PATH="$venv" CMAKE_PREFIX_PATH="$venv"
# build_and_install SOURCE_DIR BUILD_DIR [CMAKE_ARGS...]
build_and_install() {
  local src=$1 dir=$2 gen=()
  shift 2
  command -v ninja >/dev/null && gen=(-G Ninja)
  [ -f "$dir/CMakeCache.txt" ] && gen=()   # the generator is fixed at the first configure
  cmake -S "$src" -B "$dir" "${gen[@]}" -DBUILD_TESTING=OFF -DCMAKE_INSTALL_PREFIX="$venv" \
    -DPython3_EXECUTABLE="$vpy" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
  cmake --build "$dir" -j 2 >/dev/null
  cmake --install "$dir" >/dev/null
}

# tf2_msgs is not on PyPI; without it the node cannot publish /tf. A distro's own copy wins.
if ! "$vpy" -c "import tf2_msgs.msg" 2>/dev/null; then
  build_and_install "$root/scripts/venv_interfaces/tf2_msgs" "$root/build/tf2_msgs"
  "$vpy" -c "from tf2_msgs.msg import TFMessage" \
    || { echo "[build_interfaces] generated tf2_msgs does not import" >&2; exit 1; }
  echo "[build_interfaces] tf2_msgs/msg/TFMessage installed into $venv"
fi

build_and_install "$root" "$build" -DLINGBOT_INTERFACES_ONLY=ON

# rosidl installs an empty lingbot_ros/__init__.py and an egg-info into site-packages. The
# hand-written package (pip install .) owns both: put our __init__.py back and drop the egg-info,
# so pip sees one distribution and an earlier pip install keeps working.
site=$("$vpy" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cp "$root/lingbot_ros/__init__.py" "$site/lingbot_ros/__init__.py"
rm -rf "$site"/lingbot_ros-*.egg-info
"$vpy" -c "from lingbot_ros.msg import MapStatus; from lingbot_ros.srv import SaveMap" \
  || { echo "[build_interfaces] generated interfaces do not import" >&2; exit 1; }
echo "[build_interfaces] lingbot_ros/msg/MapStatus, lingbot_ros/srv/SaveMap installed into $venv"
