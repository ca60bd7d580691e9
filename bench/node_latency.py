"""map_node end to end: latency from publish to ~/pose, minus the model step, and the highest input
rate the node sustains without dropping or queueing frames.

The node runs as a subprocess (tiny fixture checkpoint, CPU, newest-frame-wins input as deployed);
this process publishes 640x480 rgb8 images at increasing rates and listens on ~/pose and ~/status
(each status carries the model time of the frame it reports). Per rate it prints frames sent /
processed / dropped and the medians of end-to-end latency, model time and their difference (the
node's own overhead: transport, decode, preprocessing, output messages).

  python bench/node_latency.py                       # rates 2 4 8 16 24 32 Hz, 4 s each
  python bench/node_latency.py --rates 5 10 --seconds 6 --image-width 224
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
FIXTURE = REPO.parent / "shared" / "fixtures" / "tiny_default"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[2, 4, 8, 16, 24, 32])
    parser.add_argument("--seconds", type=float, default=4.0, help="publishing time per rate")
    parser.add_argument("--image-width", type=int, default=112, help="model input width")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in the node")
    parser.add_argument("--fixture", type=Path, default=FIXTURE)
    return parser.parse_args()


def start_node(args, env) -> subprocess.Popen:
    params = [f"checkpoint:={args.fixture / 'ckpt.pt'}", f"model_config:={args.fixture / 'config.json'}",
              "device:=cpu", f"image_width:={args.image_width}", "num_scale_frames:=3",
              "sliding_window:=8", "max_stamp_gap_s:=0.0", "map_publish_period_s:=0.0",
              "diagnostics_period_s:=1.0"]
    command = [sys.executable, "-m", "lingbot_ros.ros.node", "--ros-args"]
    for p in params:
        command += ["-p", p]
    return subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)


class Probe:
    def __init__(self, domain: int):
        import rclpy
        from geometry_msgs.msg import PoseStamped
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import (DurabilityPolicy, QoSProfile, ReliabilityPolicy,
                               qos_profile_sensor_data)
        from sensor_msgs.msg import Image

        from lingbot_ros.msg import MapStatus

        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain)
        self.node = rclpy.create_node("node_latency_bench", context=self.context)
        # As a camera driver publishes: best effort, keep last 1.
        self.publisher = self.node.create_publisher(Image, "/map_node/image", qos_profile_sensor_data)
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
        self._image = Image(height=480, width=640, encoding="rgb8", step=640 * 3)
        self._frames = [np.roll(_texture(), 6 * k, axis=1).tobytes() for k in range(16)]
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


def _texture() -> np.ndarray:
    import cv2

    small = (np.random.default_rng(0).random((60, 80, 3)) * 255).astype(np.uint8)
    return cv2.resize(small, (640, 480), interpolation=cv2.INTER_CUBIC)


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
            "overhead_ms": 1e3 * float(np.median(overhead)) if overhead else float("nan")}


def main() -> int:
    args = parse_args()
    if not (args.fixture / "ckpt.pt").exists():
        print(f"fixture checkpoint not found under {args.fixture}", file=sys.stderr)
        return 2
    domain = 60 + os.getpid() % 30
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
               FASTDDS_DEFAULT_PROFILES_FILE=str(REPO / "config" / "fastdds.xml"),
               OMP_NUM_THREADS=str(args.threads))
    os.environ["FASTDDS_DEFAULT_PROFILES_FILE"] = env["FASTDDS_DEFAULT_PROFILES_FILE"]
    node = start_node(args, env)
    probe = Probe(domain)
    try:
        if not probe.wait(lambda: probe.publisher.get_subscription_count() and probe.last_status, 60):
            print("the node did not come up", file=sys.stderr)
            return 1
        # Warm-up: the scale frames (batched poses) and the first window fill are not timed.
        run_rate(probe, 2.0, 3.0)
        rows = [run_rate(probe, rate, args.seconds) for rate in args.rates]
    finally:
        probe.close()
        node.terminate()
        node.wait(20)
    print(f"\nmap_node, tiny fixture on CPU ({args.threads} torch thread), input width "
          f"{args.image_width}, 640x480 rgb8 best effort, newest frame wins\n")
    print("| input Hz | sent | processed | dropped | e2e latency p50 ms | model p50 ms | e2e - model p50 ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['rate']:g} | {r['sent']} | {r['processed']} | {r['dropped']} | "
              f"{r['latency_ms']:.1f} | {r['model_ms']:.1f} | {r['overhead_ms']:.1f} |")
    sustained = [r["rate"] for r in rows if r["dropped"] == 0 and r["processed"] == r["sent"]]
    print(f"\nhighest rate with every frame processed and none dropped: "
          f"{max(sustained) if sustained else 'none of those tried'} Hz")
    return 0


if __name__ == "__main__":
    sys.exit(main())
