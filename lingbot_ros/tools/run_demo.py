"""lingbot-ros-demo: the node and a camera source in one process, end to end.

  lingbot-ros-demo                      # tiny random model, courthouse images (or synthetic)
  lingbot-ros-demo --checkpoint lingbot-map-long.pt --device cuda --frames 300

Starts map_node (lifecycle: configure, activate), publishes a camera source into its ~/image at
--rate, prints one status line (frames, FPS, drops, cache pages) while it runs, stops after
--frames processed frames, saves the map (out/map.ply) and trajectory (out/trajectory.tum) through
the ~/save_map service, and prints a summary. Everything goes over ROS topics and services, as
with separate processes.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

DEFAULT_IMAGES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "courthouse_jpg"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lingbot-ros-demo", description=__doc__.split("\n")[0])
    parser.add_argument("--source", default=None,
                        help=f"image folder, video, camera index or synthetic (default: "
                             f"{DEFAULT_IMAGES} if present, else synthetic)")
    parser.add_argument("--checkpoint", default="", help="model checkpoint; default: tiny random model")
    parser.add_argument("--model-config", default="", help="preset name or JSON (model_config)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda")
    parser.add_argument("--image-width", type=int, default=None,
                        help="model input width (default 518 with a checkpoint, 252 without)")
    parser.add_argument("--frames", type=int, default=60, help="stop after N processed frames")
    parser.add_argument("--rate", type=float, default=10.0, help="camera frames per second")
    parser.add_argument("--out", default="out", help="directory for map.ply and trajectory.tum")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after S seconds")
    return parser


def _camera_thread(node, source, rate: float, stop: threading.Event) -> threading.Thread:
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image

    from lingbot_ros.io.image_codec import fill_image

    publisher = node.create_publisher(Image, "/map_node/image", qos_profile_sensor_data)

    def run():
        while not stop.is_set():
            for frame in source:
                if stop.is_set():
                    return
                msg = Image()
                msg.header.stamp = node.get_clock().now().to_msg()
                msg.header.frame_id = "camera_optical_frame"
                publisher.publish(fill_image(msg, frame.rgb, "rgb8"))
                stop.wait(1.0 / rate)

    thread = threading.Thread(target=run, name="demo_camera", daemon=True)
    thread.start()
    return thread


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from lingbot_ros.io.sources import SourceError, open_source

    spec = args.source or (str(DEFAULT_IMAGES) if DEFAULT_IMAGES.is_dir() else "synthetic:640x480")
    try:
        source = open_source(spec, rate_hz=args.rate)
    except (SourceError, ValueError) as error:
        print(f"lingbot-ros-demo: {error}", file=sys.stderr)
        return 2

    import rclpy
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.parameter import Parameter

    from lingbot_ros.ros.node import MapNode
    from lingbot_ros.ros.services import SaveMap

    width = args.image_width or (518 if args.checkpoint else 252)
    rclpy.init(args=None)
    node = MapNode(parameter_overrides=[
        Parameter("checkpoint", value=args.checkpoint),
        Parameter("model_config", value=args.model_config),
        Parameter("device", value=args.device),
        Parameter("image_width", value=width),
        Parameter("save_directory", value=args.out),
        # The demo's run goes beside its saved map, not into the user's ~/.ros.
        Parameter("map_database", value=str(Path(args.out).resolve() / "map.db")),
    ])
    client_node = rclpy.create_node("lingbot_demo")
    executor = MultiThreadedExecutor(num_threads=4)
    executor.add_node(node)
    executor.add_node(client_node)
    spin = threading.Thread(target=executor.spin, daemon=True)
    spin.start()
    stop = threading.Event()
    code = 0
    try:
        print(f"lingbot-ros-demo: source {spec}, model {args.checkpoint or 'tiny RANDOM weights'}, "
              f"{args.frames} frames", flush=True)
        if node.trigger_configure() != TransitionCallbackReturn.SUCCESS or \
                node.trigger_activate() != TransitionCallbackReturn.SUCCESS:
            print("lingbot-ros-demo: the node did not start (see the log above)", file=sys.stderr)
            return 1
        camera = _camera_thread(client_node, source, args.rate, stop)
        start = time.monotonic()
        while time.monotonic() - start < args.timeout:
            status = node.status_message()
            elapsed = time.monotonic() - start
            print(f"\r[{elapsed:6.1f} s] {status.state_text[:22]:<22} frames {status.frames_processed:4d}/"
                  f"{args.frames} ({status.frames_processed / max(elapsed, 1e-6):5.2f} FPS)  received "
                  f"{status.frames_received:4d}  dropped {status.frames_dropped:4d}  cache pages "
                  f"{status.cache_pages:4d}", end="", flush=True)
            if status.frames_processed >= args.frames:
                break
            time.sleep(0.25)
        else:
            print(f"\nlingbot-ros-demo: timed out after {args.timeout:.0f} s", file=sys.stderr)
            code = 1
        stop.set()
        camera.join(5)
        # Inactive: no frame is taken after this, so the summary and the saved files agree.
        node.trigger_deactivate()
        print()
        code = _save_and_summarise(client_node, node, args, SaveMap, time.monotonic() - start) or code
    except KeyboardInterrupt:
        code = 130
    finally:
        stop.set()
        node.release()
        executor.shutdown(timeout_sec=5)
        node.destroy_node()
        client_node.destroy_node()
        rclpy.try_shutdown()
    return code


def _save_and_summarise(client_node, node, args, save_map_type, elapsed: float) -> int:
    from std_srvs.srv import Trigger

    random_weights = node.bundle is not None and node.bundle.random_weights
    if save_map_type is not None:
        client = client_node.create_client(save_map_type, "/map_node/save_map")
        request = save_map_type.Request(directory=args.out)
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
    print(f"summary: {status.frames_processed} frames processed in {elapsed:.1f} s "
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
