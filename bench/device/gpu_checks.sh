#!/usr/bin/env bash
# On the GPU machine, after `. bench/device/setup.sh`: Fast DDS alone (dds), the start-up measure
# (startup), the CUDA test files (tests), then the node at 10/20/30 Hz with raw and with
# compressed input, and raw with process_all_frames (all) (bench/node_latency.py, released
# architecture, random weights, 518x378), through the ROS bundle of bench/ros_runtime_bundle.sh
# (carry .gpu_ros).
# Logs and tables go to $OUT. About 6 minutes with FlashInfer's modules prebuilt (.gpu/fi_aot.tar.xz).
#
# longrun: bench/long_run_gpu.py with bf16 and FP8 K/V (windowed defaults; LONG_RUN_AHEAD=1 adds
# each with window_switch_ahead); fp8error: model_gpu.py's
# error table with the FP8 cache; switch: bench/switch_cost.py (a window switch part by part).
#
#   . bench/device/setup.sh && bash bench/device/gpu_checks.sh [dds] [startup] [tests] [raw] [compressed] [all] [longrun] [fp8error] [switch]
set -u
[ -d /tmp/ros312/ros312 ] || { echo "carry .gpu_ros and source bench/device/setup.sh first"; exit 1; }
steps=${*:-dds tests raw compressed}
for step in $steps; do
  case $step in
    dds)
      # Fast DDS alone (no node): which transport carries 587 KB images between two processes here.
      (id; df -B1M /dev/shm; mount | grep -E 'shm|tmpfs'; ulimit -a) > "$OUT/dds_env.txt" 2>&1
      $PY bench/dds_transport.py --seconds 5 2>&1 | tee "$OUT/dds_transport.md" ;;
    startup)
      # Issue 26 target 5: a released-size checkpoint file, lingbot-ros-prebuild, two node starts.
      $PY bench/startup_gpu.py 2>&1 | tee "$OUT/startup.txt" | tail -6 ;;
    longrun)
      # Issue 26 targets 3 and 4 under the windowed defaults: LONG_RUN_FRAMES (default 2000) through
      # the Mapper, bf16 and FP8 K/V; each summary (frame times, switches, peak memory) to $OUT.
      # First the depth head's phase-1 transient, 8 frames at once against one at a time.
      $PY bench/depth_head_memory.py --device cuda 2>&1 | tee "$OUT/depth_head_memory.md"
      # LONG_RUN_AHEAD=1: with window_switch_ahead (the overlap run ahead of each switch) too;
      # LONG_RUN_EXTRA: more flags for each run (--switch-parts).
      for dtype in ${LONG_RUN_DTYPES:-auto fp8}; do
        for ahead in "" ${LONG_RUN_AHEAD:+--window-switch-ahead}; do
          name=long_run_$dtype${ahead:+_ahead}
          timeout "${LONG_RUN_LIMIT_S:-200}" $PY bench/long_run_gpu.py --frames "${LONG_RUN_FRAMES:-2000}" \
            --kv-cache-dtype $dtype $ahead ${LONG_RUN_EXTRA:-} --progress-every 500 --out /tmp/$name > "/tmp/$name.log" 2>&1
          cp /tmp/$name/summary.json "$OUT/$name.json" 2>/dev/null
          grep -E '^frame [0-9]+/|built in|Error' "/tmp/$name.log" | tail -6   # logs stay: $OUT takes 8 files
          grep -E '"(median_1000_3000|median_last_2000|model_ms_median|max_frame_ms|frames_over_2x_median|switch_ms_[a-z]+|overlap_ms_[a-z]+|peak_[a-z_0-9]+)"' \
            "$OUT/$name.json" 2>/dev/null
          $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print('before switch', [round(x,1) for x in d['before_switch_ms']]); print(d['switch_parts_ms'])" "$OUT/$name.json" 2>/dev/null
        done
      done ;;
    switch)
      # Issue 26 target 4: a window switch part by part (phase 1, each re-run, phase 1's memory).
      timeout "${SWITCH_LIMIT_S:-150}" $PY bench/switch_cost.py 2>&1 | tee "$OUT/switch_cost.md" | tail -12 ;;
    fp8error)
      # Issue 26 target 3: every output's error against float32, bf16 and the FP8 K/V cache.
      timeout "${FP8_ERROR_LIMIT_S:-240}" $PY bench/model_gpu.py --frames 120 --compare-frames 120 --also-fp8 \
        > "$OUT/fp8_error.txt" 2>&1; tail -12 "$OUT/fp8_error.txt" ;;
    tests)
      $PY -m pytest -q -p no:cacheprovider test/test_cache_flashinfer.py test/test_stream_frame_graph.py \
        test/test_mapping_mapper_gpu.py test/test_stream_multi_gpu.py test/test_mapping_rig_gpu.py \
        > "$OUT/gpu_tests.log" 2>&1; tail -3 "$OUT/gpu_tests.log" ;;
    raw|compressed|all)
      # all: raw input with process_all_frames (reliable, every frame queued: none dropped by the
      # node, the latency shows whether it keeps up).
      transport=$step; extra=(); [ "$step" = all ] && transport=raw extra=(--param process_all_frames:=true)
      $PY bench/node_latency.py --device cuda --model-config lingbot-map --checkpoint none \
        --image-width 518 --image-size 518x378 --num-scale-frames 8 --window 64 \
        --rates ${NODE_RATES:-10 20 30} --seconds ${NODE_SECONDS:-10} --transport "$transport" "${extra[@]}" --node-log "$OUT/node_$step.log" \
        --out "$OUT/latency_$step" 2>&1 | tail -8 ;;
  esac
done
