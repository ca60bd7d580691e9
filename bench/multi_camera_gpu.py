"""Several cameras through one model (issue 29): N streams batched in one step against the same
N streams run one after another, released architecture, one GPU.

Random weights (speed and memory only), synthetic smooth 518x378 sequences already on the GPU (a
different phase per stream), the session's default dtype policy (bf16 aggregator + KV cache,
fp32 heads), sliding window 64 + 8 anchors, keyframe interval 1.

    python bench/multi_camera_gpu.py                          # N = 1, 2, 4; appends to bench/README.md
    python bench/multi_camera_gpu.py --streams 1 2 --warmup 10 --steps 20 --no-write
    python bench/multi_camera_gpu.py --preset tiny --device cpu --height 84 --width 112 \\
        --warmup 3 --steps 4 --no-write                        # smoke

For each N, after every stream's phase 1 and `--warmup` steps (72 fill the window: steady state):
- batched: `MultiStreamSession.step` with one frame per stream, `--steps` times (eager steps on
  CUDA, fused block kernels compiled per stream count: see stream/multi_session.py);
- one after another: N `StreamingSession`s (each its own cache, CUDA graphs as the node runs one
  camera), each stepped once per step, in the same loop;
- the same eager (`cuda_graphs` off, fused blocks on), which separates what batching gains from
  what the graphs gain (the batched steps have no graph yet).
Aggregate frames/s = N * steps / wall time (a device sync after each step, so the host work
counts). Peak memory: the peak allocated during the run above what was allocated before it
(weights), and per added stream against N = 1.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not

from bench.stream_gpu import append_to_readme, sync, synthetic_frames  # noqa: E402
from lingbot_ros.mapping import factory  # noqa: E402
from lingbot_ros.mapping.settings import MapperSettings  # noqa: E402
from lingbot_ros.stream import MultiStreamSession, StreamFrame, StreamingSession  # noqa: E402


def run(kind: str, model, stream_settings, num_streams: int, images: torch.Tensor, warmup: int, steps: int,
        device: str) -> dict:
    """Phase 1 of every stream, `warmup` steps, then `steps` timed steps -> aggregate FPS, peak."""
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else 0
    count = images.shape[0]

    def image(s: int, i: int) -> torch.Tensor:
        return images[(i + 7 * s) % count]     # each stream its own phase of the sequence

    if kind == "batched":
        session = MultiStreamSession(model, num_streams, stream_settings)

        def step(i: int) -> None:
            out = session.step([StreamFrame(s, image(s, i)) for s in range(num_streams)])
            for results in out.values():
                for r in results:
                    r.pose_enc, r.depth  # noqa: B018 - the outputs whose readiness we time
    else:
        sessions = [StreamingSession(model, stream_settings) for _ in range(num_streams)]

        def step(i: int) -> None:
            for s, single in enumerate(sessions):
                for r in single.step(image(s, i)):
                    r.pose_enc, r.depth  # noqa: B018

    first = stream_settings.num_scale_frames
    for i in range(first + warmup):
        step(i)
    sync(device)
    start = time.perf_counter()
    for i in range(first + warmup, first + warmup + steps):
        step(i)
        sync(device)
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated() - before) if cuda else 0
    return {"fps": num_streams * steps / seconds, "step_ms": seconds / steps * 1e3, "peak": peak}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="lingbot-map", help="model preset (default: the released architecture)")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, cpu or auto")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4], help="stream counts N")
    ap.add_argument("--warmup", type=int, default=72, help="steps after phase 1 before timing (72 fill the window)")
    ap.add_argument("--steps", type=int, default=100, help="timed steps per run")
    ap.add_argument("--height", type=int, default=378)
    ap.add_argument("--width", type=int, default=518)
    ap.add_argument("--no-write", action="store_true", help="do not append the table to bench/README.md")
    args = ap.parse_args(argv)

    torch.manual_seed(0)
    settings = MapperSettings(model_config=args.preset, checkpoint="", device=args.device,
                              num_scale_frames=8, keyframe_interval=1, camera_num_iterations=4,
                              sliding_window=64, scale_frames=8)
    device = factory.resolve_device(args.device)
    model, _ = factory.load_model(settings, device)
    stream_settings = factory.stream_settings(settings)
    images = synthetic_frames(64, args.height, args.width, device)
    gib = 1024 ** 3
    rows, base_peak = [], None
    for n in args.streams:
        results = {}
        eager = dataclasses.replace(stream_settings, cuda_graphs=False)
        for kind, variant in (("batched", stream_settings), ("one after another", stream_settings),
                              ("one after another, eager", eager)):
            print(f"running N={n} {kind}", file=sys.stderr, flush=True)
            results[kind] = run(kind, model, variant, n, images, args.warmup, args.steps, device)
        batched, serial, serial_eager = (results[k] for k in ("batched", "one after another",
                                                              "one after another, eager"))
        if n == 1:
            base_peak = batched["peak"]
        per_added = ("-" if base_peak is None or n == 1
                     else f"{(batched['peak'] - base_peak) / (n - 1) / gib:.2f}")
        rows.append(f"| {n} | {batched['fps']:.1f} | {batched['step_ms']:.1f} | {serial['fps']:.1f} | "
                    f"{serial['step_ms']:.1f} | {batched['fps'] / serial['fps']:.2f} | "
                    f"{serial_eager['fps']:.1f} | {batched['fps'] / serial_eager['fps']:.2f} | "
                    f"{batched['peak'] / gib:.2f} | {serial['peak'] / gib:.2f} | {per_added} |")
    table = "\n".join(
        ["| N | batched FPS (all streams) | batched step ms | one after another FPS | one after another step ms |"
         " speed-up | one after another eager FPS | speed-up vs eager | batched peak GiB |"
         " one after another peak GiB | GiB per added stream (batched) |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"] + rows)
    print(table)
    if not args.no_write:
        append_to_readme("multi_camera_gpu.py", argv, table, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
