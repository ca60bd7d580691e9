"""Side inputs must not starve the image path: frames processed and node CPU with and without a
flood of odometry (1 kHz on ~/odometry_in) and /tf (1,000 messages/s of another robot's frames).

One map_node subprocess (tiny fixture checkpoint on CPU, input width 112, tf_mode map_to_odom so
the TF conflict watch reads /tf, newest-frame-wins input); this process publishes 128x96 rgb8
images at --rate for --seconds, first alone, then again while a second process (this script with
--flood) publishes the side inputs. Per phase it prints images sent, frames processed (from
~/status) and the node's CPU time over the phase (/proc/PID/stat, user + system).

  python bench/side_input_flood.py                     # 10 Hz, 20 s per phase
  python bench/side_input_flood.py --rate 5 --seconds 30
  python bench/side_input_flood.py --device cuda --model-config lingbot-map --image-width 518 --rate 20   # GPU

With ``--device cuda`` the node runs that model with random weights (no checkpoint) on the GPU,
where the model step waits on the device instead of holding a core, as on a robot.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURE = Path(os.environ.get("LINGBOT_SHARED", REPO.parent / "shared")) / "fixtures" / "tiny_default"


def flood(seconds: float, side: str) -> None:
    """Odometry at 1 kHz (odom -> base_link) and /tf at 1,000 messages/s of robot2's frames
    (``side``: both, odometry or tf)."""
    import rclpy
    from geometry_msgs.msg import TransformStamped
    from nav_msgs.msg import Odometry
    from tf2_msgs.msg import TFMessage

    rclpy.init()
    node = rclpy.create_node("flood")
    odometry = node.create_publisher(Odometry, "/map_node/odometry_in", 100)
    tf = node.create_publisher(TFMessage, "/tf", 100)
    odom_msg, tf_msg = Odometry(), TFMessage(transforms=[TransformStamped()])
    odom_msg.header.frame_id, odom_msg.child_frame_id = "odom", "base_link"
    odom_msg.pose.pose.orientation.w = 1.0
    foreign = tf_msg.transforms[0]
    foreign.header.frame_id, foreign.child_frame_id = "robot2/odom", "robot2/base_link"
    foreign.transform.rotation.w = 1.0
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < seconds:
        now = node.get_clock().now().to_msg()
        odom_msg.header.stamp = foreign.header.stamp = now
        if side != "tf":
            odometry.publish(odom_msg)
        if side != "odometry":
            tf.publish(tf_msg)
        sent += 1
        time.sleep(max(0.0, start + sent / 1000.0 - time.monotonic()))
    print(f"flood ({side}): {sent / (time.monotonic() - start):.0f} messages/s each", flush=True)
    node.destroy_node()
    rclpy.shutdown()


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--flood-nice", type=int, default=0,
                        help="niceness of the flooding process (19: it takes only CPU the node leaves)")
    parser.add_argument("--side", choices=("both", "odometry", "tf"), default="both",
                        help="which side inputs flood (default both)")
    parser.add_argument("--device", default="cpu", help="the node's device (cuda: random weights of --model-config)")
    parser.add_argument("--model-config", default=None, help="with --device cuda: a preset (default tiny)")
    parser.add_argument("--image-width", type=int, default=112)
    parser.add_argument("--repeat", type=int, default=1,
                        help="pairs of phases (without, with), alternating, so that drift shows")
    parser.add_argument("--flood", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.flood is not None:
        flood(args.flood, args.side)
        return 0

    import numpy as np
    import rclpy
    from sensor_msgs.msg import Image

    from lingbot_ros.io.image_codec import fill_image
    from lingbot_ros.msg import MapStatus

    model = ([f"checkpoint:={FIXTURE / 'ckpt.pt'}", f"model_config:={FIXTURE / 'config.json'}",
              "num_scale_frames:=3", "sliding_window:=4", "warmup:=false"] if args.device == "cpu" else
             [f"model_config:={args.model_config or 'tiny'}", "warmup_image_size:=128x96"])
    params = model + [f"device:={args.device}", f"image_width:={args.image_width}", "tf_mode:=map_to_odom",
                      "max_stamp_gap_s:=0.0"]
    command = [sys.executable, "-m", "lingbot_ros.ros.main", "--ros-args"] + [a for p in params for a in ("-p", p)]
    # An isolated domain (as the tests' harness), one torch thread in the node (as node_latency.py).
    os.environ["ROS_DOMAIN_ID"] = str(1 + (os.getpid() + time.time_ns() // 10**6) % 100)
    os.environ.setdefault("FASTDDS_DEFAULT_PROFILES_FILE", str(REPO / "config" / "fastdds.xml"))
    node_proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 env=dict(os.environ, OMP_NUM_THREADS="1"))
    rclpy.init()
    probe = rclpy.create_node("bench_probe")
    statuses: list = []
    from rclpy.qos import DurabilityPolicy, QoSProfile
    probe.create_subscription(MapStatus, "/map_node/status", statuses.append,
                              QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL))
    images = probe.create_publisher(Image, "/map_node/image", 5)
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (12, 16, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1) for _ in range(16)]

    def spin_until(condition, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not condition():
            rclpy.spin_once(probe, timeout_sec=0.05)
        return condition()

    try:
        if not spin_until(lambda: images.get_subscription_count() and statuses, 120 if args.device == "cpu" else 400):
            print("the node did not come up", file=sys.stderr)
            return 1

        def phase(name: str, flooding: bool):
            flooder = subprocess.Popen(["nice", "-n", str(args.flood_nice), sys.executable, __file__, "--flood",
                                        str(args.seconds + 2), "--side", args.side], cwd=REPO) \
                if flooding else None
            if flooder is not None:
                spin_until(lambda: False, 2.0)   # the flood is running before the images start
            before, cpu0 = statuses[-1].frames_processed, cpu_s(node_proc.pid)
            start, sent = time.monotonic(), 0
            while time.monotonic() - start < args.seconds:
                msg = fill_image(Image(), frames[sent % len(frames)], "rgb8")
                msg.header.stamp, msg.header.frame_id = probe.get_clock().now().to_msg(), "cam"
                images.publish(msg)
                sent += 1
                spin_until(lambda: time.monotonic() >= start + sent / args.rate, 1.0 / args.rate + 1)
            spin_until(lambda: False, 2.0)   # the last frames finish
            processed, cpu = statuses[-1].frames_processed - before, cpu_s(node_proc.pid) - cpu0
            if flooder is not None:
                flooder.wait(30)
            status = statuses[-1]
            print(f"{name}: sent {sent} images, processed {processed}, node CPU {cpu:.1f} s over "
                  f"{args.seconds + 2:.0f} s ({100 * cpu / (args.seconds + 2):.0f}% of one core); odometry "
                  f"received {status.odometry_received}, refused {status.odometry_rejected}", flush=True)
            return processed

        quiet = flooded = 0
        for _ in range(args.repeat):
            pair = phase("without side inputs", False), phase(f"with the flood ({args.side})", True)
            print(f"frames processed with the flood: {100 * pair[1] / max(pair[0], 1):.1f}% of without", flush=True)
            quiet, flooded = quiet + pair[0], flooded + pair[1]
        if args.repeat > 1:
            print(f"all {args.repeat} pairs: {flooded} / {quiet} frames, {100 * flooded / max(quiet, 1):.1f}%", flush=True)
    finally:
        node_proc.send_signal(2)
        node_proc.wait(30)
        probe.destroy_node()
        rclpy.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
