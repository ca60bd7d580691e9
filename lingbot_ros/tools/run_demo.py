"""lingbot-ros-demo: the node and a camera source in one process, end to end.

  lingbot-ros-demo                      # tiny random model, courthouse images (or synthetic)
  lingbot-ros-demo --checkpoint lingbot-map-long.pt --device cuda --frames 300
  lingbot-ros-demo --cameras front,back # a camera rig: courthouse and loop images, one map

Starts map_node (lifecycle: configure, activate) with process_all_frames, publishes exactly
--frames images of a camera source into its ~/image at --rate (reliable, so none is lost; a
folder shorter than that starts again), shows its progress (frames, rate, time left, the node's
state and cache pages) while it runs, saves the map (out/map.ply), trajectory (out/trajectory.tum) and preview through the
~/save_map service once every frame is accounted for, and prints a summary. Everything goes over
ROS topics and services, as with separate processes.

With --cameras NAME,NAME the node maps a camera rig (its parameter ``cameras``): --source once
per camera, in that order, each published into that camera's ~/<name>/image; every camera's
frame of one tick carries one stamp (a rig triggered together), so each of the node's groups
holds every camera. The progress shows each camera's state and frames, the save writes one
map.ply and a trajectory_<name>.tum per camera, and the summary names each camera's frames and
its scale against the primary camera.

The default source is data/courthouse_jpg of the project's shared folder: $LINGBOT_SHARED, else
../shared beside the checkout the package was installed from (tools/shared_data.py); a rig's
cameras take data/courthouse_jpg and data/loop_jpg in turn (two real sequences of one image size).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
import time
from pathlib import Path

from lingbot_ros.process import interrupts
from lingbot_ros.tools import shared_data
from lingbot_ros.tools.command_line import Parser
from lingbot_ros.tools.progress import Progress

DEFAULT_IMAGES = "data/courthouse_jpg"
# A rig's cameras without --source take these in turn: two real sequences of one image size (a
# rig's cameras share one model input size).
RIG_IMAGES = (DEFAULT_IMAGES, "data/loop_jpg")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="lingbot-ros-demo", description=__doc__.split("\n")[0])
    parser.add_argument("--source", default=None, action="append",
                        help=f"image folder, video, camera index or synthetic (default: {DEFAULT_IMAGES} "
                             f"of the shared folder: ${shared_data.ENV}, else ../shared beside the checkout "
                             f"this was installed from; synthetic if there is none); with --cameras once per "
                             f"camera, in their order (default: {' and '.join(RIG_IMAGES)} in turn)")
    parser.add_argument("--cameras", metavar="NAME,NAME",
                        help="a camera rig (the node's cameras): the cameras' names, each reading "
                             "~/NAME/image; one map.ply and a trajectory_NAME.tum per camera")
    parser.add_argument("--primary-camera", metavar="NAME",
                        help="with --cameras: the camera whose poses are ~/pose and TF and whose scale the "
                             "map takes (the node's primary_camera; default the first)")
    parser.add_argument("--checkpoint", default="", help="model checkpoint; default: tiny random model")
    parser.add_argument("--model-config", default="", help="preset name or JSON (model_config)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda")
    parser.add_argument("--image-width", type=int, default=None,
                        help="model input width (default 518 with a checkpoint, 252 without)")
    parser.add_argument("--frames", type=int, default=60,
                        help="publish and process exactly N frames (with --cameras: N per camera)")
    parser.add_argument("--rate", type=float, default=10.0, help="camera frames per second")
    parser.add_argument("--out", default="out", help="directory for map.ply, preview.png and trajectory.tum "
                                                     "(with --cameras: trajectory_NAME.tum per camera)")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after S seconds")
    return parser


def choose_source(spec: str | None, default: str = DEFAULT_IMAGES) -> tuple[str, str]:
    """(source spec, where it came from) for --source, or the ``default`` images of the shared folder."""
    if spec:
        return spec, "--source"
    found = shared_data.find(default)
    if found is None:
        tried = ", ".join(str(path) for path, _ in shared_data.candidates())
        return "synthetic:640x480", f"no {default} in {tried}"
    return str(found[0]), found[1]


@dataclasses.dataclass
class DemoCamera:
    """One camera the demo publishes: its source, and the frames sent so far (its thread counts)."""

    name: str           # the rig's camera name; '' for the single camera on ~/image
    source: object      # an io/sources.py source
    found_by: str
    sent: int = 0

    @property
    def frame_id(self) -> str:
        return f"{self.name}_optical_frame" if self.name else "camera_optical_frame"

    def describe(self) -> str:
        return f"{self.source.description} ({self.found_by})"


class DemoError(Exception):
    """A flag the demo cannot run with; its text says what to change."""


def rig_cameras(args) -> tuple[tuple[str, ...], str]:
    """(--cameras' names, the primary camera) checked by the node's own rule (ros/cameras.py),
    or ((), '') without --cameras."""
    if args.cameras is None:
        if args.primary_camera is not None:
            raise DemoError("--primary-camera needs --cameras")
        if args.source is not None and len(args.source) > 1:
            raise DemoError(f"--source given {len(args.source)} times: name the cameras, --cameras NAME,NAME "
                            "(one per --source)")
        return (), ""
    from lingbot_ros.ros.cameras import cameras_errors

    names = tuple(args.cameras.split(","))
    errors = cameras_errors(names, args.primary_camera or "")
    if errors:
        raise DemoError("--cameras: " + "; ".join(errors))
    if args.source is not None and len(args.source) != len(names):
        raise DemoError(f"--source given {len(args.source)} times for {len(names)} cameras: one per camera, in "
                        f"the order of --cameras (or none: {' and '.join(RIG_IMAGES)} in turn)")
    return names, args.primary_camera or names[0]


def open_cameras(args, names: tuple[str, ...]) -> list[DemoCamera]:
    """Each camera's source opened (the single camera: one named '')."""
    from lingbot_ros.io.sources import SourceError, open_source

    cameras = []
    for index, name in enumerate(names or ("",)):
        spec, found_by = choose_source(args.source[index] if args.source else None,
                                       RIG_IMAGES[index % len(RIG_IMAGES)])   # the single camera: the first
        try:
            cameras.append(DemoCamera(name, open_source(spec, rate_hz=args.rate), found_by))
        except (SourceError, ValueError) as error:
            raise DemoError(f"camera {name}: {error}" if name else str(error)) from error
    return cameras


def warmup_for(cameras: list[DemoCamera], primary: str, width: int):
    """The size the node warms up on: the primary camera's source's (the node has no camera_info
    to read it from); a rig whose sources give another model input size is refused, since a rig's
    cameras share one (stream/multi_session.py) and the other camera's frames would all fail."""
    from lingbot_ros.mapping.settings import MapperSettings, SettingsError
    from lingbot_ros.mapping.warmup_size import found_in_source, warmup_size

    try:
        sizes = {camera.name: warmup_size(MapperSettings(image_width=width), found_in_source(camera.source))
                 for camera in cameras}
    except SettingsError as error:
        raise DemoError(f"--image-width: {error}") from error
    warm = sizes[primary]
    for name, size in sizes.items():
        if size.model_input != warm.model_input:
            raise DemoError(f"camera {name}'s source gives {size.describe()}, camera {primary}'s {warm.describe()}: "
                            "a rig's cameras share one model input size; give sources of one aspect ratio")
    return warm


def _camera_thread(node, cameras: list[DemoCamera], topics: list[str], count: int, rate: float,
                   stop: threading.Event) -> threading.Thread:
    """Publishes exactly ``count`` frames of each camera (a source again from its start while it
    is short), reliable keep-all as process_all_frames subscribes, once the node's subscriptions
    matched. One stamp per tick for every camera: a rig's cameras triggered together."""
    from sensor_msgs.msg import Image

    from lingbot_ros.io.image_codec import fill_image
    from lingbot_ros.ros.qos import KEEP_ALL_RELIABLE

    publishers = [node.create_publisher(Image, topic, KEEP_ALL_RELIABLE) for topic in topics]

    def run():
        while not all(publisher.get_subscription_count() for publisher in publishers):
            if stop.wait(0.02):   # a volatile reader misses what came before
                return
        streams = [_endless(camera.source) for camera in cameras]
        for _ in range(count):
            if stop.is_set():
                return
            stamp = node.get_clock().now().to_msg()
            for camera, publisher, frames in zip(cameras, publishers, streams):
                frame = next(frames, None)
                if frame is None:   # a source without a frame
                    return
                msg = Image()
                msg.header.stamp = stamp
                msg.header.frame_id = camera.frame_id
                publisher.publish(fill_image(msg, frame.rgb, "rgb8"))
                camera.sent += 1
            stop.wait(1.0 / rate)

    thread = threading.Thread(target=run, name="demo_camera", daemon=True)
    thread.start()
    return thread


def _endless(source):
    """``source``'s frames, from its start again at its end; none if a pass gives none."""
    while True:
        any_frame = False
        for frame in source:
            any_frame = True
            yield frame
        if not any_frame:
            return


def main(argv=None) -> int:
    return interrupts.run(_main, argv, "lingbot-ros-demo")


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    from lingbot_ros.mapping.settings import MapperSettings

    phase_1 = MapperSettings().num_scale_frames
    if args.frames < phase_1:   # fewer would stay buffered, unprocessed, and the save would hold none
        print(f"lingbot-ros-demo: --frames must be at least {phase_1}: the model places its first {phase_1} "
              "frames together (num_scale_frames)", file=sys.stderr)
        return 2
    width = args.image_width or (518 if args.checkpoint else 252)
    try:
        names, primary = rig_cameras(args)
        cameras = open_cameras(args, names)
        warm = warmup_for(cameras, primary, width)
    except DemoError as error:
        print(f"lingbot-ros-demo: {error}", file=sys.stderr)
        return 2
    if warm.warning:
        print(f"lingbot-ros-demo: warning: {warm.warning}", file=sys.stderr)

    import rclpy
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.parameter import Parameter
    from rclpy.signals import SignalHandlerOptions

    from lingbot_ros.ros import topics
    from lingbot_ros.ros.executor import PoolExecutor
    from lingbot_ros.ros.node import MapNode
    from lingbot_ros.ros.services import SaveMap
    from lingbot_ros.ros.spinning import BackgroundSpin
    from lingbot_ros.ros.status import frames_accounted

    rclpy.init(args=None, signal_handler_options=SignalHandlerOptions.NO)   # process/interrupts.py
    rig = [Parameter("cameras", value=list(names)), Parameter("primary_camera", value=primary)] if names else []
    node = MapNode(parameter_overrides=[
        Parameter("checkpoint", value=args.checkpoint),
        Parameter("model_config", value=args.model_config),
        Parameter("device", value=args.device),
        Parameter("image_width", value=width),
        Parameter("warmup_image_size", value=warm.text),
        Parameter("save_directory", value=os.path.abspath(args.out)),   # relative ones are under $ROS_HOME
        Parameter("process_all_frames", value=True),
        # The demo's run goes beside its saved map, not into the user's ~/.ros.
        Parameter("map_database", value=str(Path(args.out).resolve() / "map.db")),
        *rig,
    ])
    client_node = rclpy.create_node("lingbot_demo")
    executor = PoolExecutor(node.executor_threads())   # as lingbot-ros-node: one more per camera
    executor.add_node(node)
    executor.add_node(client_node)
    spin = BackgroundSpin(executor, node.get_logger()).start()
    stop = threading.Event()
    camera_thread = None
    code = 0
    total = args.frames * len(cameras)
    try:
        sources = (f"source {cameras[0].describe()}" if not names else
                   "cameras " + ", ".join(f"{camera.name}: {camera.describe()}" for camera in cameras))
        print(f"lingbot-ros-demo: {sources}, model {args.checkpoint or 'tiny RANDOM weights'}, {args.frames} frames"
              + (" per camera" if names else ""), flush=True)
        if node.trigger_configure() != TransitionCallbackReturn.SUCCESS or \
                node.trigger_activate() != TransitionCallbackReturn.SUCCESS:
            print("lingbot-ros-demo: the node did not start (see the log above)", file=sys.stderr)
            return 1
        image_topics = [node.resolve_topic_name(topics.image_topic(camera.name or None)) for camera in cameras]
        camera_thread = _camera_thread(client_node, cameras, image_topics, args.frames, args.rate, stop)
        start = time.monotonic()
        display = Progress(total, "lingbot-ros-demo", "frame", stream=sys.stdout)
        while time.monotonic() - start < args.timeout:
            status = node.status_message()
            # Frames buffered for phase 1 are held, not processed: a save holds the processed ones.
            accounted = frames_accounted(status)
            display.update(accounted, _progress_text(node, status, bool(names)))
            if accounted >= total:
                break
            time.sleep(0.25)
        else:
            print(f"\nlingbot-ros-demo: timed out after {args.timeout:.0f} s", file=sys.stderr)
            code = 1
        display.close()
        stop.set()
        camera_thread.join(5)
        # Inactive: no frame is taken after this, so the summary and the saved files agree. A
        # signal from here on is recorded, not raised: the save it asked for completes.
        with interrupts.deferred():
            node.trigger_deactivate()
            code = _save_and_summarise(client_node, node, SaveMap, time.monotonic() - start, cameras) or code
    finally:
        stop.set()
        if camera_thread is not None:   # it publishes through client_node: done before that is destroyed
            camera_thread.join(5)
        node.release()
        spin.stop()   # before the nodes it waits on go
        node.destroy_node()
        client_node.destroy_node()
        rclpy.try_shutdown()
    return code


def _progress_text(node, status, rig: bool) -> str:
    counts = f"received {status.frames_received}, dropped {status.frames_dropped}"
    mapper = node.mapper   # taken once: a failed node clears it
    if rig and mapper is not None:   # each camera's state and frames processed, as ~/status ends with them
        from lingbot_ros.ros.rig import camera_summary

        return f"{counts}; {camera_summary(mapper)}"
    return f"{status.state_text[:22]}, {counts}, cache pages {status.cache_pages}"


def _save_and_summarise(client_node, node, save_map_type, elapsed: float, cameras: list[DemoCamera]) -> int:
    from std_srvs.srv import Trigger

    random_weights = node.bundle is not None and node.bundle.random_weights
    if save_map_type is not None:
        client = client_node.create_client(save_map_type, "/map_node/save_map")
        request = save_map_type.Request(directory="")   # the node's save_directory: args.out
    else:
        client, request = client_node.create_client(Trigger, "/map_node/save_map"), Trigger.Request()
    if not client.wait_for_service(timeout_sec=10.0):
        print("lingbot-ros-demo: ~/save_map did not appear", file=sys.stderr)
        return 1
    future = client.call_async(request)
    deadline = time.monotonic() + 60
    while not future.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    response = future.result() if future.done() else None
    status = node.status_message()
    rig = bool(cameras[0].name)
    inputs = (f"{len(cameras)} cameras ({', '.join(camera.name for camera in cameras)})" if rig
              else cameras[0].source.description)
    print(f"summary: {status.frames_processed} frames of {inputs} processed in {elapsed:.1f} s "
          f"({status.frames_processed / max(elapsed, 1e-6):.2f} FPS), {status.frames_received} received, "
          f"{status.frames_dropped} dropped, {status.frames_rejected} rejected, {status.frames_failed} failed, "
          f"latency {status.latency_ms:.0f} ms (model {status.model_ms:.0f} ms)")
    if rig:
        for line in _camera_lines(node, cameras):
            print(line)
    if response is None or not response.success:
        print(f"lingbot-ros-demo: save_map failed: {response.message if response else 'timeout'}",
              file=sys.stderr)
        return 1
    print(f"saved: {response.message}")
    if random_weights:
        print("note: random-weight model; the saved map is NOT a reconstruction (use --checkpoint)")
    return 0


def _camera_lines(node, cameras: list[DemoCamera]) -> list[str]:
    """Per camera of a rig: the frames sent and processed, and its scale against the primary
    camera's (read on the node's worker, the rig's one owner, as its services are)."""
    from lingbot_ros.ros.services import run_on_worker

    mapper = node.mapper
    if mapper is None:
        return []
    rig = mapper.rig
    ok, scales = run_on_worker(node, lambda: rig.scales)
    lines = []
    for camera in cameras:
        snapshot = rig.camera(camera.name).snapshot
        if camera.name == rig.primary:
            scale = "the map's scale (primary)"
        elif ok:
            scale = f"scale against {rig.primary}: {scales[camera.name].text}"
        else:
            scale = f"scale against {rig.primary} not read: {scales}"
        lines.append(f"  camera {camera.name}: {camera.sent} frames of {camera.source.description}, "
                     f"{snapshot.processed} processed, {snapshot.failed} failed; {scale}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
