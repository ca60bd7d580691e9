"""Where does a streamed frame's GPU time go? Kernel time per category and per model part.

Released architecture (random weights: speed only), 518x378 synthetic frames on the GPU, the
session's default precision. Streams frames and, at each frame count in `--at`, records
`--frames` frames under torch.profiler and prints, per frame: GPU kernel time by category
(global attention, frame attention, GEMM, Inductor's fused kernels, convolution, layer norm,
elementwise, copies, other), by model part (aggregator, camera head, depth head, the rest; eager
only, a replayed graph has no host ranges) and the top kernels; with several counts, also a
table of the categories side by side (what grows with the stream).

    python bench/profile_frame.py                          # CUDA, kernels launched one by one at frame 80
    python bench/profile_frame.py --graphs --at 100 1000 2000   # the deployed form, as the stream grows
    python bench/profile_frame.py --preset tiny --device cpu --height 84 --width 112 --at 10 --frames 2   # smoke
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
from lingbot_ros.mapping import factory  # noqa: E402
from lingbot_ros.mapping.settings import MapperSettings  # noqa: E402

# First matching pattern (lower-case substring of the kernel name) names the category.
CATEGORIES = [
    ("global attention (FlashInfer)", ("flashinfer", "prefill", "batchprefill")),
    ("fused (Inductor)", ("triton_",)),
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


def profile_frames(session, images, start: int, n: int, cuda: bool):
    """Kernel events of `n` frames streamed from frame `start` (device events only)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        for i in range(n):
            session.step(images[(start + i) % images.shape[0]])
        if cuda:
            torch.cuda.synchronize()
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def report(device_events, n: int, at: int, top: int) -> dict[str, float]:
    """Print one profiled point's tables; returns ms per frame by category."""
    # record_function ranges also appear on the device timeline (user annotations), spanning
    # the kernels launched inside them.
    parts = [(e.time_range.start, e.time_range.end, e.name[6:]) for e in device_events
             if e.name.startswith("part::")]
    events = [e for e in device_events if not e.name.startswith("part::")]
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
    print(f"\n## {n} frames after {at}: {total / n / 1e3:.2f} ms of GPU kernels per frame, "
          f"{len(events) / n:.0f} kernels per frame\n")
    print("| category | ms per frame | share |\n| --- | --- | --- |")
    for label, us in sorted(by_cat.items(), key=lambda kv: -kv[1]):
        print(f"| {label} | {us / n / 1e3:.2f} | {us / total:.0%} |")
    if parts:
        print("\n| part | ms per frame (kernels launched inside it) |\n| --- | --- |")
        for label, us in sorted(by_part.items(), key=lambda kv: -kv[1]):
            print(f"| {label} | {us / n / 1e3:.2f} |")
    print("\n| kernel | calls per frame | ms per frame |\n| --- | --- | --- |")
    for name, (us, calls) in sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"| {name[:110]} | {calls / n:.0f} | {us / n / 1e3:.3f} |")
    by_cat["total"] = total
    return {label: us / n / 1e3 for label, us in by_cat.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="lingbot-map")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, cpu or auto")
    ap.add_argument("--height", type=int, default=378)
    ap.add_argument("--width", type=int, default=518)
    ap.add_argument("--at", type=int, nargs="+", default=[80], help="frame counts at which to profile")
    ap.add_argument("--frames", type=int, default=3, help="frames profiled at each count")
    ap.add_argument("--graphs", action="store_true",
                    help="replay the frame step's CUDA graph (as deployed) instead of launching its kernels")
    ap.add_argument("--top", type=int, default=25, help="kernels listed")
    args = ap.parse_args(argv)

    settings = MapperSettings(model_config=args.preset, checkpoint="", device=args.device, num_scale_frames=8,
                              camera_num_iterations=4, sliding_window=64, scale_frames=8, cuda_graphs=args.graphs)
    device = factory.resolve_device(args.device)
    model, _ = factory.load_model(settings, device)
    if not args.graphs:
        label_parts(model)
    session = factory.new_session(model, settings)
    images = synthetic_frames(64, args.height, args.width, device)
    cuda = device.startswith("cuda")
    done, points = 0, {}
    for at in sorted(args.at):
        for i in range(done, at):
            session.step(images[i % 64])
        events = profile_frames(session, images, at, args.frames, cuda)
        done = at + args.frames
        if not events:
            print("no device kernels recorded (CPU run): plumbing check only")
            return 0
        points[at] = report(events, args.frames, at, args.top)
    if len(points) > 1:
        counts = list(points)
        labels = sorted({label for p in points.values() for label in p}, key=lambda l: -points[counts[-1]].get(l, 0))
        print("\n| category, ms per frame | " + " | ".join(f"at {c}" for c in counts) + " |")
        print("| --- |" + " --- |" * len(counts))
        for label in labels:
            print(f"| {label} | " + " | ".join(f"{points[c].get(label, 0.0):.2f}" for c in counts) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
