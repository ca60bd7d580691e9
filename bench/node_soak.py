"""Soak: map_node as a subprocess (tiny fixture model, CPU) fed a long stream through DDS with
process_all_frames and reliable QoS, paced by its ~/status (at most --max-lead frames ahead).

Every --every frames it records the node's resident memory (VmRSS of the process), received /
processed / dropped frames, the map's size and the window, and it checks at the end that every
frame sent was processed. Synthetic moving 160x120 rgb8 frames (a few hundred, cycled).

    python bench/node_soak.py                             # 20,000 frames, live default window
    python bench/node_soak.py --frames 2000 --every 200 --param window_size:=32
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))   # run from a checkout, installed or not

FIXTURE = Path(os.environ.get("LINGBOT_SHARED", REPO.parent / "shared")) / "fixtures" / "tiny_default"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=20_000)
    parser.add_argument("--every", type=int, default=1000, help="record every N frames")
    parser.add_argument("--max-lead", type=int, default=5)
    parser.add_argument("--param", action="append", default=[], help="extra node parameter NAME:=VALUE")
    parser.add_argument("--out", type=Path, default=Path("out/node_soak.json"))
    args = parser.parse_args(argv)

    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image

    from lingbot_ros.io.image_codec import fill_image
    from lingbot_ros.msg import MapStatus
    from lingbot_ros.ros.status import frames_accounted

    domain = 1 + os.getpid() % 100
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
               FASTDDS_DEFAULT_PROFILES_FILE=str(REPO / "config" / "fastdds.xml"), PYTHONUNBUFFERED="1")
    os.environ.update({k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE",
                                           "FASTDDS_DEFAULT_PROFILES_FILE")})
    params = [f"checkpoint:={FIXTURE / 'ckpt.pt'}", f"model_config:={FIXTURE / 'config.json'}", "device:=cpu",
              "image_width:=112", "num_scale_frames:=3", "scale_frames:=3", "sliding_window:=8",
              "process_all_frames:=true", "warmup:=false", "max_stamp_gap_s:=0.0", *args.param]
    command = [sys.executable, "-m", "lingbot_ros.ros.main", "--ros-args"]
    for p in params:
        command += ["-p", p]
    node = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    rclpy.init()
    probe = rclpy.create_node("soak_probe")
    latest: dict = {}
    probe.create_subscription(MapStatus, "/map_node/status", lambda m: latest.update(status=m),
                              QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                                         durability=DurabilityPolicy.TRANSIENT_LOCAL))
    publisher = probe.create_publisher(Image, "/map_node/image", QoSProfile(
        depth=50, reliability=ReliabilityPolicy.RELIABLE))
    executor = SingleThreadedExecutor()
    executor.add_node(probe)
    spin = threading.Thread(target=executor.spin, daemon=True)
    spin.start()
    rng = np.random.default_rng(0)
    base = (rng.random((120, 320, 3)) * 255).astype(np.uint8)
    images = [np.ascontiguousarray(np.roll(base, 2 * i, axis=1)[:, :160]) for i in range(150)]
    records, start = [], time.monotonic()
    try:
        while not publisher.get_subscription_count():
            if node.poll() is not None:
                raise RuntimeError("the node exited before subscribing")
            time.sleep(0.1)

        def accounted() -> int:
            s = latest.get("status")
            return 0 if s is None else frames_accounted(s)

        for i in range(args.frames):
            while i - accounted() > args.max_lead:
                if node.poll() is not None:
                    raise RuntimeError("the node exited")
                time.sleep(0.002)
            msg = fill_image(Image(), images[i % len(images)], "rgb8")
            stamp = 1_000_000_000 + i * 33_333_333
            msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp, 10**9)
            msg.header.frame_id = "camera_optical_frame"
            publisher.publish(msg)
            if (i + 1) % args.every == 0:
                s = latest["status"]
                records.append({"frames": i + 1, "rss_bytes": rss_bytes(node.pid), "received": s.frames_received,
                                "processed": s.frames_processed, "dropped": s.frames_dropped, "window": s.window, "map_points": s.map_points,
                                "seconds": round(time.monotonic() - start, 1)})
                print(json.dumps(records[-1]), flush=True)
        deadline = time.monotonic() + 120
        while accounted() < args.frames and time.monotonic() < deadline:
            time.sleep(0.05)
        final = latest["status"]
        summary = {"frames_sent": args.frames, "received": final.frames_received, "processed": final.frames_processed,
                   "dropped": final.frames_dropped, "rejected": final.frames_rejected, "failed": final.frames_failed,
                   "windows": final.window, "records": records, "params": params}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1))
        print(json.dumps({k: v for k, v in summary.items() if k not in ("records", "params")}))
        return 0 if final.frames_processed == args.frames else 1
    finally:
        node.send_signal(2)
        node.wait(30)
        executor.shutdown(timeout_sec=2)
        spin.join(5)
        probe.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())
