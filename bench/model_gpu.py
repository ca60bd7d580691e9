"""Model benchmark: bf16-vs-float32 error on the same weights, then streaming speed and memory.

    python bench/model_gpu.py                                   # released architecture, 518x378, 100 frames
    python bench/model_gpu.py --preset tiny --frames 5          # CPU smoke test

Weights are random (``--checkpoint`` loads real ones). Frames are synthetic smooth images. The
error runs share one model kept in float32 (the mixed-precision sessions round its weights under
autocast); the speed run loads the model again as the node does, its matmul weights stored in the
compute dtype. Frame time is wall time of one ``session.step`` with a device sync, over the
phase-2 frames after ``--warmup`` untimed ones. Prints a markdown table.
"""
from __future__ import annotations

import argparse
import math
import resource
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lingbot_ros.mapping import factory  # noqa: E402
from lingbot_ros.mapping.settings import MapperSettings  # noqa: E402


def synthetic_frames(n: int, height: int, width: int, device) -> torch.Tensor:
    """Smooth moving colour gradients in [0.05, 0.95]: never constant, never zero."""
    y = torch.linspace(0, 1, height, device=device)[:, None]
    x = torch.linspace(0, 1, width, device=device)[None, :]
    frames = []
    for i in range(n):
        t = i / 10
        chans = [torch.sin(6 * x + 4 * y + t + c) * torch.cos(3 * y - 2 * x + 0.5 * t * c) for c in range(3)]
        frames.append(0.5 + 0.45 * torch.stack(chans))
    return torch.stack(frames)                                                     # [n, 3, H, W]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(model, settings, frames, device, warmup=0):
    """Stream all frames; returns (results, per-frame seconds of the timed phase-2 frames)."""
    session = factory.new_session(model, settings)
    results, times = [], []
    for i, frame in enumerate(frames):
        sync(device)
        start = time.perf_counter()
        out = session.step(frame)
        sync(device)
        if i >= settings.num_scale_frames + warmup:
            times.append(time.perf_counter() - start)
        results += out
    return results, times


def relative_error(a, b, key):
    x = torch.stack([getattr(r, key) for r in a]).double()
    y = torch.stack([getattr(r, key) for r in b]).double()
    return ((x - y).norm() / y.norm()).item(), ((x - y).abs().amax() / y.abs().amax()).item()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="lingbot-map", help="model preset (lingbot-map, tiny)")
    p.add_argument("--checkpoint", default=None, help="load these weights instead of random ones")
    p.add_argument("--frames", type=int, default=100, help="frames streamed for the speed run")
    p.add_argument("--compare-frames", type=int, default=24,
                   help="frames for the bf16 vs float32 run (at most --frames)")
    p.add_argument("--width", type=int, default=518, help="input width (multiple of 14)")
    p.add_argument("--height", type=int, default=378, help="input height (multiple of 14)")
    p.add_argument("--num-scale-frames", type=int, default=8, help="phase-1 batch size")
    p.add_argument("--sliding-window", type=int, default=64, help="kv_cache.sliding_window")
    p.add_argument("--scale-frames", type=int, default=8, help="kv_cache.scale_frames (anchors)")
    p.add_argument("--backend", default="auto", help="attention backend: auto, torch, flashinfer")
    p.add_argument("--warmup", type=int, default=3, help="untimed phase-2 frames before timing")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto")
    p.add_argument("--also-fp8", action="store_true",
                   help="also the error of the mixed-precision path with the FP8 K/V cache (kv_cache_dtype fp8)")
    p.add_argument("--error-parts", action="store_true",
                   help="also the mixed-precision error with graphs and fused blocks on one at a time (CUDA)")
    args = p.parse_args(argv)

    device = torch.device(factory.resolve_device(args.device))
    # Short runs (smoke tests) shrink phase 1 and the warm-up so that some phase-2 frames get timed.
    n_scale = max(1, min(args.num_scale_frames, args.frames // 2))
    warmup = max(0, min(args.warmup, args.frames - n_scale - 2))
    low = "auto" if device.type == "cuda" else "bfloat16"   # auto = bf16 mixed precision on CUDA
    settings = MapperSettings(model_config=args.preset, checkpoint=args.checkpoint or "", device=str(device),
                              dtype=low, attention_backend=args.backend, num_scale_frames=n_scale,
                              sliding_window=args.sliding_window, scale_frames=args.scale_frames)
    float32 = replace(settings, dtype="float32")
    t0 = time.perf_counter()
    # Loaded in float32: its weights stay float32 masters, under both float32 and mixed sessions.
    model, _ = factory.load_model(float32, str(device))
    build_s = time.perf_counter() - t0
    cfg = model.config

    # 1) Same weights, same frames: mixed precision against float32.
    n_cmp = max(min(args.compare_frames, args.frames), n_scale + 1)
    frames = synthetic_frames(n_cmp, args.height, args.width, device)
    # A true float32 reference: cuDNN would otherwise run the fp32 head convolutions in TF32.
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    keys = ("pose_enc", "depth", "depth_conf", "world_points")
    # The plain path (eager kernels, no graph) against the session's defaults (fused blocks,
    # CUDA graphs where the backend allows), in float32 and in the deployment precision.
    ref, _ = run(model, replace(float32, cuda_graphs=False, fused_blocks=False), frames, device)
    fast32, _ = run(model, float32, frames, device)
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    mixed, _ = run(model, settings, frames, device)
    err = {k: relative_error(mixed, ref, k) for k in keys}
    err32 = {k: relative_error(fast32, ref, k) for k in keys}
    # Which optimisation moves the mixed-precision error: each one alone against the reference.
    parts = {}
    if args.also_fp8:
        alone, _ = run(model, replace(settings, kv_cache_dtype="fp8"), frames, device)
        parts["fp8 K/V cache (defaults otherwise)"] = {k: relative_error(alone, ref, k) for k in keys}
        del alone
    if args.error_parts and device.type == "cuda":
        for label, kw in (("no graph, no fusion", dict(cuda_graphs=False, fused_blocks=False)),
                          ("graph (split attention), no fusion", dict(fused_blocks=False)),
                          ("fusion, no graph", dict(cuda_graphs=False))):
            alone, _ = run(model, replace(settings, **kw), frames, device)
            parts[label] = {k: relative_error(alone, ref, k) for k in keys}
            del alone
    n_params = sum(p.numel() for p in model.parameters())
    del ref, fast32, mixed, frames, model

    # 2) Speed and memory in the default (deployment) precision, the model loaded as the node does.
    if device.type == "cuda":
        torch.cuda.empty_cache()
    model, _ = factory.load_model(settings, str(device))
    frames = synthetic_frames(args.frames, args.height, args.width, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _, times = run(model, settings, frames, device, warmup=warmup)
    times_ms = sorted(t * 1e3 for t in times) or [float("nan")]
    p90 = times_ms[min(len(times_ms) - 1, math.ceil(0.9 * len(times_ms)) - 1)]
    if device.type == "cuda":
        peak = f"{torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB (allocated)"
        name = torch.cuda.get_device_name(device)
    else:
        peak = f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB (process RSS)"
        name = f"CPU, {torch.get_num_threads()} threads"

    P = cfg.num_special_tokens + (args.height // cfg.patch_size) * (args.width // cfg.patch_size)
    rows = [
        ("device", name), ("torch", torch.__version__),
        ("model", f"{cfg.name} ({n_params:,} params, "
                  f"{'checkpoint' if args.checkpoint else 'random weights'}, built in {build_s:.1f} s)"),
        ("input", f"{args.width}x{args.height} ({P} tokens/frame)"),
        ("cache", f"anchors {args.scale_frames} + window {args.sliding_window}, backend {args.backend}, "
                  f"phase 1 = {settings.num_scale_frames} frames"),
        (f"rel. error {low} (defaults) vs float32 plain ({n_cmp} frames)",
         ", ".join(f"{k} {e[0]:.2e} (max {e[1]:.2e})" for k, e in err.items())),
        (f"rel. error float32 (defaults) vs float32 plain ({n_cmp} frames)",
         ", ".join(f"{k} {e[0]:.2e} (max {e[1]:.2e})" for k, e in err32.items())),
        *((f"rel. error {low}, {label}", ", ".join(f"{k} {e[0]:.2e}" for k, e in errs.items()))
          for label, errs in parts.items()),
        (f"frame time, {len(times)} timed frames", f"median {statistics.median(times_ms):.1f} ms, "
                                                    f"p90 {p90:.1f} ms, {1e3 / statistics.median(times_ms):.1f} FPS"),
        ("peak memory", peak),
    ]
    print("| metric | value |\n| --- | --- |")
    for k, v in rows:
        print(f"| {k} | {v} |")
    print(f"\nrelative error = ||a - b|| / ||b|| over all frames; max = max|a - b| / max|b|. "
          f"Command: python bench/model_gpu.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
