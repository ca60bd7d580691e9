# Sourced by scripts/build_interfaces.sh and scripts/install_ros2cli.sh: build an ament_cmake package
# (msg/srv generation) into a venv prefix, as colcon does in a workspace. Needs $venv and $vpy.
# Build folders go under $venv/build, so venvs of two distros never share a CMake cache.

# The PyPI ROS wheels hard-code their manylinux build paths (/opt/python/...) in their CMake export
# files; point them at this interpreter's headers and numpy (notes/ros2_wheels.md section 2).
fix_wheel_cmake_paths() {
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
}

# build_and_install SOURCE_DIR BUILD_DIR [CMAKE_ARGS...]
build_and_install() {
  local src=$1 dir=$2 gen=()
  shift 2
  command -v ninja >/dev/null && gen=(-G Ninja)
  [ -f "$dir/CMakeCache.txt" ] && gen=()   # the generator is fixed at the first configure
  AMENT_PREFIX_PATH="$venv" CMAKE_PREFIX_PATH="$venv" cmake -S "$src" -B "$dir" "${gen[@]}" \
    -DBUILD_TESTING=OFF -DCMAKE_INSTALL_PREFIX="$venv" -DPython3_EXECUTABLE="$vpy" \
    -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
  cmake --build "$dir" -j 2 >/dev/null
  cmake --install "$dir" >/dev/null
}
