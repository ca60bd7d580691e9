"""What a window switch costs, part by part (issue 26 target 4): the session's step times around
a switch as the windowed policy makes one, each part with a device sync.

A session of the released architecture (random weights, 518x378 synthetic frames, the live
defaults: 8 scale frames, 8 anchors + a 64-frame window, overlap 16) streams --steady frames to
fill its window, then, --switches times: the full-window step just before the switch, the reset,
the overlap's frames again (phase 1 on the first 8 at once, then the rest one at a time), and the
next frame. Per part the median over the switches, and phase 1's peak allocated memory above the
steady state. These are the pieces a switch spread over the frames before it must fit into
(bench/README.md, "Target 4, worked out").

The same switch prepared ahead (window_switch_ahead, mapping/windows/ahead.py): before each
switch a spare session (its cache the overlap's size) runs the overlap while the live session is
full (its phase 1 in slices, each later frame: the pieces the frames before the switch carry), then the reset
live session takes the spare's stream over (the copy of the overlap's pages: what the switch
frame carries besides its own step).

    python bench/switch_cost.py
    python bench/switch_cost.py --preset tiny --device cpu --height 28 --width 42 --steady 12 --switches 2 \\
        --scale-frames 2 --sliding-window 3 --overlap 4      # smoke
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not

from bench.stream_gpu import sync, synthetic_frames  # noqa: E402
from lingbot_ros.mapping import factory  # noqa: E402
from lingbot_ros.mapping.settings import MapperSettings  # noqa: E402
from lingbot_ros.mapping.windows.ahead import PHASE1_LAYERS_PER_SLICE, spare_session  # noqa: E402


def timed(device: str, fn) -> tuple[float, object]:
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return (time.perf_counter() - start) * 1e3, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="lingbot-map")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--height", type=int, default=378)
    ap.add_argument("--width", type=int, default=518)
    ap.add_argument("--steady", type=int, default=100, help="frames streamed before the first switch")
    ap.add_argument("--switches", type=int, default=3)
    ap.add_argument("--scale-frames", type=int, default=8, help="num_scale_frames and the anchors")
    ap.add_argument("--sliding-window", type=int, default=64)
    ap.add_argument("--overlap", type=int, default=MapperSettings().overlap_size, help="overlap_size")
    ap.add_argument("--kv-cache-dtype", default="auto")
    args = ap.parse_args(argv)
    if args.overlap < args.scale_frames:
        ap.error("--overlap must be at least --scale-frames (phase 1 runs on the overlap's first frames)")
    settings = MapperSettings(model_config=args.preset, checkpoint="", device=args.device,
                              num_scale_frames=args.scale_frames, scale_frames=args.scale_frames,
                              sliding_window=args.sliding_window, keyframe_interval=1, camera_num_iterations=4,
                              kv_cache_dtype=args.kv_cache_dtype)
    device = str(factory.resolve_device(args.device))
    model, _ = factory.load_model(settings, factory.resolve_device(args.device))
    session = factory.new_session(model, settings)
    spare = spare_session(session, args.overlap)
    spare.scale_phase_layers = PHASE1_LAYERS_PER_SLICE   # as the Mapper's (windows/ahead.py)
    images = synthetic_frames(64, args.height, args.width, device)
    frame = itertools.cycle(images)
    cuda = device.startswith("cuda")
    with torch.inference_mode():
        for _ in range(args.steady):
            session.step(next(frame))
        parts: dict[str, list[float]] = {"full-window step before the switch": [], "reset": [],
                                         f"phase 1 ({args.scale_frames} frames at once)": [],
                                         "a re-run (median of the switch's)": [], "re-runs, all": [],
                                         "the next frame": [], "the whole switch": [],
                                         "ahead: phase 1's batch begun (embedding, plan)": [],
                                         f"ahead: a phase-1 slice ({PHASE1_LAYERS_PER_SLICE} layer pairs, median)": [],
                                         "ahead: phase 1's camera-head slice": [],
                                         "ahead: a depth-head slice (median)": [], "ahead: phase 1 in slices, all": [],
                                         "ahead: a later frame in the spare": [],
                                         "ahead: take-over at the switch": [], "ahead: the next frame": []}
        phase1_extra_gib, ahead_extra_gib = [], []
        for _ in range(args.switches):
            for _ in range(args.steady // 2):
                session.step(next(frame))
            # Ahead: the spare runs the overlap while the live session is full (the frames it
            # stands for are drawn again below for the switch run at once).
            ahead = [next(frame) for _ in range(args.overlap)]
            if cuda:
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            spare.reset()
            for image in ahead[:args.scale_frames - 1]:
                spare.step(image)
            begun, _ = timed(device, lambda: spare.step(ahead[args.scale_frames - 1]))
            slices = []
            while spare.scale_phase_running:
                slices.append(timed(device, spare.advance_scale_phase)[0])
            parts["ahead: phase 1's batch begun (embedding, plan)"].append(begun)
            # The layers' slices, then the camera head's, then the depth head's (FrameCompute.advance).
            layer_slices = -(-len(model.aggregator.frame_blocks) // PHASE1_LAYERS_PER_SLICE)
            parts[f"ahead: a phase-1 slice ({PHASE1_LAYERS_PER_SLICE} layer pairs, median)"].append(
                statistics.median(slices[:layer_slices]))
            parts["ahead: phase 1's camera-head slice"].append(slices[layer_slices])
            parts["ahead: a depth-head slice (median)"].append(statistics.median(slices[layer_slices + 1:]))
            parts["ahead: phase 1 in slices, all"].append(begun + sum(slices))
            later = [timed(device, lambda image=image: spare.step(image))[0] for image in ahead[args.scale_frames:]]
            parts["ahead: a later frame in the spare"].append(statistics.median(later) if later else 0.0)
            if cuda:
                ahead_extra_gib.append((torch.cuda.max_memory_allocated() - before) / 2**30)
            parts["full-window step before the switch"].append(timed(device, lambda: session.step(next(frame)))[0])
            reset_ms, _ = timed(device, session.reset)
            overlap = [next(frame) for _ in range(args.overlap)]
            for image in overlap[:args.scale_frames - 1]:      # buffered: no device work
                session.step(image)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            phase1_ms, _ = timed(device, lambda: session.step(overlap[args.scale_frames - 1]))
            if cuda:
                phase1_extra_gib.append((torch.cuda.max_memory_allocated() - before) / 2**30)
            reruns = [timed(device, lambda image=image: session.step(image))[0] for image in overlap[args.scale_frames:]]
            next_ms, _ = timed(device, lambda: session.step(next(frame)))
            parts["reset"].append(reset_ms)
            parts[f"phase 1 ({args.scale_frames} frames at once)"].append(phase1_ms)
            parts["a re-run (median of the switch's)"].append(statistics.median(reruns) if reruns else 0.0)
            parts["re-runs, all"].append(sum(reruns))
            parts["the next frame"].append(next_ms)
            parts["the whole switch"].append(reset_ms + phase1_ms + sum(reruns) + next_ms)
            session.reset()
            parts["ahead: take-over at the switch"].append(timed(device, lambda: session.take_over(spare))[0])
            parts["ahead: the next frame"].append(timed(device, lambda: session.step(next(frame)))[0])
    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"| part ({name}, {args.width}x{args.height}, overlap {args.overlap}, {args.switches} switches) | "
          "median ms |\n| --- | --- |")
    for part, values in parts.items():
        print(f"| {part} | {statistics.median(values):.1f} |")
    if phase1_extra_gib:
        print(f"| phase 1's peak above the steady state | {max(phase1_extra_gib):.2f} GiB |")
        print(f"| ahead: the spare's peak above the full live session (its cache, phase 1) | "
              f"{max(ahead_extra_gib):.2f} GiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
