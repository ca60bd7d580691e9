#!/usr/bin/env bash
# Test-only dependencies: the ROS 2 launch system (launch, launch_ros, composition_interfaces from
# ../shared/vendor, not on PyPI) so that the tests run launch/map.launch.py for real. Never a
# run-time dependency of the package: a ROS distro brings its own launch. Idempotent (hashed);
# skipped with a message when the vendor folder is absent (the launch tests then skip too).
#   bash scripts/test_deps.sh VENV
set -euo pipefail
venv=$(cd "${1:?usage: test_deps.sh VENV}" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
vpy="$venv/bin/python"
vendor=${LINGBOT_SHARED:-$root/../shared}/vendor
log() { printf '[test_deps] %s\n' "$*"; }

if [ ! -d "$vendor/launch" ]; then
  log "skipped: $vendor not found (set LINGBOT_SHARED); the real-launch tests will skip"
  exit 0
fi
packages=(launch launch_ros composition_interfaces)
vendor_hash=$( { cat "$root/requirements-test-launch.txt" "$0" "$root/scripts/ament_build.sh" \
  "$venv/.deps_hash" 2>/dev/null; for p in "${packages[@]}"; do
    find "$vendor/$p" -type f ! -path '*/build/*' ! -path '*.egg-info/*' | sort | xargs cat; done; } \
  | sha256sum | cut -c1-16)
if [ "$(cat "$venv/.test_deps_hash" 2>/dev/null)" = "$vendor_hash" ] \
  && "$vpy" -c "import launch.launch_service, launch_ros.actions, composition_interfaces.srv" 2>/dev/null; then
  log "launch packages up to date"
  exit 0
fi

start=$SECONDS
# pip builds in the source tree, and the shared folder is read-only: build from copies.
work="$venv/build/vendor"
rm -rf "$work"
mkdir -p "$work"
for p in "${packages[@]}"; do
  cp -r "$vendor/$p" "$work/$p"
  rm -rf "$work/$p/build" "$work/$p"/*.egg-info
done
chmod -R u+w "$work"
bash "$root/scripts/pip_quiet.sh" "$vpy" --no-deps "$work/launch" "$work/launch_ros" \
  -r "$root/requirements-test-launch.txt"

. "$root/scripts/ament_build.sh"
fix_wheel_cmake_paths
build_and_install "$work/composition_interfaces" "$venv/build/composition_interfaces"

"$vpy" -c "import launch.launch_service, launch_ros.actions, composition_interfaces.srv" \
  || { log "the launch packages do not import in $venv"; exit 1; }
echo "$vendor_hash" > "$venv/.test_deps_hash"
log "launch, launch_ros, composition_interfaces installed into $venv ($(( SECONDS - start )) s)"
