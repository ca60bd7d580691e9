"""lingbot-ros-offline: run a recorded sequence through the Mapper without ROS.

The same pipeline as the node (mapping.Mapper: stamps, keyframe and long-run policies, the map
frame, the bounded map), fed from a folder, video, bag, camera or synthetic source. Writes the
trajectory and map the node's ~/save_map writes, plus per-frame depth maps and a frame table.

Every output file is staged and committed at the end, all together (mapping/files/staged_files.py): a
run that fails keeps the previous run's files. Ctrl-C or SIGTERM while the model loads or warms
up writes nothing; while frames are processed, the frame in the model is finished, then what was
processed so far is saved the same way and the summary says how many frames (process/interrupts.py).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import io
import sys
import time
from functools import partial
from pathlib import Path

import cv2
import numpy as np

from lingbot_ros.io.sources import FrameDecodeError, SourceError, open_source
from lingbot_ros.mapping import factory
from lingbot_ros.mapping.files.colmap import ColmapExportError, KeyframeImage, check_target, export_images, write_colmap
from lingbot_ros.mapping.files.staged_files import StagedFiles
from lingbot_ros.mapping.mapper import Mapper
from lingbot_ros.mapping.records import InputFrame, MapperOutput
from lingbot_ros.mapping.rig.grouping import GroupingSettings
from lingbot_ros.mapping.settings import SettingsError
from lingbot_ros.mapping.stamps import seconds_text
from lingbot_ros.mapping.store.points import to_numpy
from lingbot_ros.mapping.store.voxel_map import VoxelRangeError
from lingbot_ros.mapping.warmup_size import AUTO, found_in_source, warmup_size
from lingbot_ros.model import CheckpointError, ConfigError
from lingbot_ros.process import interrupts
from lingbot_ros.tools import progress
from lingbot_ros.tools.command_line import Parser
from lingbot_ros.tools.settings_flags import add_settings_arguments, settings_from_args
from lingbot_ros.viewer import serve

DEPTH_PNG_MAX_M = 65.535  # uint16 millimetres


class OfflineError(Exception):
    """A problem with the command line or the input that the user has to fix."""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="lingbot-ros-offline",
        description=__doc__.split("\n\n")[0],
        epilog="Outputs in --output: trajectory.tum (TUM 'timestamp tx ty tz qx qy qz qw': the robot's "
               "base frame in the map frame, as the node's ~/save_map writes it; stamps from the "
               "source); map.ply (binary PLY, float xyz + uchar rgb, keyframes' points with confidence "
               ">= --min-confidence, one per voxel); frames.csv (per frame: index, stamp, keyframe flag, "
               "intrinsics fx fy cx cy at the model input size, depth file); depth/NNNNNN.png or .npy "
               "(depth at the model input size, see --depth-format); preview.png (the map seen from above, "
               "coloured by height, with the trajectory). Units: metres up to an unknown scale unless "
               "--scale-source fixed --scale S.")
    parser.add_argument("--input", required=True, action="append",
                        help="image folder, video file, rosbag2 (directory or .mcap/.db3), "
                             "camera index or 'synthetic[:WxH[:N]]'; several (one per camera of --cameras) "
                             "for a camera rig")
    parser.add_argument("--output", required=True, type=Path, help="output directory (created)")
    parser.add_argument("--topic", action="append",
                        help="image topic of a bag (default: its first image topic); a rig: one for every "
                             "--input, or one per --input in their order (a bag's several topics: the bag "
                             "given as --input once per topic)")
    parser.add_argument("--cameras", metavar="NAME,NAME",
                        help="a camera rig (the node's cameras): one name per --input, in their order. Writes "
                             "one map (map.ply, preview.png) and per camera trajectory_NAME.tum, "
                             "frames_NAME.csv and depth_NAME/; the map database records it as one rig")
    parser.add_argument("--primary-camera", metavar="NAME",
                        help="with --cameras: the camera whose scale the map takes (the node's "
                             "primary_camera; default the first)")
    parser.add_argument("--rate-hz", type=float,
                        help="stamp rate for folders and synthetic input (default 10 Hz); "
                             "overrides a video's own frame rate")
    parser.add_argument("--max-frames", type=int, help="stop after this many frames")
    parser.add_argument("--random-weights", action="store_true",
                        help="allow running without --checkpoint (random weights: the output "
                             "is NOT a map; for plumbing tests only)")
    parser.add_argument("--depth-format", choices=("png16", "npy"), default="png16",
                        help="png16: 16-bit PNG, depth in millimetres of the map's unit, "
                             f"clipped to {DEPTH_PNG_MAX_M} (0 = below 0.5 mm); npy: float32 "
                             "[H, W] (default %(default)s)")
    parser.add_argument("--colmap", type=Path, metavar="DIR",
                        help="also write the keyframes and the map as a COLMAP model: DIR/sparse/0/*.bin "
                             "and DIR/images/ (for Gaussian splatting and NeRF trainers; README)")
    parser.add_argument("--overwrite", action="store_true",
                        help="let --colmap replace a COLMAP model already in DIR (refused without it)")
    parser.add_argument("--strict-jpeg", action=argparse.BooleanOptionalAction, default=True,
                        help="reject a JPEG libjpeg warns about (the node's strict_jpeg); "
                             "--no-strict-jpeg accepts them (default %(default)s)")
    serve.add_arguments(parser)
    add_settings_arguments(parser)
    # A rig's grouping (offline: every frame, merged in stamp order; no wall clock to wait on).
    add_settings_arguments(parser, GroupingSettings, exclude=("cameras", "camera_sync_wait_s", "process_all_frames",
                                                              "queue_size"))
    return parser


def main(argv: list[str] | None = None) -> int:
    return interrupts.run(_main, argv, "lingbot-ros-offline")


def _main(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.checkpoint and not args.random_weights:
        parser.error("--checkpoint is required (pass --random-weights to run untrained weights "
                     "for a plumbing test; the output is then not a map)")
    viewer = serve.start(args, "lingbot-ros-offline")
    try:
        summary = run(args, viewer)
    except (OfflineError, SourceError, ConfigError, CheckpointError, SettingsError,
            VoxelRangeError, ColmapExportError, OSError) as err:   # OSError: an output file not written (the previous ones stay)
        hint = factory.failure_hint(err, settings_from_args(args)) if isinstance(err, CheckpointError) else ""
        print(f"lingbot-ros-offline: error: {err}{hint}", file=sys.stderr)
        serve.close(viewer)
        return 1
    print(summary, flush=True)
    serve.until_stopped(viewer, "lingbot-ros-offline", "the final map")
    return 0


def run(args: argparse.Namespace, viewer=None) -> str:
    """Process the whole input; returns the summary text."""
    if args.max_frames is not None and args.max_frames < 1:
        raise OfflineError(f"--max-frames must be >= 1, got {args.max_frames}")
    settings = settings_from_args(args)
    topics = args.topic or [None]
    if len(topics) not in (1, len(args.input)):
        raise OfflineError(f"{len(topics)} --topic for {len(args.input)} --input: give one for all, or one per input")
    if args.cameras is not None or len(args.input) > 1:
        from lingbot_ros.tools import offline_rig   # here: it imports this module (its writers)
        return offline_rig.run(args, settings, topics * (len(args.input) // len(topics)), viewer)
    undecodable: list[FrameDecodeError] = []
    source, total = open_input(args, args.input[0], topics[0], undecodable)
    if args.colmap is not None:
        check_target(args.colmap, args.overwrite)   # before the run, so that a refusal costs none

    bundle, mapper = started(settings, source, lambda: factory.build(settings), partial(Mapper, settings))
    try:
        summary = _process(args, settings, bundle, mapper, source, total, undecodable, viewer)
    finally:
        mapper.close()   # the run's end in the map database, and the map builder's thread
    return f"{summary}\nmap database: {mapper.recorder.text}"   # read after close: how the run ended


def started(settings, source, build, new_mapper, cameras: int = 1):
    """The model loaded (``build()``: its bundle), the mapper made (``new_mapper(bundle)``: a Mapper
    or a RigMapper) and warmed up on ``source``'s size; a signal meanwhile writes nothing."""
    mapper = None
    try:
        bundle = build()
        if bundle.random_weights:
            print("\n" + "!" * 78 + f"\n!! WARNING: --random-weights: the model is UNTRAINED.\n!! "
                  f"{bundle.untrained_warning()}.\n!! Use --checkpoint for a map.\n" + "!" * 78 + "\n",
                  file=sys.stderr)
        mapper = new_mapper(bundle)
        if settings.resume and cameras == 1:   # what it continues, or why a new map starts (as the node logs)
            print(f"lingbot-ros-offline: {mapper.snapshot.state_text}", file=sys.stderr, flush=True)
        if settings.warmup:
            size = warmup_size(settings, found_in_source(source) if settings.warmup_image_size == AUTO else None)
            if size.warning:
                print(f"lingbot-ros-offline: warning: {size.warning}", file=sys.stderr)
            rig = f" ({cameras} cameras)" if cameras > 1 else ""
            print(f"lingbot-ros-offline: warming up on {size.describe()}{rig}", file=sys.stderr, flush=True)
            mapper.warm_up(size)
    except KeyboardInterrupt:   # a signal while the model loads or warms up
        if mapper is not None:
            mapper.close()
        raise KeyboardInterrupt("before the first frame: nothing was written") from None
    return bundle, mapper


def open_input(args, spec: str, topic: str | None, undecodable: list, camera: str = ""):
    """An input's source and how many of its frames to run; its undecodable frames are skipped,
    said on stderr, and collected in ``undecodable``."""
    def skip(error: FrameDecodeError) -> None:   # the node skips such a frame too
        undecodable.append(error)
        print(f"lingbot-ros-offline: rejected: {camera + ': ' if camera else ''}frame skipped: {error}",
              file=sys.stderr)

    source = open_source(spec, rate_hz=args.rate_hz, topic=topic, strict_jpeg=args.strict_jpeg, on_undecodable=skip)
    total = source.num_frames
    if args.max_frames is not None:
        total = args.max_frames if total is None else min(total, args.max_frames)
    if total is None:
        raise OfflineError(f"{source.description} has no end; pass --max-frames")
    return source, total


def _process(args, settings, bundle, mapper: Mapper, source, total: int, undecodable: list, viewer) -> str:
    """Every frame through the mapper (up to a signal), then all files staged and committed."""
    # A signal is only recorded from here on: the loop stops between frames, the save completes.
    with interrupts.deferred(), StagedFiles() as staged:
        writer = FrameWriter(args.output, args.depth_format, staged, 
                             keep_images=settings.max_trajectory_poses if args.colmap is not None else 0)
        progress = Progress(total)
        seen = done = 0

        def inputs(frames):
            nonlocal seen
            for frame in frames:
                if seen == total or interrupts.requested():
                    return
                seen += 1
                yield InputFrame(rgb=frame.rgb, stamp_ns=frame.stamp_ns)

        # Queued: the next frame is read and decoded, and the one before placed, while the
        # device runs a frame's step (Mapper.process_queued).
        with contextlib.closing(iter(source)) as frames, \
                contextlib.closing(mapper.process_queued(inputs(frames))) as outcomes:
            for outcome in outcomes:
                done += 1
                report(outcome.notices)
                writer.add(outcome.final)
                if viewer is not None:
                    viewer.update(mapper, outcome)
                progress.update(done, have_results=writer.num_frames > 0)
        stopped = interrupts.requested()
        if stopped and seen == 0:
            raise KeyboardInterrupt("before the first frame: nothing was written")   # the previous files stay
        if stopped:
            print(f"\nlingbot-ros-offline: stopped by {stopped} after {seen} frames: saving what was "
                  "processed (a second signal is ignored)", file=sys.stderr, flush=True)
        if seen == 0 and undecodable:
            raise OfflineError(f"no frame of the input decoded ({len(undecodable)} tried); the first: {undecodable[0]}")
        outcome = mapper.finish()
        report(outcome.notices)
        writer.add(outcome.final)
        if viewer is not None:
            viewer.update(mapper, outcome, refresh=True)   # the final map, whenever the last read was
        progress.finish()
        snapshot = mapper.snapshot
        if writer.num_frames != seen - snapshot.rejected - snapshot.failed:
            raise OfflineError(f"the input ended after {seen} frames ({snapshot.rejected} rejected, "
                               f"{snapshot.failed} failed) but {writer.num_frames} results came back")
        saved = mapper.save(args.output, staged)
        table = writer.close()
        colmap = "" if args.colmap is None else "\n" + write_colmap(
            args.colmap, export_images(mapper.saved_trajectory(), mapper.camera_base, writer.keyframe_images),
            *mapper.map_points(), mapper.snapshot.scale_known, overwrite=args.overwrite, staged=staged).text()
    fps = seen / max(progress.elapsed_s, 1e-9)
    steady = progress.steady_fps(seen)
    steady_text = f" ({steady:.2f} FPS after the first results)" if steady is not None else ""
    skipped = f"; {len(undecodable)} did not decode and were skipped" if undecodable else ""
    stop_text = f"stopped by {stopped}: saved the {writer.num_frames} frames processed so far\n" if stopped else ""
    return (f"{stop_text}frames: {writer.num_frames} ({writer.num_keyframes} keyframes) from {source.description}"
            f"{skipped}\n"
            f"time: {progress.elapsed_s:.1f} s, {fps:.2f} FPS on {bundle.device}{steady_text}\n"
            f"map: {saved.num_points} points (voxel {settings.map_voxel_size_m:g})\n"
            f"outputs: {saved.tum_path}, {table}, {writer.depth_dir}/, {saved.ply_path}, "
            f"{Path(saved.ply_path).parent / 'preview.png'}{colmap}")


def report(notices) -> None:
    for notice in notices:
        print(f"lingbot-ros-offline: {notice.kind}: {notice.text}", file=sys.stderr)


class FrameWriter:
    """Per-frame files of final outputs, staged in ``staged``: depth maps and the frame table; and
    the newest ``keep_images`` keyframes' images for the COLMAP export (by frame index; the saved
    trajectory holds no older ones). ``camera``: a rig's camera, named in the files (depth_NAME/,
    frames_NAME.csv)."""

    def __init__(self, output_dir: Path, depth_format: str, staged: StagedFiles, keep_images: int = 0,
                 camera: str = ""):
        self.output_dir = output_dir
        self.suffix = f"_{camera}" if camera else ""
        self.depth_dir = output_dir / f"depth{self.suffix}"
        self.depth_dir.mkdir(parents=True, exist_ok=True)
        self.depth_format = depth_format
        self.staged = staged
        self.rows: list[tuple] = []
        self.num_frames = self.num_keyframes = 0
        self.keep_images = keep_images
        self.keyframe_images: dict[int, KeyframeImage] = {}

    def add(self, outputs: list[MapperOutput]) -> None:
        for output in outputs:
            self.num_frames += 1
            self.num_keyframes += output.is_keyframe
            if output.is_keyframe and self.keep_images:
                self.keyframe_images[output.index] = KeyframeImage.of(output.frame.rgb, output.result.intrinsic,
                                                                       output.result.image_size)
                if len(self.keyframe_images) > self.keep_images:
                    del self.keyframe_images[min(self.keyframe_images)]
            depth_file = self._write_depth(output.index, to_numpy(output.depth).astype(np.float32))
            k = to_numpy(output.result.intrinsic)
            self.rows.append((output.index, seconds_text(output.stamp_ns), int(output.is_keyframe),
                              k[0, 0], k[1, 1], k[0, 2], k[1, 2], depth_file))

    def _write_depth(self, index: int, depth: np.ndarray) -> str:
        if self.depth_format == "npy":
            path = self.depth_dir / f"{index:06d}.npy"
            buffer = io.BytesIO()
            np.save(buffer, depth)
            data = buffer.getvalue()
        else:
            path = self.depth_dir / f"{index:06d}.png"
            millimetres = np.round(np.clip(depth, 0.0, DEPTH_PNG_MAX_M) * 1000.0)
            encoded, png = cv2.imencode(".png", millimetres.astype(np.uint16))
            if not encoded:
                raise OfflineError(f"could not encode {path}")
            data = png.tobytes()
        self.staged.add(path, data)
        return str(path.relative_to(self.output_dir))

    def close(self) -> Path:
        """Stage the frame table; returns its path."""
        text = io.StringIO(newline="")
        table = csv.writer(text)
        table.writerow(("index", "stamp_s", "is_keyframe", "fx", "fy", "cx", "cy", "depth"))
        table.writerows(sorted(self.rows))
        path = self.output_dir / f"frames{self.suffix}.csv"
        self.staged.add(path, text.getvalue().encode("utf-8"))
        return path


class Progress:
    """The run's clock for the summary (all work up to the end, and the rate after the first
    results) and its progress display (tools/progress.py: a bar with the time left on a
    terminal, a line every few seconds otherwise)."""

    def __init__(self, total: int):
        self.total = total
        self.start = time.perf_counter()
        self.elapsed_s = 0.0
        self.steady_from: tuple[int, float] | None = None   # (frames done, time) at the first result
        self.display = progress.Progress(total, "lingbot-ros-offline", "frame")

    def update(self, done: int, have_results: bool) -> None:
        now = time.perf_counter()
        self.elapsed_s = now - self.start
        if have_results and self.steady_from is None:
            self.steady_from = (done, now)
        self.display.update(done)

    def finish(self) -> None:
        """Stop the clock (the summary's FPS counts all work up to here) and end the display."""
        self.elapsed_s = time.perf_counter() - self.start
        self.display.close()

    def steady_fps(self, done: int) -> float | None:
        """Frames per second after the first results came out (None if too few frames)."""
        if self.steady_from is None or done <= self.steady_from[0]:
            return None
        d0, t0 = self.steady_from
        return (done - d0) / max(self.start + self.elapsed_s - t0, 1e-9)


if __name__ == "__main__":
    sys.exit(main())
