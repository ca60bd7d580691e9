"""Where does a streamed frame's wall time go: host work before the graphs, the graphs on the
GPU, idle GPU time between their kernels, and the wait after them?

Released architecture (random weights), 518x378 synthetic frames on the GPU, the session's
defaults (CUDA graphs, fused blocks, split attention). At each frame count in `--at`, times
`--frames` frames the way `stream_gpu.py` does (device idle at the start, sync at the end) and
splits each one into:
  host before launch  step() entry -> the first graph launch
  begin_step          the global cache's begin_step and the camera cache's (host)
    of which plan     FlashInfer's plan (inside the global cache's begin_step)
  launch calls        first graph launch -> return of the last launch call (host)
  GPU graphs          CUDA events before the first launch and after the last: the device's time
  after               last launch return -> outputs ready (clones, result objects, the final sync)
Then profiles a few steps to get the kernels' own time: the rest of the graphs' GPU time is idle
time between kernels (including any wait for the host between the two graphs).

    python bench/frame_timeline.py --at 100 1000
    python bench/frame_timeline.py --preset tiny --height 84 --width 112 --at 12 --frames 3   # smoke (CUDA)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not

from bench.stream_gpu import synthetic_frames  # noqa: E402
from lingbot_ros.mapping import factory  # noqa: E402
from lingbot_ros.mapping.settings import MapperSettings  # noqa: E402


class Probe:
    """Wraps the few host calls of a frame step with timers (bench-only instance patches)."""

    def __init__(self):
        self.marks: dict[str, float] = {}
        self.ms: dict[str, float] = {}
        self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        replay = torch.cuda.CUDAGraph.replay

        def timed_replay(graph):
            if "launch" not in self.marks:   # the step's first graph
                self.marks["launch"] = time.perf_counter()
                self.events[0].record()
            replay(graph)
            self.events[1].record()
            self.marks["launched"] = time.perf_counter()
        torch.cuda.CUDAGraph.replay = timed_replay

    def wrap(self, obj, name: str, part: str) -> None:
        """Add the time of every `obj.name(...)` call to `self.ms[part]`."""
        inner = getattr(obj, name)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.ms[part] = self.ms.get(part, 0.0) + (time.perf_counter() - t) * 1e3
        setattr(obj, name, timed)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="lingbot-map")
    ap.add_argument("--height", type=int, default=378)
    ap.add_argument("--width", type=int, default=518)
    ap.add_argument("--at", type=int, nargs="+", default=[100, 1000], help="frame counts at which to measure")
    ap.add_argument("--frames", type=int, default=30, help="frames timed at each count")
    ap.add_argument("--profiled", type=int, default=3, help="replays profiled at each count")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("this benchmark times CUDA graphs and kernels: it needs a CUDA device")

    torch.manual_seed(0)
    settings = MapperSettings(model_config=args.preset, checkpoint="", device="cuda")
    model, _ = factory.load_model(settings, "cuda")
    session = factory.new_session(model, settings)
    images = synthetic_frames(64, args.height, args.width, "cuda")
    probe = Probe()
    wrapped = False
    rows = []
    n = 0
    for at in sorted(args.at):
        while n < at:
            session.step(images[n % 64])
            n += 1
        if not wrapped:
            probe.wrap(session.global_cache, "begin_step", "begin")
            probe.wrap(session.camera_cache, "begin_step", "begin")
            probe.wrap(session.global_cache.attention, "plan", "plan")
            wrapped = True
        parts: dict[str, list[float]] = {k: [] for k in ("wall", "host", "begin", "plan", "launch", "gpu", "after")}
        for _ in range(args.frames):
            img = images[n % 64]
            torch.cuda.synchronize()
            probe.ms, probe.marks = {}, {}
            t0 = time.perf_counter()
            results = session.step(img)
            results[0].pose_enc, results[0].depth  # noqa: B018
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            n += 1
            m = probe.marks
            parts["wall"].append((t1 - t0) * 1e3)
            parts["host"].append((m["launch"] - t0) * 1e3)
            parts["begin"].append(probe.ms.get("begin", 0.0))
            parts["plan"].append(probe.ms.get("plan", 0.0))
            parts["launch"].append((m["launched"] - m["launch"]) * 1e3)
            parts["gpu"].append(probe.events[0].elapsed_time(probe.events[1]))
            parts["after"].append((t1 - m["launched"]) * 1e3)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.profiled):
                session.step(images[n % 64])
                n += 1
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        kernel_ms = sum(e.device_time for e in kernels) / 1e3 / args.profiled
        med = {k: statistics.median(v) for k, v in parts.items()}
        rows.append((at, med, kernel_ms, len(kernels) // args.profiled))
        print(f"at {at}: " + ", ".join(f"{k} {v:.2f}" for k, v in med.items())
              + f", kernels {kernel_ms:.2f} ms in {len(kernels) // args.profiled}", file=sys.stderr, flush=True)

    print("| frame | wall | host before launch | begin_step | of which plan | launch calls | GPU graphs | "
          "kernels (count) | idle between kernels | after launch |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for at, med, kernel_ms, count in rows:
        print(f"| {at} | {med['wall']:.2f} | {med['host']:.2f} | {med['begin']:.2f} | {med['plan']:.2f} | {med['launch']:.2f} | "
              f"{med['gpu']:.2f} | {kernel_ms:.2f} ({count}) | {med['gpu'] - kernel_ms:.2f} | {med['after']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
