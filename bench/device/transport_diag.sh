#!/usr/bin/env bash
# On the GPU machine, after `. bench/device/setup.sh`: where the node's input frames go missing
# there (the node received 40-60% of 10 Hz input in gpu_checks.sh while two bare processes,
# bench/dds_transport.py, lost none). The same short node_latency run on CUDA pinned to 2 cores
# (the development machine's count, where nothing is lost) and on all 16, and the tiny model on
# the CPU; a per-thread CPU snapshot of the node mid-run. Tables to stdout, logs to $OUT.
set -u
common=(--rates 10 30 --seconds 5 --image-size 518x378)
cuda=(--device cuda --model-config lingbot-map --checkpoint none --image-width 518
      --num-scale-frames 8 --window 64)
snapshot() { sleep "$1"; top -b -H -n 1 -w 200 | head -45 > "$OUT/top_$2.txt" 2>&1; }
snapshot 45 cuda16 & taskset -c 0-15 $PY bench/node_latency.py "${cuda[@]}" "${common[@]}" \
  --node-log "$OUT/node_cuda16.log" 2>&1 | tail -6; wait
snapshot 45 cuda2 & taskset -c 0-1 $PY bench/node_latency.py "${cuda[@]}" "${common[@]}" \
  --node-log "$OUT/node_cuda2.log" 2>&1 | tail -6; wait
$PY bench/node_latency.py --model-config tiny --checkpoint none "${common[@]}" \
  --node-log "$OUT/node_tiny.log" 2>&1 | tail -6
