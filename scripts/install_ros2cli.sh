#!/usr/bin/env bash
# The `ros2` command and `ros2 launch` in a venv, as run-time parts: the ROS 2 launch system
# (launch, launch_ros, the XML and YAML front ends, composition_interfaces), ros2cli with its verbs
# (topic, node, service, param, lifecycle, pkg, interface, run, action) and the `ros2 launch` verb,
# all from ../shared/vendor (pure Python, not on PyPI; steps in its README). A ROS distro brings
# its own. Idempotent (hashed); skipped with a message when the vendor folder is absent.
#   bash scripts/install_ros2cli.sh VENV
set -euo pipefail
venv=$(cd "${1:?usage: install_ros2cli.sh VENV}" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
vpy="$venv/bin/python"
vendor=${LINGBOT_SHARED:-$root/../shared}/vendor
log() { printf '[ros2cli] %s\n' "$*"; }

if [ ! -d "$vendor/launch" ] || [ ! -d "$vendor/ros2cli" ]; then
  log "skipped: $vendor not found (set LINGBOT_SHARED): no ros2 command in this venv; the launch tests will skip"
  exit 0
fi
# pip order: a package's vendored dependencies before it (--no-deps).
python_packages=(launch launch_xml launch_yaml launch_ros ros2cli/rosidl_runtime_py ros2cli/ros2cli
  ros2cli/ros2topic ros2cli/ros2node ros2cli/ros2service ros2cli/ros2param ros2cli/ros2lifecycle
  ros2cli/ros2pkg ros2cli/ros2interface ros2cli/ros2run ros2cli/ros2action ros2launch)
cmake_packages=(composition_interfaces)
check="import launch.launch_service, launch_ros.actions, launch_xml, launch_yaml, composition_interfaces.srv, \
ros2cli.cli, ros2launch, rosidl_runtime_py"
vendor_hash=$( { cat "$root/requirements-ros2cli.txt" "$0" "$root/scripts/ament_build.sh" \
  "$venv/.deps_hash" 2>/dev/null; for p in "${python_packages[@]}" "${cmake_packages[@]}"; do
    find "$vendor/$p" -type f ! -path '*/build/*' ! -path '*.egg-info/*' | sort | xargs cat; done; } \
  | sha256sum | cut -c1-16)
if [ "$(cat "$venv/.ros2cli_hash" 2>/dev/null)" = "$vendor_hash" ] && "$vpy" -c "$check" 2>/dev/null \
  && [ -x "$venv/bin/ros2" ]; then
  log "ros2 and launch up to date"
  exit 0
fi

start=$SECONDS
# pip builds in the source tree, and the shared folder is read-only: build from copies.
work="$venv/build/vendor"
rm -rf "$work"
mkdir -p "$work"
copies=()
for p in "${python_packages[@]}" "${cmake_packages[@]}"; do
  cp -r "$vendor/$p" "$work/${p##*/}"
  rm -rf "$work/${p##*/}/build" "$work/${p##*/}"/*.egg-info
  [[ " ${cmake_packages[*]} " == *" $p "* ]] || copies+=("$work/${p##*/}")
done
chmod -R u+w "$work"
bash "$root/scripts/pip_quiet.sh" "$vpy" --no-deps "${copies[@]}" -r "$root/requirements-ros2cli.txt"

. "$root/scripts/ament_build.sh"
fix_wheel_cmake_paths
for p in "${cmake_packages[@]}"; do
  build_and_install "$work/$p" "$venv/build/$p"
done

"$vpy" -c "$check" || { log "the vendored packages do not import in $venv"; exit 1; }
[ -x "$venv/bin/ros2" ] || { log "no ros2 command in $venv/bin"; exit 1; }
echo "$vendor_hash" > "$venv/.ros2cli_hash"
log "ros2 (cli, launch) installed into $venv ($(( SECONDS - start )) s)"
