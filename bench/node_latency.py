"""map_node end to end: latency from publish to ~/pose, minus the model step, and the highest input
rate the node sustains without dropping or queueing frames.

The node runs as a subprocess (by default the tiny fixture checkpoint on CPU, input width 112,
3 scale frames, window 8; newest-frame-wins input as deployed); this process publishes rgb8
images (640x480 by default) at increasing rates and listens on ~/pose and ~/status (each status
carries the model time of the frame it reports). Per rate it prints frames sent / received /
processed / dropped and the medians of end-to-end latency, model time and their difference (the node's own
overhead: transport, decode, preprocessing, output messages). A warm-up at 2 Hz (at least 3 s and
num_scale_frames + 3 frames) precedes the timed rates.

  python bench/node_latency.py                       # rates 2 4 8 16 24 32 Hz, 4 s each
  python bench/node_latency.py --rates 5 10 --seconds 6 --image-width 224
  python bench/node_latency.py --transport compressed   # JPEG (quality 90) on ~/image/compressed

Model and node settings map to map_node parameters: --device (device), --model-config
(model_config: a JSON file or a preset name such as lingbot-map), --checkpoint (checkpoint; `none`
leaves it unset = random weights), --image-width (image_width, the model input width),
--num-scale-frames (num_scale_frames), --window (sliding_window); --param NAME:=VALUE adds any
other parameter (with process_all_frames:=true the images go reliable, keeping every frame, as
that node's subscription asks). --image-size WxH is the size of the published image; --node-log
FILE keeps the node's output (discarded by default). On the GPU machine (no ROS there: source the bundle of
bench/ros_runtime_bundle.sh first, see bench/README.md), the released architecture with random
weights at the deployed sizes:

  python bench/node_latency.py --device cuda --model-config lingbot-map --checkpoint none \
      --image-width 518 --image-size 518x378 --num-scale-frames 8 --window 64 \
      --rates 10 20 30 --seconds 10
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))   # run from a checkout, installed or not

from lingbot_ros.mapping.settings import parse_image_size  # noqa: E402

FIXTURE = Path(os.environ.get("LINGBOT_SHARED", REPO.parent / "shared")) / "fixtures" / "tiny_default"


def _image_size(text: str) -> tuple[int, int]:
    size = parse_image_size(text)   # the node's own parser for warmup_image_size
    if size is None:
        raise argparse.ArgumentTypeError(f"expected WxH with positive sizes, e.g. 640x480, got '{text}'")
    return size


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[2, 4, 8, 16, 24, 32])
    parser.add_argument("--seconds", type=float, default=4.0, help="publishing time per rate")
    parser.add_argument("--device", default="cpu", help="node parameter device (cpu, cuda, cuda:N)")
    parser.add_argument("--model-config", default=None,
                        help="JSON file or preset name (e.g. lingbot-map); "
                             "default: the fixture's config.json")
    parser.add_argument("--checkpoint", default=None,
                        help="checkpoint .pt, or 'none' for random weights; "
                             "default: the fixture's ckpt.pt")
    parser.add_argument("--image-width", type=int, default=112, help="model input width")
    parser.add_argument("--image-size", type=_image_size, default=(640, 480), metavar="WxH",
                        help="size of the published rgb8 image (default 640x480)")
    parser.add_argument("--transport", choices=("raw", "compressed"), default="raw",
                        help="raw: sensor_msgs/Image rgb8 on ~/image; compressed: sensor_msgs/"
                             "CompressedImage JPEG (quality 90) on ~/image/compressed, the node's "
                             "image_transport:=compressed (default raw)")
    parser.add_argument("--num-scale-frames", type=int, default=3)
    parser.add_argument("--window", type=int, default=8, help="node parameter sliding_window")
    parser.add_argument("--param", action="append", default=[], metavar="NAME:=VALUE",
                        help="extra node parameter (repeatable), e.g. cuda_graphs:=false")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in the node")
    parser.add_argument("--startup-timeout", type=float, default=None,
                        help="seconds to wait for the node to come up (default 60 on CPU, 600 "
                             "otherwise: model build, warm-up and a cold FlashInfer JIT)")
    parser.add_argument("--out", type=Path, default=None,
                        help="write latency.json (the table and every frame's latency) and latency.png "
                             "(a histogram per rate, bench/plots.py) to this folder")
    parser.add_argument("--node-log", type=Path, default=None,
                        help="write the node's output to this file (default: discarded)")
    parser.add_argument("--fixture", type=Path, default=FIXTURE,
                        help="fixture folder of the default model (default: tiny_default under "
                             "$LINGBOT_SHARED/fixtures or ../shared/fixtures)")
    args = parser.parse_args(argv)
    if args.model_config is None:
        args.model_config = str(args.fixture / "config.json")
    elif args.model_config.endswith(".json") or os.path.sep in args.model_config:
        args.model_config = str(Path(args.model_config).resolve())   # the node runs in REPO
    if args.checkpoint is None:
        args.checkpoint = str(args.fixture / "ckpt.pt")
    elif args.checkpoint.lower() == "none":
        args.checkpoint = None
    else:
        args.checkpoint = str(Path(args.checkpoint).resolve())
    if args.startup_timeout is None:
        args.startup_timeout = 60.0 if args.device == "cpu" else 600.0
    return args


def node_params(args) -> list[str]:
    params = ([f"checkpoint:={args.checkpoint}"] if args.checkpoint else []) + [
        f"model_config:={args.model_config}", f"device:={args.device}",
        f"image_width:={args.image_width}", f"num_scale_frames:={args.num_scale_frames}",
        f"sliding_window:={args.window}", "max_stamp_gap_s:=0.0", "map_publish_period_s:=0.0",
        "diagnostics_period_s:=1.0",
        # The warm-up compiles and captures for the size the probe publishes.
        "warmup_image_size:={}x{}".format(*args.image_size), f"image_transport:={args.transport}"]
    return params + list(args.param)


def start_node(args, env) -> subprocess.Popen:
    params = node_params(args)
    command = [sys.executable, "-m", "lingbot_ros.ros.main", "--ros-args"]
    for p in params:
        command += ["-p", p]
    log = open(args.node_log, "w") if args.node_log else subprocess.DEVNULL
    return subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


class Probe:
    def __init__(self, domain: int, image_size: tuple[int, int] = (640, 480), transport: str = "raw",
                 reliable: bool = False):
        import rclpy
        from geometry_msgs.msg import PoseStamped
        from rclpy.context import Context
        from rclpy.event_handler import PublisherEventCallbacks
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import (DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy,
                               qos_profile_sensor_data)
        from sensor_msgs.msg import CompressedImage, Image

        from lingbot_ros.msg import MapStatus

        self.context = Context()
        # args=[]: this script's own command line (e.g. --param a:=b) is not for rcl.
        rclpy.init(args=[], context=self.context, domain_id=domain)
        self.node = rclpy.create_node("node_latency_bench", context=self.context)
        # As a camera driver publishes: best effort, keep last 1; reliable and keeping every frame
        # for a node with process_all_frames (its subscription is reliable: a best-effort
        # publisher would not match it).
        compressed = transport == "compressed"
        qos = (QoSProfile(depth=1, history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE)
               if reliable else qos_profile_sensor_data)
        self.incompatible = ""     # the QoS policy a subscription refused this publisher for
        self.publisher = self.node.create_publisher(
            CompressedImage if compressed else Image, "/map_node/image/compressed" if compressed
            else "/map_node/image", qos, event_callbacks=PublisherEventCallbacks(
                incompatible_qos=lambda info: setattr(self, "incompatible", str(info.last_policy_kind))))
        self.sent_at: dict[int, float] = {}        # stamp ns -> monotonic publish time
        self.pose_at: dict[int, float] = {}        # stamp ns -> monotonic receive time
        self.model_ms: dict[int, float] = {}       # stamp ns -> model step of that frame
        self.last_status = None
        self.node.create_subscription(PoseStamped, "/map_node/pose", self._on_pose, 100)
        self.node.create_subscription(MapStatus, "/map_node/status", self._on_status, QoSProfile(
            depth=100, reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.TRANSIENT_LOCAL))
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()
        width, height = image_size
        frames = [np.roll(_texture(width, height), 6 * k, axis=1) for k in range(16)]
        if compressed:   # encoded once: the camera's encoder is not what is measured
            self._image = CompressedImage(format="rgb8; jpeg compressed bgr8")
            self._frames = [_jpeg(frame) for frame in frames]
        else:
            self._image = Image(height=height, width=width, encoding="rgb8", step=width * 3)
            self._frames = [frame.tobytes() for frame in frames]
        self._count = 0

    def _on_pose(self, msg) -> None:
        self.pose_at[_ns(msg.header.stamp)] = time.monotonic()

    def _on_status(self, msg) -> None:
        self.last_status = msg
        if msg.frames_processed:
            self.model_ms[_ns(msg.header.stamp)] = msg.model_ms

    def publish(self) -> None:
        stamp_ns = time.time_ns()
        self._image.header.stamp.sec, self._image.header.stamp.nanosec = divmod(stamp_ns, 10**9)
        self._image.data = self._frames[self._count % len(self._frames)]
        self._count += 1
        self.sent_at[stamp_ns] = time.monotonic()
        self.publisher.publish(self._image)

    def wait(self, condition, timeout: float):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.02)
        return False

    def settled(self) -> bool:
        s = self.last_status
        return bool(s) and s.frames_processed + s.frames_dropped + s.frames_rejected == s.frames_received

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=2)
        self.thread.join(5)
        self.node.destroy_node()
        self.context.try_shutdown()


def _texture(width: int = 640, height: int = 480) -> np.ndarray:
    import cv2

    small = (np.random.default_rng(0).random((60, 80, 3)) * 255).astype(np.uint8)
    return cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC)


def _jpeg(rgb: np.ndarray) -> bytes:
    import cv2

    ok, data = cv2.imencode(".jpg", rgb[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return data.tobytes()


def _ns(stamp) -> int:
    return stamp.sec * 10**9 + stamp.nanosec


def run_rate(probe: Probe, rate: float, seconds: float) -> dict:
    before = probe.last_status
    first = len(probe.sent_at)
    period, start = 1.0 / rate, time.monotonic()
    for k in range(max(1, round(rate * seconds))):
        delay = start + k * period - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        probe.publish()
    # Every frame is processed or dropped within a few model steps; the status then stops moving.
    probe.wait(lambda: probe.settled() and probe.last_status.frames_received - before.frames_received
               >= 0.9 * (len(probe.sent_at) - first), 10.0)
    time.sleep(0.5)   # let the last pose and status arrive (a bench, not a test)
    after = probe.last_status
    stamps = list(probe.sent_at)[first:]
    latency = [probe.pose_at[s] - probe.sent_at[s] for s in stamps if s in probe.pose_at]
    overhead = [probe.pose_at[s] - probe.sent_at[s] - probe.model_ms[s] / 1e3 for s in stamps
                if s in probe.pose_at and s in probe.model_ms]
    model = [probe.model_ms[s] for s in stamps if s in probe.model_ms]
    return {"rate": rate, "sent": len(stamps),
            "received": after.frames_received - before.frames_received,
            "processed": after.frames_processed - before.frames_processed,
            "dropped": after.frames_dropped - before.frames_dropped,
            "latency_ms": 1e3 * float(np.median(latency)) if latency else float("nan"),
            "model_ms": float(np.median(model)) if model else float("nan"),
            "overhead_ms": 1e3 * float(np.median(overhead)) if overhead else float("nan"),
            "latencies_ms": [1e3 * float(x) for x in latency]}


def describe(args) -> str:
    """The table's title line; the default run keeps its original wording."""
    fixture = (args.checkpoint == str(args.fixture / "ckpt.pt")
               and args.model_config == str(args.fixture / "config.json"))
    model = "tiny fixture" if fixture else (
        f"model {args.model_config}, {'random weights' if args.checkpoint is None else args.checkpoint}")
    device = "CPU" if args.device == "cpu" else args.device
    width, height = args.image_size
    settings = ("" if (args.num_scale_frames, args.window) == (3, 8) else
                f", {args.num_scale_frames} scale frames, window {args.window}")
    extra = "".join(f", {p}" for p in args.param)
    delivery = "reliable, every frame queued" if every_frame(args) else "best effort, newest frame wins"
    return (f"map_node, {model} on {device} ({args.threads} torch thread), input width "
            f"{args.image_width}{settings}{extra}, {width}x{height} "
            f"{'rgb8' if args.transport == 'raw' else 'JPEG (CompressedImage)'} {delivery}")


def every_frame(args) -> bool:
    """Whether the node runs with process_all_frames (then the bench publishes reliably)."""
    return any(p.replace(" ", "").lower() == "process_all_frames:=true" for p in args.param)


def main() -> int:
    args = parse_args()
    if args.checkpoint and not Path(args.checkpoint).exists():
        if args.checkpoint == str(args.fixture / "ckpt.pt"):
            print(f"fixture checkpoint not found under {args.fixture}", file=sys.stderr)
        else:
            print(f"checkpoint {args.checkpoint} not found", file=sys.stderr)
        return 2
    if args.model_config.endswith(".json") and not Path(args.model_config).exists():
        print(f"model config {args.model_config} not found", file=sys.stderr)
        return 2
    domain = 60 + os.getpid() % 30
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
               FASTDDS_DEFAULT_PROFILES_FILE=str(REPO / "config" / "fastdds.xml"),
               OMP_NUM_THREADS=str(args.threads))
    os.environ["FASTDDS_DEFAULT_PROFILES_FILE"] = env["FASTDDS_DEFAULT_PROFILES_FILE"]
    node = start_node(args, env)
    probe = Probe(domain, args.image_size, args.transport, reliable=every_frame(args))
    try:
        up = probe.wait(lambda: node.poll() is not None or probe.incompatible or (
            probe.publisher.get_subscription_count() and probe.last_status), args.startup_timeout)
        if probe.incompatible:   # else the wait above would run to its timeout
            print(f"the node's image subscription refuses this bench's publisher ({probe.incompatible})",
                  file=sys.stderr)
            return 1
        if not up or node.poll() is not None:
            exited = f" (it exited with code {node.returncode})" if node.poll() is not None else ""
            print(f"the node did not come up{exited}", file=sys.stderr)
            return 1
        # Warm-up: the scale frames (batched poses) and the first window fill are not timed.
        run_rate(probe, 2.0, max(3.0, (args.num_scale_frames + 3) / 2.0))
        rows = [run_rate(probe, rate, args.seconds) for rate in args.rates]
    finally:
        probe.close()
        node.terminate()
        node.wait(20)
    print(f"\n{describe(args)}\n")
    # received < sent: lost in transport (or not yet delivered when the rate's window closed).
    print("| input Hz | sent | received | processed | dropped | e2e latency p50 ms | model p50 ms | e2e - model p50 ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['rate']:g} | {r['sent']} | {r['received']} | {r['processed']} | {r['dropped']} | "
              f"{r['latency_ms']:.1f} | {r['model_ms']:.1f} | {r['overhead_ms']:.1f} |")
    sustained = [r["rate"] for r in rows if r["dropped"] == 0 and r["processed"] == r["sent"]]
    print(f"\nhighest rate with every frame processed and none dropped: "
          f"{max(sustained) if sustained else 'none of those tried'} Hz")
    if args.out is not None:
        write_results(args.out, describe(args), rows)
    return 0


def write_results(folder: Path, title: str, rows: list[dict]) -> None:
    """latency.json, and its histogram beside it where matplotlib (the bench extra) is installed."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    result = {"title": title, "command": " ".join(sys.argv),
              "rows": [{k: v for k, v in r.items() if k != "latencies_ms"} for r in rows],
              "latencies_ms": {f"{r['rate']:g} Hz": r["latencies_ms"] for r in rows}}
    path = folder / "latency.json"
    path.write_text(json.dumps(result, indent=1))
    print(path)
    try:
        import plots
    except ImportError as error:
        print(f"no plot ({error}): pip install '.[bench]', then python bench/plots.py latency {path}")
        return
    print(plots.latency_histogram(result["latencies_ms"], folder / "latency.png", title))


if __name__ == "__main__":
    sys.exit(main())
