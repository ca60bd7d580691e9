"""lingbot-ros-offline with several inputs: a camera rig (mapping/rig/RigMapper), one map.

One input per camera (``--cameras NAME,NAME``, in the order of the ``--input`` flags). The
inputs' frames are merged in stamp order into the rig's FrameGrouper (mapping/rig/grouping.py,
every frame: process_all_frames): frames of different cameras stamped within
``--camera-sync-tolerance-s`` run as one group (one batched model step); an input that ended
leaves its camera out of the later groups. Writes one map (map.ply, preview.png: every camera's
map at the primary camera's scale) and per camera its trajectory (trajectory_NAME.tum), frame
table (frames_NAME.csv) and depth maps (depth_NAME/), all staged and committed together as
the single-camera run's (tools/offline.py, whose interrupt rules hold here too).
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys

from lingbot_ros.mapping import factory
from lingbot_ros.mapping.files.staged_files import StagedFiles
from lingbot_ros.mapping.records import InputFrame, StepOutcome
from lingbot_ros.mapping.rig.cameras import check_cameras, check_rig_settings
from lingbot_ros.mapping.rig.grouping import MAX_QUEUED_FRAMES, FrameGrouper, GroupingSettings
from lingbot_ros.mapping.rig.rig_mapper import RigMapper
from lingbot_ros.process import interrupts
from lingbot_ros.tools.offline import FrameWriter, OfflineError, Progress, open_input, report, started
from lingbot_ros.tools.settings_flags import settings_from_args


def run(args, settings, topics: list, viewer=None) -> str:
    """The rig's run over ``args.input`` (one per camera; ``topics`` one per input); the summary."""
    if args.cameras is None:
        raise OfflineError(f"{len(args.input)} inputs: name their cameras, --cameras NAME,NAME (one per --input)")
    names = args.cameras.split(",")
    if len(names) != len(args.input):
        raise OfflineError(f"--cameras names {len(names)} cameras for {len(args.input)} --input: one name per input")
    cameras, primary = check_cameras(names, args.primary_camera)
    grouping = settings_from_args(args, GroupingSettings, cameras=cameras, process_all_frames=True,
                                  queue_size=MAX_QUEUED_FRAMES)
    check_rig_settings(settings)   # before the inputs open and the model loads
    if args.colmap is not None:
        raise OfflineError("--colmap exports one camera's keyframes; not with --cameras")
    undecodable: dict[str, list] = {camera: [] for camera in cameras}
    inputs = {camera: open_input(args, spec, topic, undecodable[camera], camera)
              for camera, spec, topic in zip(cameras, args.input, topics)}
    bundle, rig = started(settings, inputs[primary][0], lambda: factory.build_rig(settings, cameras),
                          lambda bundle: RigMapper(settings, bundle, cameras, primary), len(cameras))
    try:
        return _process(args, grouping, bundle, rig, inputs, undecodable, viewer)
    finally:
        rig.close()


def _process(args, grouping: GroupingSettings, bundle, rig: RigMapper, inputs: dict, undecodable: dict,
             viewer) -> str:
    total = sum(count for _, count in inputs.values())
    with interrupts.deferred(), StagedFiles() as staged, contextlib.ExitStack() as stack:
        writers = {camera: FrameWriter(args.output, args.depth_format, staged, camera=camera) for camera in rig.cameras}
        frames = {camera: stack.enter_context(contextlib.closing(iter(source))) for camera, (source, _) in inputs.items()}
        seen = {camera: 0 for camera in rig.cameras}
        progress = Progress(total)
        grouper = FrameGrouper(grouping)
        heads = {camera: None for camera in rig.cameras}   # each input's next frame, read ahead
        ended = set()
        while not interrupts.requested():
            for camera, (_, count) in inputs.items():
                if heads[camera] is None and camera not in ended:
                    heads[camera] = next(frames[camera], None) if seen[camera] < count else None
                    seen[camera] += heads[camera] is not None
                    if heads[camera] is None:   # after its last frame went in (an add undoes an end)
                        ended.add(camera)
                        grouper.end_input(camera)
            waiting = [camera for camera in rig.cameras if heads[camera] is not None]
            if not waiting:
                break
            camera = min(waiting, key=lambda name: heads[name].stamp_ns)   # stamp order: no queue grows
            frame, heads[camera] = heads[camera], None
            grouper.add(camera, InputFrame(rgb=frame.rgb, stamp_ns=frame.stamp_ns))
            for group in grouper.ready():
                _written(rig, rig.process(group), writers, viewer)
            progress.update(sum(seen.values()), have_results=any(w.num_frames for w in writers.values()))
        for group in grouper.drain():
            _written(rig, rig.process(group), writers, viewer)
        stopped = interrupts.requested()
        if stopped and not any(seen.values()):
            raise KeyboardInterrupt("before the first frame: nothing was written")   # the previous files stay
        if stopped:
            print(f"\nlingbot-ros-offline: stopped by {stopped} after {sum(seen.values())} frames: saving what was "
                  "processed (a second signal is ignored)", file=sys.stderr, flush=True)
        for camera in rig.cameras:
            if not seen[camera] and undecodable[camera]:
                raise OfflineError(f"no frame of camera {camera}'s input decoded ({len(undecodable[camera])} tried); "
                                   f"the first: {undecodable[camera][0]}")
        _written(rig, rig.finish(), writers, viewer, refresh=True)
        progress.finish()
        for camera, snapshot in rig.snapshots.items():
            if writers[camera].num_frames != seen[camera] - snapshot.rejected - snapshot.failed:
                raise OfflineError(f"camera {camera}'s input ended after {seen[camera]} frames ({snapshot.rejected} "
                                   f"rejected, {snapshot.failed} failed) but {writers[camera].num_frames} results "
                                   "came back")
        saved = rig.save(args.output, staged)
        tables = {camera: writer.close() for camera, writer in writers.items()}
    done = sum(seen.values())
    lines = [f"stopped by {stopped}: saved the frames processed so far"] if stopped else []
    scales = rig.scales
    for camera, (source, _) in inputs.items():
        writer = writers[camera]
        skipped = f"; {len(undecodable[camera])} did not decode and were skipped" if undecodable[camera] else ""
        role = "primary" if camera == rig.primary else f"scale {scales[camera].text}"
        lines.append(f"camera {camera} ({role}): {writer.num_frames} frames ({writer.num_keyframes} keyframes) from "
                     f"{source.description}{skipped}; {saved.tum_paths[camera]}, {tables[camera]}, {writer.depth_dir}/")
    groups = grouper.status()
    lines.append(f"groups: {groups.groups} ({groups.groups - groups.partial_groups} with a frame of every camera; "
                 f"--camera-sync-tolerance-s {grouping.camera_sync_tolerance_s:g})")
    lines.append(f"time: {progress.elapsed_s:.1f} s, {done / max(progress.elapsed_s, 1e-9):.2f} FPS "
                 f"({len(rig.cameras)} cameras) on {bundle.device}")
    lines.append(f"map: {saved.message}")
    return "\n".join(lines)


def _written(rig: RigMapper, outcome, writers: dict, viewer, refresh: bool = False) -> None:
    """A rig verb's outcome: notices said (by camera), final outputs written; the viewer shows the
    primary camera."""
    for camera, step in outcome.outcomes.items():
        report([dataclasses.replace(notice, text=f"{camera}: {notice.text}") for notice in step.notices])
        writers[camera].add(step.final)
    if viewer is not None:
        viewer.update(rig.camera(rig.primary), outcome.outcomes.get(rig.primary, StepOutcome()), refresh=refresh)

