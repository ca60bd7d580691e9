"""lingbot-ros-demo: the node and a camera source in one process, end to end.

  lingbot-ros-demo                      # tiny random model, courthouse images (or synthetic)
  lingbot-ros-demo --checkpoint lingbot-map-long.pt --device cuda --frames 300

Starts map_node (lifecycle: configure, activate) with process_all_frames, publishes exactly
--frames images of a camera source into its ~/image at --rate (reliable, so none is lost; a
folder shorter than that starts again), shows its progress (frames, rate, time left, the node's
state and cache pages) while it runs, saves the map (out/map.ply), trajectory (out/trajectory.tum) and preview through the
~/save_map service once every frame is accounted for, and prints a summary. Everything goes over
ROS topics and services, as with separate processes.

The default source is data/courthouse_jpg of the project's shared folder: $LINGBOT_SHARED, else
../shared beside the checkout the package was installed from (tools/shared_data.py).
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

from lingbot_ros.process import interrupts
from lingbot_ros.tools import shared_data
from lingbot_ros.tools.progress import Progress

DEFAULT_IMAGES = "data/courthouse_jpg"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lingbot-ros-demo", description=__doc__.split("\n")[0])
    parser.add_argument("--source", default=None,
                        help=f"image folder, video, camera index or synthetic (default: {DEFAULT_IMAGES} "
                             f"of the shared folder: ${shared_data.ENV}, else ../shared beside the checkout "
                             f"this was installed from; synthetic if there is none)")
    parser.add_argument("--checkpoint", default="", help="model checkpoint; default: tiny random model")
    parser.add_argument("--model-config", default="", help="preset name or JSON (model_config)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda")
    parser.add_argument("--image-width", type=int, default=None,
                        help="model input width (default 518 with a checkpoint, 252 without)")
    parser.add_argument("--frames", type=int, default=60, help="publish and process exactly N frames")
    parser.add_argument("--rate", type=float, default=10.0, help="camera frames per second")
    parser.add_argument("--out", default="out", help="directory for map.ply and trajectory.tum")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after S seconds")
    return parser


def choose_source(spec: str | None) -> tuple[str, str]:
    """(source spec, where it came from) for --source, or the default images."""
    if spec:
        return spec, "--source"
    found = shared_data.find(DEFAULT_IMAGES)
    if found is None:
        tried = ", ".join(str(path) for path, _ in shared_data.candidates())
        return "synthetic:640x480", f"no {DEFAULT_IMAGES} in {tried}"
    return str(found[0]), found[1]


def _camera_thread(node, source, count: int, rate: float, stop: threading.Event) -> threading.Thread:
    """Publishes exactly ``count`` frames (the source again from its start while it is short),
    reliable keep-all as process_all_frames subscribes, once the node's subscription matched."""
    from sensor_msgs.msg import Image

    from lingbot_ros.io.image_codec import fill_image
    from lingbot_ros.ros.qos import KEEP_ALL_RELIABLE

    publisher = node.create_publisher(Image, "/map_node/image", KEEP_ALL_RELIABLE)

    def run():
        while not publisher.get_subscription_count():   # a volatile reader misses what came before
            if stop.wait(0.02):
                return
        sent = 0
        while sent < count and not stop.is_set():
            for frame in source:
                if sent == count or stop.is_set():
                    return
                msg = Image()
                msg.header.stamp = node.get_clock().now().to_msg()
                msg.header.frame_id = "camera_optical_frame"
                publisher.publish(fill_image(msg, frame.rgb, "rgb8"))
                sent += 1
                stop.wait(1.0 / rate)

    thread = threading.Thread(target=run, name="demo_camera", daemon=True)
    thread.start()
    return thread


def main(argv=None) -> int:
    return interrupts.run(_main, argv, "lingbot-ros-demo")


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    from lingbot_ros.io.sources import SourceError, open_source

    from lingbot_ros.mapping.settings import MapperSettings, SettingsError
    from lingbot_ros.mapping.warmup_size import found_in_source, warmup_size

    phase_1 = MapperSettings().num_scale_frames
    if args.frames < phase_1:   # fewer would stay buffered, unprocessed, and the save would hold none
        print(f"lingbot-ros-demo: --frames must be at least {phase_1}: the model places its first {phase_1} "
              "frames together (num_scale_frames)", file=sys.stderr)
        return 2
    spec, found_by = choose_source(args.source)
    try:
        source = open_source(spec, rate_hz=args.rate)
    except (SourceError, ValueError) as error:
        print(f"lingbot-ros-demo: {error}", file=sys.stderr)
        return 2
    width = args.image_width or (518 if args.checkpoint else 252)
    try:   # the node warms up on the source's own size (it has no camera_info to read it from)
        warm = warmup_size(MapperSettings(image_width=width), found_in_source(source))
    except SettingsError as error:
        print(f"lingbot-ros-demo: --image-width: {error}", file=sys.stderr)
        return 2
    if warm.warning:
        print(f"lingbot-ros-demo: warning: {warm.warning}", file=sys.stderr)

    import rclpy
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.parameter import Parameter
    from rclpy.signals import SignalHandlerOptions

    from lingbot_ros.ros.node import MapNode
    from lingbot_ros.ros.services import SaveMap
    from lingbot_ros.ros.spinning import BackgroundSpin
    from lingbot_ros.ros.status import frames_accounted

    rclpy.init(args=None, signal_handler_options=SignalHandlerOptions.NO)   # process/interrupts.py
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
    ])
    client_node = rclpy.create_node("lingbot_demo")
    executor = MultiThreadedExecutor(num_threads=4)
    executor.add_node(node)
    executor.add_node(client_node)
    spin = BackgroundSpin(executor, node.get_logger()).start()
    stop = threading.Event()
    camera = None
    code = 0
    try:
        print(f"lingbot-ros-demo: source {source.description} ({found_by}), model "
              f"{args.checkpoint or 'tiny RANDOM weights'}, {args.frames} frames", flush=True)
        if node.trigger_configure() != TransitionCallbackReturn.SUCCESS or \
                node.trigger_activate() != TransitionCallbackReturn.SUCCESS:
            print("lingbot-ros-demo: the node did not start (see the log above)", file=sys.stderr)
            return 1
        camera = _camera_thread(client_node, source, args.frames, args.rate, stop)
        start = time.monotonic()
        display = Progress(args.frames, "lingbot-ros-demo", "frame", stream=sys.stdout)
        while time.monotonic() - start < args.timeout:
            status = node.status_message()
            # Frames buffered for phase 1 are held, not processed: a save holds the processed ones.
            accounted = frames_accounted(status)
            display.update(accounted, f"{status.state_text[:22]}, received {status.frames_received}, "
                                      f"dropped {status.frames_dropped}, cache pages {status.cache_pages}")
            if accounted >= args.frames:
                break
            time.sleep(0.25)
        else:
            print(f"\nlingbot-ros-demo: timed out after {args.timeout:.0f} s", file=sys.stderr)
            code = 1
        display.close()
        stop.set()
        camera.join(5)
        # Inactive: no frame is taken after this, so the summary and the saved files agree. A
        # signal from here on is recorded, not raised: the save it asked for completes.
        with interrupts.deferred():
            node.trigger_deactivate()
            code = _save_and_summarise(client_node, node, args, SaveMap, time.monotonic() - start,
                                        source.description) or code
    finally:
        stop.set()
        if camera is not None:   # it publishes through client_node: done before that is destroyed
            camera.join(5)
        node.release()
        spin.stop()   # before the nodes it waits on go
        node.destroy_node()
        client_node.destroy_node()
        rclpy.try_shutdown()
    return code


def _save_and_summarise(client_node, node, args, save_map_type, elapsed: float, source_text: str) -> int:
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
    print(f"summary: {status.frames_processed} frames of {source_text} processed in {elapsed:.1f} s "
          f"({status.frames_processed / max(elapsed, 1e-6):.2f} FPS), {status.frames_received} received, "
          f"{status.frames_dropped} dropped, {status.frames_rejected} rejected, {status.frames_failed} failed, "
          f"latency {status.latency_ms:.0f} ms (model {status.model_ms:.0f} ms)")
    if response is None or not response.success:
        print(f"lingbot-ros-demo: save_map failed: {response.message if response else 'timeout'}",
              file=sys.stderr)
        return 1
    print(f"saved: {response.message}")
    if random_weights:
        print("note: random-weight model; the saved map is NOT a reconstruction (use --checkpoint)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
