#!/usr/bin/env bash
# On the GPU machine, after bench/device/setup.sh: JIT-build FlashInfer's modules the model uses
# for the given caches (default: auto fp8), through lingbot-ros-prebuild, and pack every built
# module, with those already unpacked from .gpu/fi_aot.tar.xz, into $OUT/fi_aot.tar.xz. FlashInfer
# loads flashinfer/data/aot/<name>/<name>.so without building (its AOT path): with the archive
# copied to .gpu/, later calls skip the ~100 s JIT build per module.
#
#   . bench/device/setup.sh && AOT_BUILD_LIMIT_S=150 bash bench/device/build_aot.sh fp8
set -u
WS=/tmp/fiws; export FLASHINFER_WORKSPACE_BASE=$WS
AOT=/tmp/site/flashinfer/data/aot
for dtype in ${@:-auto fp8}; do
  timeout "${AOT_BUILD_LIMIT_S:-170}" $PY -m lingbot_ros.tools.prebuild --kv-cache-dtype $dtype \
    > "$OUT/prebuild_$dtype.log" 2>&1 &
done
wait
mkdir -p "$AOT" && find "$WS" -name '*.so' 2>/dev/null | while read -r so; do
  n=$(basename "$so" .so); mkdir -p "$AOT/$n" && cp "$so" "$AOT/$n/"
done
tar -C "$AOT" -cf - . | xz -T16 -6 > "$OUT/fi_aot.tar.xz"
ls "$AOT"; ls -la "$OUT"
