# Sourced on the GPU machine from the repo root: FlashInfer 0.7.4 (slim) and tvm-ffi from .gpu/
# into /tmp/site, and FlashInfer's prebuilt modules from .gpu/fi_aot.tar.xz when there (see
# bench/device/build_aot.sh). Sets PY, PYTHONPATH, MAX_JOBS.
PY=/opt/torch/.venv/bin/python3
mkdir -p /tmp/site && $PY -m pip install -q --no-index --no-deps --target /tmp/site .gpu/apache_tvm_ffi-*.whl \
  && tar -xJf .gpu/flashinfer_python-0.7.4-slim.tar.xz -C /tmp/site || return 1
if [ -f .gpu/fi_aot.tar.xz ]; then mkdir -p /tmp/site/flashinfer/data/aot && tar -xJf .gpu/fi_aot.tar.xz -C /tmp/site/flashinfer/data/aot; fi
export PY PYTHONPATH=/tmp/site MAX_JOBS=16
