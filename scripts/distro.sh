# Sourced by scripts/setup.sh and scripts/test.sh: which ROS 2 distro's wheels, which venv.
#   ROS_DISTRO   kilted (default) or jazzy
#   LINGBOT_VENV the venv; default .venv for Kilted, .venv-jazzy for Jazzy, so the two coexist
# Sets: distro, venv, req_suffix (requirements-ros$req_suffix.txt, requirements-interfaces$req_suffix.txt).
distro=${ROS_DISTRO:-kilted}
case "$distro" in
  kilted) req_suffix=""; default_venv="$root/.venv" ;;
  jazzy) req_suffix="-jazzy"; default_venv="$root/.venv-jazzy" ;;
  *)
    echo "ROS_DISTRO=$distro has no pinned wheel set here: use ROS_DISTRO=kilted (default) or" \
      "ROS_DISTRO=jazzy (a sourced ROS distro sets ROS_DISTRO too; unset it for the venv set-up)" >&2
    exit 2 ;;
esac
venv=${LINGBOT_VENV:-$default_venv}
