"""The Mapper's own per-frame work, measured on its own (issue 20: under 1 ms on the H200).

One model and session (released architecture, random weights, live default settings), several
Mappers over it in turn, each streaming the same synthetic camera images for ``--frames`` frames
after ``--skip`` untimed ones. Per frame: ``Mapper.process`` wall time, the model step as the
Mapper times it (``model_ms``: step until the device is done) and their difference, the Mapper's
overhead (preprocessing, window warp, pose to the host, keyframe point selection, map hand-off,
snapshot). Frames that start a window are left out. Variants switch one part off, to see what
it costs:

    deployed        as the node runs, each part's host time timed (the wrappers cost a little)
    bare            as the node runs, nothing timed but the frame
    no_map_insert   keyframe points selected and copied to the host, not inserted (no builder work)
    no_points       no keyframe point selection at all
    switch_0.2ms    deployed, with Python's thread switch interval at 0.2 ms instead of 5 ms
    map_database    bare, writing the map database (issue 19) into ``--out``, a continuation
                    every ``--continuation-s`` (its frames are in the max); the file's bytes per
                    second of stream are reported
    previous        the code before issue 20's changes, for a side-by-side: poses warped on the
                    device, points selected on the device, map inserts handed over at once
                    (reproduced here, ``previous_*`` below)

For ``deployed`` the host time of each part is timed too, a cProfile of the frames is written
(top functions by cumulative time), and a torch profiler table of a few frames.

    python bench/mapper_overhead_gpu.py --out out/mapper_overhead
    python bench/mapper_overhead_gpu.py --preset tiny --device cpu --image-size 112x84 --frames 20 --skip 5 \\
        --num-scale-frames 3 --scale-frames 3 --sliding-window 4 --image-width 112 --profile-frames 0   # smoke
"""
from __future__ import annotations

import argparse
import cProfile
import collections
import dataclasses
import functools
import io
import json
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, installed or not

from bench.long_run_gpu import synthetic_images  # noqa: E402
from lingbot_ros.mapping import factory, mapper as mapper_code, records  # noqa: E402
from lingbot_ros.mapping.windows import live as live_windows  # noqa: E402
from lingbot_ros.mapping.store.points import image_to_rgb_uint8  # noqa: E402
from lingbot_ros.mapping.windows.similarity import warp_pose_enc  # noqa: E402
from lingbot_ros.model.geometry import depth_to_world_points, pose_to_extrinsic  # noqa: E402
from lingbot_ros.mapping.mapper import Mapper  # noqa: E402
from lingbot_ros.mapping.records import InputFrame  # noqa: E402
from lingbot_ros.mapping.settings import MapperSettings, parse_image_size  # noqa: E402

VARIANTS = ("deployed", "bare", "previous", "no_map_insert", "no_points", "switch_0.2ms", "map_database")


def previous_warp_frame(result, sim):
    """similarity.warp_frame before issue 20: every pose op on the frame's device."""
    pose_enc = warp_pose_enc(result.pose_enc, sim)
    extrinsic = pose_to_extrinsic(pose_enc)
    depth = result.depth * sim.scale
    world_points = depth_to_world_points(depth[None], extrinsic[None], result.intrinsic[None])[0]
    return dataclasses.replace(result, pose_enc=pose_enc, pose_enc_list=warp_pose_enc(result.pose_enc_list, sim),
                               extrinsic=extrinsic, depth=depth, world_points=world_points)


def previous_internal_points(output, min_confidence, stride):
    """MapperOutput.internal_points before issue 20: the selection on the device (boolean indexing)."""
    result = output.result
    colours = image_to_rgb_uint8(result.image)[::stride, ::stride].reshape(-1, 3)
    points = result.world_points[::stride, ::stride].reshape(-1, 3)
    keep = torch.isfinite(points).all(dim=-1) & (result.depth_conf[::stride, ::stride].reshape(-1) >= min_confidence)
    xyz, rgb = points[keep].cpu().numpy().astype(np.float32), colours[keep].cpu().numpy().astype(np.uint8)
    return output.placement.points(xyz), rgb


class Sections:
    """Host time per named part, per frame (wrapped callables add ~1 us each)."""

    def __init__(self):
        self.frame = collections.Counter()
        self.frames: list[dict] = []

    def wrap(self, name, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.frame[name] += (time.perf_counter() - t0) * 1e3
        return timed

    def end_frame(self):
        self.frames.append(dict(self.frame))
        self.frame.clear()


def instrument(mapper: Mapper, sections: Sections) -> None:
    """Time the parts through what the Mapper and its modules expose (restored by the caller)."""
    mapper.preprocessor = sections.wrap("preprocess", mapper.preprocessor)
    windows = mapper.stream.windows
    if windows is not None:
        windows.place = sections.wrap("window place + warp", windows.place)
    mapper_code.output_of = sections.wrap("output (pose to host, robot frames)", mapper_code.output_of)
    mapper.store.builder.insert = sections.wrap("map hand-off", mapper.store.builder.insert)
    mapper_code.snapshot = sections.wrap("snapshot", mapper_code.snapshot)
    mapper.session.step = sections.wrap("session.step (host)", mapper.session.step)


def stream(mapper: Mapper, images, count: int, skip: int, sections: Sections | None = None,
           profiler=None) -> dict:
    process_ms, model_ms, windows = [], [], []
    first = mapper.next_index            # a second pass continues the stream's stamps
    for i in range(skip + count):
        n = first + i
        frame = InputFrame(rgb=images[n % len(images)], stamp_ns=1_000_000_000 + n * 33_333_333)
        timing = i >= skip
        if timing and profiler is not None:
            profiler.enable()
        t0 = time.perf_counter()
        mapper.process(frame)
        elapsed = (time.perf_counter() - t0) * 1e3
        if timing and profiler is not None:
            profiler.disable()
        if sections is not None:
            if timing:
                sections.end_frame()
            else:
                sections.frame.clear()
        if timing:
            process_ms.append(elapsed)
            model_ms.append(mapper.snapshot.model_ms)
            windows.append(mapper.snapshot.window)
    process, model = np.array(process_ms), np.array(model_ms)
    window = np.array(windows)
    steady = np.ones(len(window), bool)
    steady[1:] = window[1:] == window[:-1]
    overhead = (process - model)[steady]
    return {"frames": int(steady.sum()), "switch_frames": int((~steady).sum()),
            "process_ms_median": float(np.median(process[steady])),
            "model_ms_median": float(np.median(model[steady])),
            "overhead_ms_median": float(np.median(overhead)), "overhead_ms_p90": float(np.percentile(overhead, 90)),
            "overhead_ms_p99": float(np.percentile(overhead, 99)), "overhead_ms_max": float(overhead.max())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="lingbot-map")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--image-size", default="518x378", help="camera image WxH")
    parser.add_argument("--frames", type=int, default=400, help="timed frames per variant")
    parser.add_argument("--skip", type=int, default=100, help="untimed frames first (window filling)")
    parser.add_argument("--profile-frames", type=int, default=20, help="torch profiler frames (0: none)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--out", type=Path, default=Path("out/mapper_overhead"))
    parser.add_argument("--continuation-s", type=float, default=5.0,
                        help="map_database_continuation_s of the map_database variant")
    defaults = MapperSettings()
    for name in ("num_scale_frames", "scale_frames", "sliding_window", "image_width"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    args = parser.parse_args(argv)
    width, height = parse_image_size(args.image_size)
    settings = dataclasses.replace(
        defaults, model_config=args.preset, device=args.device, image_width=args.image_width,
        warmup_image_size=args.image_size, num_scale_frames=args.num_scale_frames,
        scale_frames=args.scale_frames, sliding_window=args.sliding_window)
    start = time.perf_counter()
    bundle = factory.build(settings)
    print(f"built in {time.perf_counter() - start:.1f} s ({bundle.description})", flush=True)
    images = synthetic_images(300, width, height)
    args.out.mkdir(parents=True, exist_ok=True)
    step = bundle.session.step
    first = Mapper(settings, bundle)
    print(f"warm-up {first.warm_up():.1f} s", flush=True)
    first.close()
    results, table = {}, {}
    internal_points, warp_frames = records.MapperOutput.internal_points, live_windows.warp_frames
    output_of, snapshot = mapper_code.output_of, mapper_code.snapshot
    for name in args.variants:
        bundle.session.reset()
        bundle.session.step = step
        database = args.out / "map.db"
        if name == "map_database":
            for stale in args.out.glob("map.db*"):
                stale.unlink()
        mapper = Mapper(dataclasses.replace(settings, map_database=str(database),
                                            map_database_continuation_s=args.continuation_s)
                        if name == "map_database" else settings, bundle)
        sections = profiler = None
        if name == "no_map_insert":
            mapper.store.builder.insert = lambda xyz, rgb: None
        if name == "no_points":
            records.MapperOutput.internal_points = lambda self, c, s: (np.zeros((0, 3), np.float32),
                                                                       np.zeros((0, 3), np.uint8))
        if name == "previous":
            live_windows.warp_frames = lambda results, sim: [previous_warp_frame(r, sim) for r in results]
            records.MapperOutput.internal_points = previous_internal_points
            builder = mapper.store.builder
            stage = builder.insert
            builder.insert = lambda xyz, rgb: (stage(xyz, rgb), builder.release())
        if name == "switch_0.2ms":
            sys.setswitchinterval(0.0002)
        if name == "deployed":
            sections = Sections()
            instrument(mapper, sections)
            records.MapperOutput.internal_points = sections.wrap("keyframe points (select, to host)",
                                                                 internal_points)
            profiler = cProfile.Profile()
        try:
            started = time.perf_counter()
            results[name] = stream(mapper, images, args.frames, args.skip, sections)
            if name == "map_database":
                mapper.close()   # the clean end's events written, the file complete
                seconds = time.perf_counter() - started
                size = sum(f.stat().st_size for f in args.out.glob("map.db*"))
                results[name].update(database_bytes=size, database_mb_per_s=size / seconds / 1e6,
                                     database_mb_per_1000_frames=size / (args.frames + args.skip) * 1e3 / 1e6)
            if profiler is not None:     # a second pass under cProfile (it slows the frames)
                stream(mapper, images, min(args.frames, 200), 0, None, profiler)
        finally:
            records.MapperOutput.internal_points, live_windows.warp_frames = internal_points, warp_frames
            mapper_code.output_of, mapper_code.snapshot = output_of, snapshot
            sys.setswitchinterval(0.005)
            mapper.close()
        if sections is not None:
            parts = collections.defaultdict(list)
            for frame in sections.frames:
                for key in set().union(*sections.frames):
                    parts[key].append(frame.get(key, 0.0))
            results[name]["host_ms_median_by_part"] = {k: float(np.median(v)) for k, v in parts.items()}
            results[name]["host_ms_mean_by_part"] = {k: float(np.mean(v)) for k, v in parts.items()}
        if profiler is not None:
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(45)
            (args.out / "cprofile_deployed.txt").write_text(text.getvalue())
        print(name, json.dumps(results[name]), flush=True)
        table[name] = results[name]
    if args.profile_frames and args.device.startswith("cuda"):
        bundle.session.reset()
        bundle.session.step = step
        mapper = Mapper(settings, bundle)
        stream(mapper, images, 1, args.skip)
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            stream(mapper, images, args.profile_frames, 0)
        mapper.close()
        (args.out / "torch_profile_deployed.txt").write_text(
            prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
    (args.out / "mapper_overhead.json").write_text(json.dumps(results, indent=1))
    print("| variant | frames | process ms | model ms | overhead ms median / p90 / p99 / max |")
    print("| --- | --- | --- | --- | --- |")
    for name, r in table.items():
        print(f"| {name} | {r['frames']} | {r['process_ms_median']:.2f} | {r['model_ms_median']:.2f} | "
              f"{r['overhead_ms_median']:.2f} / {r['overhead_ms_p90']:.2f} / {r['overhead_ms_p99']:.2f} / "
              f"{r['overhead_ms_max']:.2f} |")
    if "deployed" in results:
        for key, value in sorted(results["deployed"]["host_ms_median_by_part"].items(), key=lambda kv: -kv[1]):
            print(f"  deployed, host ms median {value:.3f} mean {results['deployed']['host_ms_mean_by_part'][key]:.3f}: {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
