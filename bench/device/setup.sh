# Sourced on the GPU machine from the repo root: FlashInfer 0.7.4 (slim) and tvm-ffi from .gpu/
# into /tmp/site, and FlashInfer's prebuilt modules from .gpu/fi_aot.tar.xz when there (see
# bench/device/build_aot.sh), and the ROS bundle from .gpu_ros/ when there. Sets PY, PYTHONPATH,
# MAX_JOBS.
PY=/opt/torch/.venv/bin/python3
mkdir -p /tmp/site && $PY -m pip install -q --no-index --no-deps --target /tmp/site .gpu/apache_tvm_ffi-*.whl \
  && tar -xJf .gpu/flashinfer_python-0.7.4-slim.tar.xz -C /tmp/site || return 1
if [ -f .gpu/fi_aot.tar.xz ]; then mkdir -p /tmp/site/flashinfer/data/aot && tar -xJf .gpu/fi_aot.tar.xz -C /tmp/site/flashinfer/data/aot; fi
# The ROS bundle of bench/ros_runtime_bundle.sh (rclpy, the interfaces, simplejpeg, which the
# package's image decoding imports) when carried; its env.sh sets PYTHONPATH to the repo and itself.
if [ -f .gpu_ros/ros312.tar.xz ]; then
  mkdir -p /tmp/ros312 && tar -xJf .gpu_ros/ros312.tar.xz -C /tmp/ros312 && . /tmp/ros312/ros312/env.sh || return 1
fi
export PY PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/site MAX_JOBS=16
