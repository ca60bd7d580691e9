"""One frame step of the paged KV cache: `begin_step` + one `attend` per layer.

Streams `--frames` frames into the cache (begin_step + write per layer, no attention, so the
pages hold data), then times `--repeats` keyframe steps and reports per step:
host ms (Python time of begin_step + all attends, device not synchronised inside the step),
of which begin_step alone, and device ms (CUDA events around the step; GPU only).
With a backend that supports CUDA graphs (FlashInfer) a second row per frame count replays the
24 layers' writes + attention as one captured graph after each begin_step, as the streaming
session does: host work is then begin_step + one graph launch.

    python bench/cache_step.py                      # released sizes on CUDA: 24 x 1005 tok, 16 x 64
    python bench/cache_step.py --smoke              # small CPU run, a few seconds
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lingbot_ros.cache import CacheSpec, PagedKVCache  # noqa: E402
from lingbot_ros.stream.settings import BACKENDS, DTYPES  # noqa: E402


def parse_args() -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true",
                   help="small sizes for a CPU check: 4 layers x 37 tokens, 2 x 16 heads, window 8 + 2")
    p.add_argument("--layers", type=int, default=24, help="transformer layers (attends per step)")
    p.add_argument("--tokens", type=int, default=1005, help="tokens per frame P (page size)")
    p.add_argument("--heads", type=int, default=16, help="attention heads")
    p.add_argument("--head-dim", type=int, default=64, help="head dimension")
    p.add_argument("--window", type=int, default=64, help="sliding window Wn (frames)")
    p.add_argument("--anchors", type=int, default=8, help="anchor frames A")
    p.add_argument("--frames", default="100,1000", help="comma-separated frames streamed before timing")
    p.add_argument("--repeats", type=int, default=20, help="timed steps per row (median reported)")
    p.add_argument("--backend", default="auto", choices=BACKENDS)
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--dtype", default="bfloat16" if cuda else "float32", choices=list(DTYPES))
    args = p.parse_args()
    if args.smoke:
        args.layers, args.tokens, args.heads, args.head_dim = 4, 37, 2, 16
        args.window, args.anchors, args.frames, args.repeats = 8, 2, "20,100", 5
    return args


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    spec = CacheSpec(num_layers=args.layers, num_heads=args.heads, head_dim=args.head_dim,
                     tokens_per_frame=args.tokens, scale_frames=args.anchors,
                     sliding_window=args.window, dtype=getattr(torch, args.dtype), device=device)
    cache = PagedKVCache(spec, backend=args.backend)
    shape = (spec.tokens_per_frame, spec.num_heads, spec.head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=spec.dtype) for _ in range(3))

    def fill(frames: int) -> None:
        for _ in range(frames):
            cache.begin_step(1)
            for layer in range(spec.num_layers):
                cache.write(layer, k, v)

    graph: dict = {"version": None, "graph": None}

    def launch_graph() -> None:
        if cache.buffers_version != graph["version"]:
            for layer in range(spec.num_layers):   # warm-up; the replay rewrites the same values
                cache.attend(layer, q, k, v)
            graph["graph"], graph["version"] = torch.cuda.CUDAGraph(), cache.buffers_version
            with torch.cuda.graph(graph["graph"]):
                for layer in range(spec.num_layers):
                    cache.attend(layer, q, k, v)
        graph["graph"].replay()

    def timed_step(use_graph: bool = False) -> tuple[float, float, float | None]:
        if cuda:
            torch.cuda.synchronize()   # empty queue: host time is launch overhead only
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        cache.begin_step(1)
        t1 = time.perf_counter()
        if use_graph:
            launch_graph()
        else:
            for layer in range(spec.num_layers):
                cache.attend(layer, q, k, v)
        t2 = time.perf_counter()
        if not cuda:
            return (t2 - t0) * 1e3, (t1 - t0) * 1e3, None
        end.record()
        end.synchronize()
        return (t2 - t0) * 1e3, (t1 - t0) * 1e3, start.elapsed_time(end)

    print(f"device {device} ({torch.cuda.get_device_name(device) if cuda else 'CPU'}), "
          f"backend {cache.backend}, {spec.dtype}, {spec.num_layers} layers x {spec.tokens_per_frame} "
          f"tokens, {spec.num_heads} x {spec.head_dim} heads, window {spec.sliding_window} + "
          f"{spec.scale_frames} anchors, {args.repeats} timed steps per row\n")
    print("| frames before | layers run as | visible KV tokens | host ms/step | of which begin_step ms "
          "| device ms/step | pool GiB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    modes = [False, True] if cuda and cache.supports_graphs else [False]
    streamed = 0
    for use_graph in modes:            # untimed warm-up (first plan, kernel selection / JIT, capture)
        timed_step(use_graph)
        streamed += 1
    for target in sorted(int(n) for n in args.frames.split(",")):
        fill(max(0, target - streamed))
        streamed = max(streamed, target)
        for use_graph in modes:
            rows = [timed_step(use_graph) for _ in range(args.repeats)]
            streamed += args.repeats
            host, begin, dev = (statistics.median(r[i] for r in rows) if rows[0][i] is not None else None
                                for i in range(3))
            stats = cache.stats()
            print(f"| {target} | {'one CUDA graph' if use_graph else 'eager'} | "
                  f"{cache.step_table.num_kv_tokens:,} | {host:.3f} | {begin:.3f} | "
                  f"{'-' if dev is None else f'{dev:.2f}'} | {stats.bytes_allocated / 2**30:.2f} |")


if __name__ == "__main__":
    main()
