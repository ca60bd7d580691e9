"""lingbot-ros-offline: run a recorded sequence through LingBot-Map without ROS.

Source frames -> Preprocessor -> StreamingSession.step -> FrameResults, written as a TUM
trajectory, per-frame depth maps, a per-frame table and one fused, voxel-downsampled PLY map of
the keyframes' confident points.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import csv
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import torch

from lingbot_ros.io.sources import SourceError, open_source
from lingbot_ros.mapping import (Trajectory, VoxelMap, VoxelRangeError, image_to_rgb_uint8,
                                 select_points, write_ply, write_tum)
from lingbot_ros.model import (CheckpointError, ConfigError, ModelConfig, build_model,
                               load_checkpoint)
from lingbot_ros.stream import (FrameError, ImageError, Preprocessor, SettingsError,
                                StreamingSession, StreamSettings)

DEPTH_PNG_MAX_M = 65.535  # uint16 millimetres


class OfflineError(Exception):
    """A problem with the command line or the input that the user has to fix."""


def build_parser() -> argparse.ArgumentParser:
    stream_defaults = StreamSettings()
    parser = argparse.ArgumentParser(
        prog="lingbot-ros-offline",
        description=__doc__.split("\n\n")[0],
        epilog="Outputs in --output: trajectory.tum (TUM 'timestamp tx ty tz qx qy qz qw', "
               "camera-to-world in the model's world frame with OpenCV camera axes, stamps "
               "from the source); frames.csv (per frame: index, stamp, keyframe flag, "
               "intrinsics fx fy cx cy at the model input size, depth file); "
               "depth/NNNNNN.png or .npy (depth at the model input size, see --depth-format); "
               "map.ply (binary PLY, float xyz + uchar rgb, keyframes' points with confidence "
               ">= --min-confidence, one per voxel). Units are the model's: metres up to an "
               "unknown scale.")
    parser.add_argument("--checkpoint",
                        help="model checkpoint (.pt: a state dict or {'model': state dict})")
    parser.add_argument("--random-weights", action="store_true",
                        help="allow running without --checkpoint (random weights: the output "
                             "is NOT a map; for plumbing tests only)")
    parser.add_argument("--config", default="lingbot-map",
                        help="model preset name, or a JSON file with an 'arch' object or the "
                             "arch fields themselves (spec 16.2); default %(default)s")
    parser.add_argument("--input", required=True,
                        help="image folder, video file, rosbag2 (directory or .mcap/.db3), "
                             "camera index or 'synthetic[:WxH[:N]]'")
    parser.add_argument("--output", required=True, type=Path, help="output directory (created)")
    parser.add_argument("--topic", help="image topic of a bag (default: its first image topic)")
    parser.add_argument("--rate-hz", type=float,
                        help="stamp rate for folders and synthetic input (default 10 Hz); "
                             "overrides a video's own frame rate")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="torch device (default %(default)s)")
    parser.add_argument("--max-frames", type=int, help="stop after this many frames")
    parser.add_argument("--image-width", type=int, default=518,
                        help="model input width in pixels, a multiple of 14 (default "
                             "%(default)s as in spec 3; smaller is faster)")
    parser.add_argument("--exact-resize", action="store_true",
                        help="resize with PIL bicubic on the CPU exactly as the upstream demo "
                             "(default: antialiased bicubic on --device, faster)")
    parser.add_argument("--num-scale-frames", type=int, default=stream_defaults.num_scale_frames,
                        help="frames buffered and run together at the start, phase 1 "
                             "(default %(default)s)")
    parser.add_argument("--keyframe-interval", type=int,
                        default=stream_defaults.keyframe_interval,
                        help="every K-th streamed frame is a keyframe, stored in the cache and "
                             "added to the map (default %(default)s)")
    parser.add_argument("--camera-iterations", type=int,
                        default=stream_defaults.camera_num_iterations,
                        help="camera head refinement iterations (default %(default)s)")
    parser.add_argument("--window", type=int, default=stream_defaults.sliding_window,
                        help="sliding window of keyframes kept in the attention cache "
                             "(default %(default)s)")
    parser.add_argument("--scale-frames", type=int, default=stream_defaults.scale_frames,
                        help="anchor frames kept in the attention cache for good "
                             "(default %(default)s)")
    parser.add_argument("--voxel-size", type=float, default=0.01,
                        help="map voxel size in model units, metres up to scale "
                             "(default %(default)s)")
    parser.add_argument("--max-map-points", type=int, default=5_000_000,
                        help="map size bound; the least recently updated voxels are dropped "
                             "(default %(default)s)")
    parser.add_argument("--min-confidence", type=float, default=1.5,
                        help="keep map points whose depth confidence (>= 1) is at least this "
                             "(default %(default)s, as the upstream viewer)")
    parser.add_argument("--point-stride", type=int, default=1,
                        help="use every N-th pixel in each image axis for the map "
                             "(default %(default)s)")
    parser.add_argument("--depth-format", choices=("png16", "npy"), default="png16",
                        help="png16: 16-bit PNG, depth in millimetres of the model's unit, "
                             f"clipped to {DEPTH_PNG_MAX_M} (0 = below 0.5 mm); npy: float32 "
                             "[H, W] in model units (default %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.checkpoint is None and not args.random_weights:
        parser.error("--checkpoint is required (pass --random-weights to run untrained weights "
                     "for a plumbing test; the output is then not a map)")
    try:
        summary = run(args)
    except (OfflineError, SourceError, ConfigError, CheckpointError, SettingsError, ImageError,
            FrameError, VoxelRangeError) as err:
        print(f"lingbot-ros-offline: error: {err}", file=sys.stderr)
        return 1
    print(summary)
    return 0


def load_model(args: argparse.Namespace):
    model = build_model(ModelConfig.from_name(args.config), device=args.device,
                        random_init=args.checkpoint is None)
    if args.checkpoint is not None:
        load_checkpoint(model, args.checkpoint)
    else:
        print("\n" + "!" * 78 + "\n!! WARNING: --random-weights: the model is UNTRAINED. Poses, "
              "depth and\n!! map.ply are noise, NOT a reconstruction. Use --checkpoint for a "
              "map.\n" + "!" * 78 + "\n", file=sys.stderr)
    return model


def run(args: argparse.Namespace) -> str:
    """Process the whole input; returns the summary text."""
    for flag, value, low in (("--max-frames", args.max_frames, 1),
                             ("--max-map-points", args.max_map_points, 1),
                             ("--point-stride", args.point_stride, 1)):
        if value is not None and value < low:
            raise OfflineError(f"{flag} must be >= {low}, got {value}")
    if not args.voxel_size > 0:
        raise OfflineError(f"--voxel-size must be > 0, got {args.voxel_size}")
    source = open_source(args.input, rate_hz=args.rate_hz, topic=args.topic)
    total = source.num_frames
    if args.max_frames is not None:
        total = args.max_frames if total is None else min(total, args.max_frames)
    if total is None:
        raise OfflineError(f"{source.description} has no end; pass --max-frames")

    model = load_model(args)
    settings = StreamSettings(
        num_scale_frames=args.num_scale_frames, keyframe_interval=args.keyframe_interval,
        camera_num_iterations=args.camera_iterations, sliding_window=args.window,
        scale_frames=args.scale_frames)
    model.store_matmul_weights(settings.compute_dtype(model.device))
    session = StreamingSession(model, settings)
    preprocess = Preprocessor(target_width=args.image_width, device=model.device,
                              exact=args.exact_resize)

    writer = OutputWriter(args.output, args.depth_format, VoxelMap(args.voxel_size,
                                                                   args.max_map_points),
                          args.min_confidence, args.point_stride)
    progress = Progress(total)
    stamps_s: list[float] = []
    with contextlib.closing(iter(source)) as frames:
        for frame in frames:
            if len(stamps_s) == total:
                break
            stamps_s.append(frame.stamp_s)
            with torch.inference_mode():
                results = session.step(preprocess(frame.rgb))
            for result in results:
                writer.add(result, stamps_s[result.index])
            progress.update(len(stamps_s), have_results=writer.num_frames > 0)
    # A sequence shorter than --num-scale-frames ends while phase 1 is still buffering (spec 13:
    # phase 1 takes min(num_scale_frames, S) frames).
    with torch.inference_mode():
        for result in session.close_scale_phase():
            writer.add(result, stamps_s[result.index])
    progress.finish()
    if writer.num_frames != len(stamps_s):
        raise OfflineError(f"the input ended after {len(stamps_s)} frames but only "
                           f"{writer.num_frames} results came back")
    outputs = writer.close()
    fps = len(stamps_s) / max(progress.elapsed_s, 1e-9)
    steady = progress.steady_fps(len(stamps_s))
    steady_text = f" ({steady:.2f} FPS after the first results)" if steady is not None else ""
    return (f"frames: {writer.num_frames} ({writer.num_keyframes} keyframes) from "
            f"{source.description}\n"
            f"time: {progress.elapsed_s:.1f} s, {fps:.2f} FPS on {args.device}{steady_text}\n"
            f"map: {outputs['map_points']} points (voxel {args.voxel_size:g})\n"
            f"outputs: {outputs['trajectory']}, {outputs['frames']}, {outputs['depth']}/, "
            f"{outputs['map']}")


class OutputWriter:
    """Collects FrameResults into the output directory; the map and trajectory at close()."""

    def __init__(self, output_dir: Path, depth_format: str, voxel_map: VoxelMap,
                 min_confidence: float, point_stride: int):
        self.output_dir = output_dir
        self.depth_dir = output_dir / "depth"
        self.depth_dir.mkdir(parents=True, exist_ok=True)
        self.depth_format = depth_format
        self.voxel_map = voxel_map
        self.min_confidence, self.point_stride = min_confidence, point_stride
        self.trajectory = Trajectory()
        self.rows: list[tuple] = []
        self.num_frames = self.num_keyframes = 0

    def add(self, result, stamp_s: float) -> None:
        self.num_frames += 1
        self.trajectory.append(stamp_s, result.extrinsic.double().cpu().numpy())
        depth_file = self._write_depth(result.index, result.depth.float().cpu().numpy())
        intrinsic = result.intrinsic.cpu().numpy()
        self.rows.append((result.index, f"{stamp_s:.9f}", int(result.is_keyframe),
                          intrinsic[0, 0], intrinsic[1, 1], intrinsic[0, 2], intrinsic[1, 2],
                          depth_file))
        if result.is_keyframe:
            self.num_keyframes += 1
            xyz, rgb = select_points(result.world_points, image_to_rgb_uint8(result.image),
                                     result.depth_conf, self.min_confidence, self.point_stride)
            self.voxel_map.insert(xyz, rgb)

    def _write_depth(self, index: int, depth: np.ndarray) -> str:
        if self.depth_format == "npy":
            path = self.depth_dir / f"{index:06d}.npy"
            np.save(path, depth.astype(np.float32))
        else:
            path = self.depth_dir / f"{index:06d}.png"
            millimetres = np.round(np.clip(depth, 0.0, DEPTH_PNG_MAX_M) * 1000.0)
            if not cv2.imwrite(str(path), millimetres.astype(np.uint16)):
                raise OfflineError(f"could not write {path}")
        return str(path.relative_to(self.output_dir))

    def close(self) -> dict:
        paths = {"trajectory": self.output_dir / "trajectory.tum",
                 "frames": self.output_dir / "frames.csv",
                 "map": self.output_dir / "map.ply", "depth": self.depth_dir}
        write_tum(paths["trajectory"], self.trajectory)
        with open(paths["frames"], "w", newline="") as f:
            table = csv.writer(f)
            table.writerow(("index", "stamp_s", "is_keyframe", "fx", "fy", "cx", "cy", "depth"))
            table.writerows(self.rows)
        xyz, rgb = self.voxel_map.points()
        write_ply(paths["map"], xyz, rgb)
        return {**paths, "map_points": len(xyz)}


class Progress:
    """``frame i/N, FPS`` on stderr: one rewritten line on a terminal, every 10th frame else.

    The line shows the rate over the last 10 frames: the first frames include one-off work
    (the scale-frame batch, kernel JIT builds on a cold GPU) that would hide the steady rate.
    """

    WINDOW = 10

    def __init__(self, total: int):
        self.total = total
        self.start = time.perf_counter()
        self.elapsed_s = 0.0
        self.tty = sys.stderr.isatty()
        self._recent: collections.deque = collections.deque(maxlen=self.WINDOW + 1)
        self.steady_from: tuple[int, float] | None = None   # (frames done, time) at the first result

    def update(self, done: int, have_results: bool) -> None:
        now = time.perf_counter()
        self.elapsed_s = now - self.start
        self._recent.append((done, now))
        if have_results and self.steady_from is None:
            self.steady_from = (done, now)
        if self.tty or done % 10 == 0 or done == self.total:
            (d0, t0), (d1, t1) = self._recent[0], self._recent[-1]
            rate = (d1 - d0) / (t1 - t0) if t1 > t0 else done / max(self.elapsed_s, 1e-9)
            line = f"frame {done}/{self.total}  {rate:.2f} FPS"
            print(f"\r{line}" if self.tty else line, end="" if self.tty else "\n",
                  file=sys.stderr, flush=True)

    def finish(self) -> None:
        """Stop the clock (the summary's FPS counts all work up to here) and end the line."""
        self.elapsed_s = time.perf_counter() - self.start
        if self.tty:
            print(file=sys.stderr)

    def steady_fps(self, done: int) -> float | None:
        """Frames per second after the first results came out (None if too few frames)."""
        if self.steady_from is None or done <= self.steady_from[0]:
            return None
        d0, t0 = self.steady_from
        return (done - d0) / max(self.start + self.elapsed_s - t0, 1e-9)


if __name__ == "__main__":
    sys.exit(main())
