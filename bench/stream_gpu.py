"""Streaming frame-time benchmark of the released architecture on one GPU (issue: real time on an H200).

Random weights (speed and memory only), a synthetic smooth 518x378 image sequence already on the
GPU, the session's default dtype policy (bf16 aggregator + KV cache, fp32 heads).

    python bench/stream_gpu.py                      # the full table: 2,000 frames + variants
    python bench/stream_gpu.py --frames 300 --variant-frames 200 --no-write
    python bench/stream_gpu.py --preset tiny --frames 20 --variant-frames 10 --device cpu --no-write  # smoke

Frame time = from handing the image tensor to ``StreamingSession.step`` until pose and depth are
ready (a device sync), so it includes the host work. Prints a markdown table and, unless
``--no-write``, appends it with the date, the command and the machine to bench/README.md.
"""
from __future__ import annotations

import argparse
import datetime
import math
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not

from lingbot_ros.mapping import factory  # noqa: E402
from lingbot_ros.mapping.settings import MapperSettings  # noqa: E402


def synthetic_frames(n: int, height: int, width: int, device: str) -> torch.Tensor:
    """A smooth moving colour pattern, never all zeros: [n, 3, H, W] in [0, 1]."""
    ys = torch.linspace(0, 1, height, device=device).view(height, 1)
    xs = torch.linspace(0, 1, width, device=device).view(1, width)
    t = torch.arange(n, device=device, dtype=torch.float32).view(n, 1, 1, 1) * 0.05
    base = torch.stack([torch.sin(6 * xs + 2 * ys), torch.cos(5 * ys - 3 * xs), torch.sin(4 * (xs + ys))], 0)
    return (0.5 + 0.4 * torch.sin(base.unsqueeze(0) * 3 + t)).clamp(0, 1)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_variant(model, name: str, settings: MapperSettings, frames: int, pattern: str, device: str,
                height: int, width: int) -> dict:
    """Stream ``frames`` frames; returns per-frame times (ms) and memory readings."""
    session = factory.new_session(model, settings)
    images = synthetic_frames(min(frames, 64), height, width, device)
    times_ms: list[float] = []
    mem_at: dict[int, int] = {}
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    warm_start = time.perf_counter()
    warmup_s = None
    for i in range(frames):
        img = images[i % images.shape[0]]
        sync(device)
        t0 = time.perf_counter()
        if pattern == "motion":
            # The node's motion policy: every frame stored with deferred eviction, then either
            # kept (flush) or rolled back; here every third frame is rolled back.
            results = session.step(img, keyframe=True)
            if session.stats().frames_stored > settings.num_scale_frames and i % 3 == 2:
                session.rollback_last_frame()
            else:
                session.flush()
        else:
            results = session.step(img)
        for r in results:
            r.pose_enc, r.depth  # noqa: B018 - the outputs whose readiness we time
        sync(device)
        dt = (time.perf_counter() - t0) * 1e3
        if warmup_s is None and i == settings.num_scale_frames:   # phase 1 + first captured frame
            warmup_s = time.perf_counter() - warm_start
        if i >= settings.num_scale_frames:
            times_ms.append(dt)
        if device.startswith("cuda") and i + 1 in (100, frames):
            mem_at[i + 1] = torch.cuda.memory_allocated()
    session_stats = session.stats()
    out = {"name": name, "times": times_ms, "warmup_s": warmup_s or 0.0, "mem_at": mem_at,
           "stats": session_stats.kv_cache, "captures": session_stats.graph_captures,
           "capture_s": session_stats.graph_capture_seconds,
           "peak": torch.cuda.max_memory_allocated() if device.startswith("cuda") else 0,
           "reserved": torch.cuda.memory_reserved() if device.startswith("cuda") else 0}
    del session
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def count_syncs(model, settings: MapperSettings, frames: int, device: str, height: int, width: int) -> list[str]:
    """Stream ``frames`` phase-2 frames with torch's sync debug mode on; returns the distinct
    places (file:line of the caller) where the frame loop made the host wait for the device."""
    import traceback
    import warnings

    session = factory.new_session(model, settings)
    images = synthetic_frames(settings.num_scale_frames + frames, height, width, device)
    for img in images[:settings.num_scale_frames]:
        session.step(img)
    sync(device)
    places: list[str] = []

    def record(message, category, filename, lineno, file=None, line=None):
        frames_ = [f for f in traceback.extract_stack()[:-1] if "lingbot_ros" in f.filename]
        where = f"{frames_[-1].filename.split('lingbot_ros/')[-1]}:{frames_[-1].lineno}" if frames_ else filename
        places.append(f"{where}: {str(message)[:80]}")

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():   # restores showwarning on exit
            warnings.simplefilter("always")
            warnings.showwarning = record
            for img in images[settings.num_scale_frames:]:
                session.step(img)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sorted(set(places))


def segment_medians(times: list[float], edges: list[int]) -> str:
    parts = []
    for lo, hi in zip(edges, edges[1:]):
        seg = times[lo:hi]
        if seg:
            parts.append(f"{lo}-{hi}: {statistics.median(seg):.1f}")
    return "; ".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="lingbot-map", help="model preset (default: the released architecture)")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, cpu or auto")
    ap.add_argument("--frames", type=int, default=2000, help="frames of the main run")
    ap.add_argument("--variant-frames", type=int, default=400, help="frames of each variant run")
    ap.add_argument("--height", type=int, default=378)
    ap.add_argument("--width", type=int, default=518)
    ap.add_argument("--dtype", default="auto", help="session dtype policy: auto (bf16 on CUDA) or float32")
    ap.add_argument("--backend", default="auto", help="global attention backend: auto, torch or flashinfer")
    ap.add_argument("--no-graphs", action="store_true", help="eager frame steps only (no CUDA graphs)")
    ap.add_argument("--no-fused-blocks", action="store_true", help="eager kernels in the blocks (no torch.compile)")
    ap.add_argument("--sync-check-frames", type=int, default=5,
                    help="phase-2 frames streamed under torch's sync debug mode (CUDA only; 0 = skip)")
    ap.add_argument("--no-write", action="store_true", help="do not append the table to bench/README.md")
    ap.add_argument("--only", nargs="*", default=None,
                    help="run only the variants whose names start with these words (e.g. default fp8)")
    args = ap.parse_args(argv)

    torch.manual_seed(0)
    settings = MapperSettings(
        model_config=args.preset, checkpoint="", device=args.device, dtype=args.dtype,
        attention_backend=args.backend, cuda_graphs=not args.no_graphs, fused_blocks=not args.no_fused_blocks,
        num_scale_frames=8, keyframe_interval=1, camera_num_iterations=4, sliding_window=64, scale_frames=8)
    device = factory.resolve_device(args.device)
    t0 = time.perf_counter()
    # Matmul weights stored in the sessions' compute dtype, as the node does: every variant
    # computes in the same dtype.
    model, _ = factory.load_model(settings, device)
    build_s = time.perf_counter() - t0
    variants = [
        ("default", settings, args.frames, "plain"),
        ("keyframe interval 4", replace(settings, keyframe_interval=4), args.variant_frames, "plain"),
        ("1 camera iteration", replace(settings, camera_num_iterations=1), args.variant_frames, "plain"),
        # The motion keyframe policy is what defers evictions (the rollback pattern is run_variant's).
        ("deferred eviction + rollback", replace(settings, keyframe_policy="motion"), args.variant_frames,
         "motion"),
    ]
    if not args.no_graphs:
        variants.append(("eager (CUDA graphs and fused blocks off)",
                         replace(settings, cuda_graphs=False, fused_blocks=False), args.variant_frames, "plain"))
    # The FP8 K/V cache over as many frames as the default run: its speed and peak memory at
    # frames 1,000-2,000 are the figures that count.
    variants.append(("fp8 K/V cache", replace(settings, kv_cache_dtype="fp8"), args.frames, "plain"))
    if args.only:
        variants = [v for v in variants if any(v[0].startswith(word) for word in args.only)]
    rows = []
    for name, variant, frames, pattern in variants:
        print(f"running {name}: {frames} frames", file=sys.stderr, flush=True)
        rows.append(run_variant(model, name, variant, frames, pattern, device, args.height, args.width))

    gib = 1024 ** 3
    lines = ["| run | frames | median ms | p99 ms | p99/median | FPS | warm-up s | graph captures (s) |"
             " per-segment medians (ms) | allocated GiB (f100 / end) | peak GiB |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        t = r["times"]
        med, p99 = statistics.median(t), percentile(t, 99)
        edges = [0, 100, 500, 1000, 1500, 2000] if len(t) > 500 else [0, 100, len(t)]
        mem = " / ".join(f"{v / gib:.2f}" for v in r["mem_at"].values()) or "-"
        lines.append(f"| {r['name']} | {len(t)} | {med:.1f} | {p99:.1f} | {p99 / med:.2f} | {1e3 / med:.1f} | "
                     f"{r['warmup_s']:.1f} | {r['captures']} ({r['capture_s']:.2f}) | {segment_medians(t, edges)} | {mem} | {r['peak'] / gib:.2f} |")
    main_run = rows[0]
    st = main_run["stats"]
    lines.append("")
    lines.append(f"Model build {build_s:.1f} s. Cache at the end of the main run: {st}.")
    if len(main_run["mem_at"]) == 2:
        (f_a, m_a), (f_b, m_b) = list(main_run["mem_at"].items())
        lines.append(f"Allocated-memory growth from frame {f_a} to {f_b}: "
                     f"{(m_b - m_a) / max(1, f_b - f_a) / 1024:.1f} KiB per frame.")
    if device.startswith("cuda") and args.sync_check_frames:
        places = count_syncs(model, settings, args.sync_check_frames, device, args.height, args.width)
        lines.append(f"Host-device syncs inside the frame step ({args.sync_check_frames} frames, torch sync "
                     f"debug mode): {'none' if not places else '; '.join(places)}.")
    table = "\n".join(lines)
    print(table)
    if not args.no_write:
        append_to_readme("stream_gpu.py", argv, table, device)
    return 0


def append_to_readme(script: str, argv, table: str, device: str) -> None:
    """Append a run's table to bench/README.md with the date, the machine and the command."""
    dev = torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor()
    with open(Path(__file__).with_name("README.md"), "a") as fh:
        fh.write(f"\n### {script}, {datetime.date.today()}, {dev}, torch {torch.__version__}\n\n"
                 f"`python bench/{script} {' '.join(argv if argv is not None else sys.argv[1:])}`\n\n"
                 f"{table}\n")


if __name__ == "__main__":
    sys.exit(main())
