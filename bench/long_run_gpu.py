"""Long-run benchmark of the Mapper (issue: for as long as the robot drives): frame time, memory and
window switches over a long stream with the long-run policy (windowed by default).

The whole mapping pipeline per frame, as the node's worker runs it: preprocessing of a uint8
camera image, the model step (CUDA graphs), window alignment and warp, pose placement, map
insertion of keyframe points (map_points_stride, on the CPU). Random weights of the released
architecture (speed and memory only), a synthetic smooth image sequence cycled.

    python bench/long_run_gpu.py                                   # 20,000 frames, live defaults
    python bench/long_run_gpu.py --frames 3000 --window-size 64 --overlap-size 16
    python bench/long_run_gpu.py --frames 3000 --window-switch-ahead   # the overlap run ahead of each switch
    python bench/long_run_gpu.py --preset tiny --device cpu --image-size 112x84 --frames 60 \\
        --window-size 10 --overlap-size 4 --num-scale-frames 3 --scale-frames 3 --sliding-window 4  # smoke

Frame time = ``Mapper.process`` wall time (it waits for the device before placing the outputs).
Writes per-frame times (.npy), a summary (.json) and a plot of the frame times with the window
switches marked (frame_times.png, bench/plots.py) to --out, and prints the summary table. A
"switch" frame is one that started a window: its time includes the re-run of the overlap (with
--window-switch-ahead, only the copy of the overlap's pages). The "overlap" frames are the ov
frames before each switch: with --window-switch-ahead, from the one that completes the overlap's
phase-1 batch on, each carries a share of the spare session's work. ``before_switch_ms``: the
median of each of those frames and of the switch frame, over the switches. --switch-parts times
the parts of each switch frame (``switch_parts_ms``, SwitchParts).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not

from lingbot_ros.mapping import factory  # noqa: E402
from lingbot_ros.mapping.mapper import Mapper  # noqa: E402
from lingbot_ros.mapping.records import InputFrame  # noqa: E402
from lingbot_ros.mapping.settings import MapperSettings, parse_image_size  # noqa: E402


def synthetic_images(count: int, width: int, height: int) -> list[np.ndarray]:
    """A smooth moving colour pattern (uint8 RGB camera images), never all zeros."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32) / max(width, height)
    frames = []
    for i in range(count):
        t = i / 30.0
        rgb = np.stack([np.sin(2 * math.pi * (6 * x + 0.5 * t)), np.sin(2 * math.pi * (5 * y - 0.3 * t)),
                        np.sin(2 * math.pi * (4 * (x + y) + 0.2 * t))], axis=-1)
        frames.append((128 + 100 * rgb).astype(np.uint8))
    return frames


class SwitchParts:
    """--switch-parts: where a switch frame's time goes. Each part's calls during a switch are
    timed with the device synchronised before and after (so each holds its own device work; the
    waits add a little), summed per switch."""

    def __init__(self, cuda: bool):
        from lingbot_ros.mapping import mapper as mapper_code, records
        from lingbot_ros.mapping.windows import ahead, live
        self.cuda, self.active, self.per_switch = cuda, False, []
        self._wrap(Mapper, "_switch_window", "the whole switch (without the frame's own step)", entry=True)
        self._wrap(ahead.SwitchAhead, "start_window", "ahead: work left and take-over")
        self._wrap(live.LiveWindows, "_align", "alignment of the overlap")
        self._wrap(live, "warp_frames", "warps into window 0")
        self._wrap(mapper_code, "output_of", "outputs (host pose, checks)")
        self._wrap(records.MapperOutput, "internal_points", "keyframe points to the host")
        # The switch frame's own step: policy_step's first call once the switch is over.
        self._wrap(mapper_code, "policy_step", "the switch frame's own step", after=True)

    def _wrap(self, owner, name: str, part: str, entry: bool = False, after: bool = False) -> None:
        original = getattr(owner, name)

        def counted() -> bool:
            if after:
                return not self.active and bool(self.per_switch) and part not in self.per_switch[-1]
            return self.active or entry

        def timed(*args, **kwargs):
            if not counted():
                return original(*args, **kwargs)
            if entry:
                self.active = True
                self.per_switch.append({})
            self._sync()
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self._sync()
                parts = self.per_switch[-1]
                parts[part] = parts.get(part, 0.0) + (time.perf_counter() - t0) * 1e3
                if entry:
                    self.active = False
        setattr(owner, name, timed)

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def medians(self) -> dict[str, float]:
        names = {name for parts in self.per_switch for name in parts}
        return {name: float(np.median([parts.get(name, 0.0) for parts in self.per_switch])) for name in sorted(names)}


def before_switch(times: np.ndarray, switch: np.ndarray, overlap: int) -> list[float]:
    """Median over the switches of each of the ``overlap`` frames before one and of the switch frame."""
    starts = [s for s in np.flatnonzero(switch) if s >= overlap]
    if not starts:
        return []
    return [float(np.median([times[s - overlap + k] for s in starts])) for k in range(overlap + 1)]


def segment_median(times: np.ndarray, start: int, end: int, keep: np.ndarray) -> float:
    part = times[start:end][keep[start:end]]
    return float(np.median(part)) if part.size else float("nan")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=20_000)
    parser.add_argument("--preset", default="lingbot-map", help="model preset or JSON (model_config)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--image-size", default="518x378", help="camera image WxH (model input at width 518)")
    parser.add_argument("--out", type=Path, default=Path("out/long_run"))
    parser.add_argument("--progress-every", type=int, default=1000)
    defaults = MapperSettings()
    for name in ("window_size", "overlap_size", "num_scale_frames", "scale_frames", "sliding_window"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    parser.add_argument("--long-run-policy", default=defaults.long_run_policy)
    parser.add_argument("--image-width", type=int, default=defaults.image_width)
    parser.add_argument("--kv-cache-dtype", default=defaults.kv_cache_dtype,
                        help="the global cache's K/V storage (kv_cache_dtype): auto (bf16 on CUDA) or fp8")
    parser.add_argument("--window-switch-ahead", action="store_true",
                        help="window_switch_ahead: run each next window's overlap ahead in a spare session")
    parser.add_argument("--switch-parts", action="store_true",
                        help="time the parts of each switch frame, the device synchronised around each (SwitchParts)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("long_run_gpu.py: needs CUDA (or --device cpu with --preset tiny)", file=sys.stderr)
        return 2
    width, height = parse_image_size(args.image_size)
    settings = dataclasses.replace(
        defaults, model_config=args.preset, device=args.device, image_width=args.image_width,
        warmup_image_size=args.image_size, long_run_policy=args.long_run_policy, window_size=args.window_size,
        overlap_size=args.overlap_size, num_scale_frames=args.num_scale_frames, scale_frames=args.scale_frames,
        sliding_window=args.sliding_window, kv_cache_dtype=args.kv_cache_dtype,
        window_switch_ahead=args.window_switch_ahead)
    start = time.perf_counter()
    bundle = factory.build(settings)
    mapper = Mapper(settings, bundle)
    build_s = time.perf_counter() - start
    warmup_s = mapper.warm_up()
    parts = SwitchParts(args.device.startswith("cuda")) if args.switch_parts else None
    warmup_peak = torch.cuda.max_memory_allocated() if args.device.startswith("cuda") else 0
    print(f"built in {build_s:.1f} s, warm-up {warmup_s:.1f} s ({bundle.description})", flush=True)
    images = synthetic_images(300, width, height)
    cuda = args.device.startswith("cuda")
    times = np.zeros(args.frames)
    model_ms = np.zeros(args.frames)
    frame_peak = np.zeros(args.frames)   # bytes allocated at the most during each frame (CUDA)
    windows = np.zeros(args.frames, np.int64)
    memory_at: dict[int, int] = {}
    captures_at: dict[int, int] = {}
    run_start = time.perf_counter()
    for i in range(args.frames):
        frame = InputFrame(rgb=images[i % len(images)], stamp_ns=1_000_000_000 + i * 33_333_333)
        if cuda:   # the allocator's own counters: no device sync
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        outcome = mapper.process(frame)
        times[i] = (time.perf_counter() - t0) * 1e3
        if cuda:
            frame_peak[i] = torch.cuda.max_memory_allocated()
        windows[i] = mapper.snapshot.window
        model_ms[i] = mapper.snapshot.model_ms
        if outcome.notices:
            print(f"frame {i}: " + "; ".join(n.text for n in outcome.notices), flush=True)
        if i in (1000, 3000) or (i + 1) % args.progress_every == 0 or i == args.frames - 1:
            memory_at[i + 1] = int(torch.cuda.memory_allocated()) if cuda else 0
            captures_at[i + 1] = mapper.session.stats().graph_captures
            recent = times[max(0, i + 1 - args.progress_every):i + 1]
            print(f"frame {i + 1}/{args.frames}: median {np.median(recent):.2f} ms over the last "
                  f"{len(recent)}, window {windows[i]}, allocated {memory_at[i + 1] / 2**30:.2f} GiB, "
                  f"graph captures {captures_at[i + 1]}, {time.perf_counter() - run_start:.0f} s", flush=True)
    switch = np.zeros(args.frames, bool)
    switch[1:] = windows[1:] != windows[:-1]
    steady = ~switch
    n = args.frames
    overlap = np.zeros(n, bool)   # the ov frames before each switch (run ahead with --window-switch-ahead)
    for s in np.flatnonzero(switch):
        overlap[max(0, s - settings.window_rule().overlap):s] = True
    summary = {
        "command": " ".join(sys.argv), "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__, "description": bundle.description, "build_s": build_s, "warmup_s": warmup_s,
        "window_frames": settings.window_rule().window_frames, "overlap": settings.window_rule().overlap,
        "median_100_1000": segment_median(times, 100, 1000, steady),
        "median_1000_3000": segment_median(times, 1000, 3000, steady),
        "median_last_2000": segment_median(times, max(0, n - 2000), n, steady),
        "median_all_steady": float(np.median(times[100:][steady[100:]])) if n > 100 else float("nan"),
        "p99_all_steady": float(np.percentile(times[100:][steady[100:]], 99)) if n > 100 else float("nan"),
        # What a robot sees: every frame, the ones that start a window included.
        "p99_1000_3000_with_switches": float(np.percentile(times[1000:3000], 99)) if n > 1000 else float("nan"),
        "p99_all_with_switches": float(np.percentile(times[100:], 99)) if n > 100 else float("nan"),
        "max_frame_ms": float(times[100:].max()) if n > 100 else float("nan"),
        "frames_over_2x_median": int((times[100:] > 2 * np.median(times[100:][steady[100:]])).sum()) if n > 100 else 0,
        # The Mapper's own work: process time minus the model step (step until the device is done).
        "model_ms_median": float(np.median(model_ms[100:][steady[100:]])) if n > 100 else float("nan"),
        "overhead_ms_median": float(np.median((times - model_ms)[100:][steady[100:]])) if n > 100 else float("nan"),
        "switches": int(switch.sum()),
        "switch_ms_median": float(np.median(times[switch])) if switch.any() else float("nan"),
        "switch_ms_max": float(times[switch].max()) if switch.any() else float("nan"),
        "window_switch_ahead": settings.window_switch_ahead,
        "overlap_ms_median": float(np.median(times[overlap])) if overlap.any() else float("nan"),
        "overlap_ms_max": float(times[overlap].max()) if overlap.any() else float("nan"),
        # Median frame time by place before a switch: the ov frames before it, then the switch frame.
        "before_switch_ms": before_switch(times, switch, settings.window_rule().overlap),
        "switch_parts_ms": parts.medians() if parts is not None else None,
        "memory_allocated_at": memory_at, "graph_captures_at": captures_at,
        # Peak allocated memory: the warm-up's, the frames that start a window (their phase 1 of
        # the overlap) and the other frames'; the run's peak is the largest (what a GPU must hold).
        "peak_warmup_gib": warmup_peak / 2**30,
        "peak_switch_gib": float(frame_peak[switch].max()) / 2**30 if switch.any() else float("nan"),
        "peak_steady_gib": float(frame_peak[100:][steady[100:]].max()) / 2**30 if n > 100 else float("nan"),
        "peak_first_100_gib": float(frame_peak[:100].max()) / 2**30,   # window 0's phase 1 included
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else 0.0,
        "map_points": mapper.snapshot.map_points,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    np.save(args.out / "frame_ms.npy", times)
    np.save(args.out / "window.npy", windows)
    np.save(args.out / "model_ms.npy", model_ms)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    try:
        import plots
    except ImportError as error:   # matplotlib is the bench extra, not everywhere (a GPU host's bundle)
        print(f"no plot ({error}): pip install '.[bench]', then python bench/plots.py long-run {args.out}")
    else:
        print(plots.frame_times(times, windows, args.out / "frame_times.png", plots.long_run_title(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
