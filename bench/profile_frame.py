"""Where does a streamed frame's GPU time go? Kernel time per category and per model part.

Released architecture (default weights: speed only), 518x378 synthetic frames on the GPU, the
session's default precision. Streams `--warm-frames` frames eagerly (so the window is full), then
records `--frames` more under torch.profiler and prints, per frame: GPU kernel time by category
(global attention, frame attention, GEMM, convolution, layer norm, elementwise, copies, other),
by model part (aggregator, camera head, depth head, the rest) and the top kernels.

    python bench/profile_frame.py                     # CUDA
    python bench/profile_frame.py --preset tiny --device cpu --height 84 --width 112 --warm-frames 10 --frames 2   # smoke
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not

from bench.stream_gpu import synthetic_frames  # noqa: E402
from lingbot_ros.model import ModelConfig, build_model  # noqa: E402
from lingbot_ros.stream import StreamingSession, StreamSettings  # noqa: E402

# First matching pattern (lower-case substring of the kernel name) names the category.
CATEGORIES = [
    ("global attention (FlashInfer)", ("flashinfer", "prefill", "batchprefill")),
    ("frame/camera attention (SDPA)", ("fmha", "flash_fwd", "cudnn", "attention", "sdpa")),
    ("convolution", ("conv", "implicit_gemm", "winograd", "fprop", "dgrad", "wgrad")),
    ("GEMM", ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "cublas")),
    ("layer norm", ("layer_norm", "layernorm")),
    ("copies / cat / index", ("copy", "cat", "index", "gather", "scatter")),
    ("elementwise / reduce", ("elementwise", "vectorized", "reduce", "unrolled")),
]
PARTS = ("aggregator", "camera_head", "depth_head")


def category(name: str) -> str:
    low = name.lower()
    for label, patterns in CATEGORIES:
        if any(p in low for p in patterns):
            return label
    return "other"


def label_parts(model) -> None:
    """Wrap the model's three parts in profiler ranges (instance attributes shadow forward)."""
    for part in PARTS:
        module = getattr(model, part)
        inner = module.forward

        def forward(*args, _inner=inner, _name=part, **kwargs):
            with record_function(f"part::{_name}"):
                return _inner(*args, **kwargs)
        module.forward = forward


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="lingbot-map")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--height", type=int, default=378)
    ap.add_argument("--width", type=int, default=518)
    ap.add_argument("--warm-frames", type=int, default=80, help="frames streamed before profiling")
    ap.add_argument("--frames", type=int, default=3, help="frames profiled")
    ap.add_argument("--top", type=int, default=25, help="kernels listed")
    args = ap.parse_args(argv)

    model = build_model(ModelConfig.preset(args.preset), device=args.device, random_init=False)
    settings = StreamSettings(num_scale_frames=8, camera_num_iterations=4, sliding_window=64, scale_frames=8,
                              cuda_graphs=False)
    model.store_matmul_weights(settings.compute_dtype(model.device))
    label_parts(model)
    session = StreamingSession(model, settings)
    images = synthetic_frames(64, args.height, args.width, args.device)
    for i in range(args.warm_frames):
        session.step(images[i % 64])
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        for i in range(args.frames):
            session.step(images[(args.warm_frames + i) % 64])
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    device_events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not device_events:
        print("no device kernels recorded (CPU run): plumbing check only")
        return 0
    # record_function ranges also appear on the device timeline (user annotations), spanning
    # the kernels launched inside them.
    parts = [(e.time_range.start, e.time_range.end, e.name[6:]) for e in device_events
             if e.name.startswith("part::")]
    events = [e for e in device_events if not e.name.startswith("part::")]
    n = args.frames
    by_cat: dict[str, float] = collections.Counter()
    by_part: dict[str, float] = collections.Counter()
    by_kernel: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for e in events:
        us = e.time_range.elapsed_us()
        by_cat[category(e.name)] += us
        by_kernel[e.name][0] += us
        by_kernel[e.name][1] += 1
        start = e.time_range.start
        by_part[next((name for lo, hi, name in parts if lo <= start <= hi),
                     "rest (cache step, geometry, copies)")] += us
    total = sum(by_cat.values())
    print(f"{n} frames after {args.warm_frames}: {total / n / 1e3:.2f} ms of GPU kernels per frame, "
          f"{len(events) / n:.0f} kernels per frame\n")
    print("| category | ms per frame | share |\n| --- | --- | --- |")
    for label, us in sorted(by_cat.items(), key=lambda kv: -kv[1]):
        print(f"| {label} | {us / n / 1e3:.2f} | {us / total:.0%} |")
    if parts:
        print("\n| part | ms per frame (kernels launched inside it) |\n| --- | --- |")
        for label, us in sorted(by_part.items(), key=lambda kv: -kv[1]):
            print(f"| {label} | {us / n / 1e3:.2f} |")
    print("\n| kernel | calls per frame | ms per frame |\n| --- | --- | --- |")
    for name, (us, calls) in sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"| {name[:110]} | {calls / n:.0f} | {us / n / 1e3:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
