#!/usr/bin/env bash
# tf2_ros in a venv: builds ../shared/vendor/geometry2 (tf2, tf2_msgs, tf2_py, tf2_ros_py; not on
# PyPI) into the venv prefix, as colcon does in a workspace, so the node looks transforms up with
# the real tf2_ros.Buffer / TransformListener as in a distro. A distro's own tf2_ros wins (nothing
# is built). Idempotent (hashed); skipped with a message when the vendor folder is absent (the
# node then uses its /tf_static listener, and scripts/build_interfaces.sh generates TFMessage).
#   bash scripts/install_tf2.sh VENV
set -euo pipefail
venv=$(cd "${1:?usage: install_tf2.sh VENV}" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
vpy="$venv/bin/python"
vendor=${LINGBOT_SHARED:-$root/../shared}/vendor/geometry2
log() { printf '[install_tf2] %s\n' "$*"; }
# The venv's own distro (scripts/setup.sh records it), whatever ROS_DISTRO says now.
req_suffix=""
[ "$(cat "$venv/.ros_distro" 2>/dev/null)" = jazzy ] && req_suffix="-jazzy"

if [ ! -d "$vendor/tf2" ]; then
  log "skipped: $vendor not found (set LINGBOT_SHARED); tf2_ros tests will skip"
  exit 0
fi
packages=(tf2 tf2_msgs tf2_py tf2_ros_py)
requirements="$root/requirements-tf2$req_suffix.txt"
tf2_hash=$( { cat "$requirements" "$0" "$root/scripts/ament_build.sh" "$venv/.deps_hash" 2>/dev/null
  for p in "${packages[@]}"; do find "$vendor/$p" -type f | sort | xargs cat; done; } | sha256sum | cut -c1-16)
if [ "$(cat "$venv/.tf2_hash" 2>/dev/null)" = "$tf2_hash" ] && "$vpy" -c "import tf2_ros" 2>/dev/null; then
  log "tf2_ros up to date"
  exit 0
fi

start=$SECONDS
bash "$root/scripts/pip_quiet.sh" "$vpy" -r "$requirements"
. "$root/scripts/ament_build.sh"
fix_wheel_cmake_paths
# The shared folder is read-only: build from copies (pip and CMake write beside the sources).
work="$venv/build/geometry2"
rm -rf "$work"
mkdir -p "$work"
for p in "${packages[@]}"; do cp -r "$vendor/$p" "$work/$p"; done
chmod -R u+w "$work"
for p in tf2 tf2_msgs tf2_py; do
  step=$SECONDS
  build_and_install "$work/$p" "$venv/build/geometry2-$p"
  log "  $p built ($(( SECONDS - step )) s)"
done
bash "$root/scripts/pip_quiet.sh" "$vpy" --no-deps "$work/tf2_ros_py"
"$vpy" -c "import tf2_ros, tf2_msgs.srv; from tf2_msgs.msg import TFMessage" \
  || { log "tf2_ros does not import in $venv"; exit 1; }
echo "$tf2_hash" > "$venv/.tf2_hash"
log "tf2, tf2_msgs, tf2_py, tf2_ros installed into $venv ($(( SECONDS - start )) s)"
