"""Fast DDS alone, no node: how many camera-sized images one process receives from another.

The node's own input on the GPU machine lost 20-89% of its frames in transport while the same
command lost none on the development machine (bench/README.md, "Node latency on the GPU
machine"). This separates the transport from the node: a subscriber process counts the images a
publisher process sends at a rate, per Fast DDS profile, with nothing else running.

Profiles: `repo` (config/fastdds.xml, what the node uses: 32 MB SHM + UDPv4), `shm` (the same
SHM segment alone), `udp` (UDPv4 alone, 4 MiB socket buffers), `builtin` (Fast DDS's defaults).

  python bench/dds_transport.py                          # 518x378 rgb8 at 30 Hz, 5 s, every profile
  python bench/dds_transport.py --profiles repo --size 640x480 --rate 60
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_SHM = """<transport_descriptor><transport_id>shm</transport_id><type>SHM</type>
<segment_size>33554432</segment_size></transport_descriptor>"""
_UDP = """<transport_descriptor><transport_id>udp</transport_id><type>UDPv4</type>
<sendBufferSize>4194304</sendBufferSize><receiveBufferSize>4194304</receiveBufferSize>
</transport_descriptor>"""


def _profile_xml(transports: list[str]) -> str:
    descriptors = "".join({"shm": _SHM, "udp": _UDP}[t] for t in transports)
    ids = "".join(f"<transport_id>{t}</transport_id>" for t in transports)
    return (f'<?xml version="1.0" encoding="UTF-8"?><profiles xmlns="http://www.eprosima.com">'
            f"<transport_descriptors>{descriptors}</transport_descriptors>"
            f'<participant profile_name="p" is_default_profile="true"><rtps><userTransports>{ids}'
            f"</userTransports><useBuiltinTransports>false</useBuiltinTransports></rtps>"
            f"</participant></profiles>")


def profile_env(name: str, folder: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("FASTDDS_DEFAULT_PROFILES_FILE", None)
    if name == "repo":
        env["FASTDDS_DEFAULT_PROFILES_FILE"] = str(REPO / "config" / "fastdds.xml")
    elif name in ("shm", "udp"):
        path = folder / f"{name}.xml"
        path.write_text(_profile_xml([name]))
        env["FASTDDS_DEFAULT_PROFILES_FILE"] = str(path)
    elif name != "builtin":
        raise SystemExit(f"unknown profile '{name}' (repo, shm, udp, builtin)")
    return env


def subscribe(seconds: float) -> None:
    """Child: count sensor-data images on /dds_probe/image for `seconds` after the first one."""
    import rclpy
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image

    rclpy.init()
    node = rclpy.create_node("dds_probe_sub")
    latencies: list[float] = []

    def on_image(msg) -> None:
        latencies.append(time.time() - (msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9))

    node.create_subscription(Image, "/dds_probe/image", on_image, qos_profile_sensor_data)
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rclpy.spin_once(node, timeout_sec=0.05)
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1e3 if latencies else float("nan")
    print(f"received {len(latencies)} p50_ms {p50:.1f}", flush=True)
    node.destroy_node()
    rclpy.shutdown()


def publish(size: tuple[int, int], rate: float, seconds: float) -> int:
    import numpy as np
    import rclpy
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image

    rclpy.init()
    node = rclpy.create_node("dds_probe_pub")
    publisher = node.create_publisher(Image, "/dds_probe/image", qos_profile_sensor_data)
    width, height = size
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (height, width, 3), dtype=np.uint8).tobytes() for _ in range(4)]
    msg = Image(height=height, width=width, encoding="rgb8", step=width * 3)
    deadline = time.monotonic() + 5.0   # discovery: until the subscriber has matched
    while publisher.get_subscription_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    sent = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        now = time.time_ns()
        msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(now, 10**9)
        msg.data = frames[sent % len(frames)]
        publisher.publish(msg)
        sent += 1
        time.sleep(max(0.0, start + sent / rate - time.monotonic()))
    node.destroy_node()
    rclpy.shutdown()
    return sent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profiles", nargs="+", default=["repo", "shm", "udp", "builtin"])
    parser.add_argument("--size", default="518x378", help="image WxH (rgb8)")
    parser.add_argument("--rate", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--subscriber", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.subscriber is not None:
        subscribe(args.subscriber)
        return 0
    width, height = (int(v) for v in args.size.lower().split("x"))
    print(f"{width}x{height} rgb8 ({width * height * 3 / 1e3:.0f} KB) at {args.rate:g} Hz for "
          f"{args.seconds:g} s, sensor-data QoS, two processes")
    print("| profile | sent | received | p50 ms |\n| --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.profiles:
            env = profile_env(name, Path(folder))
            child = subprocess.Popen([sys.executable, __file__, "--subscriber", str(args.seconds + 8)],
                                     env=env, stdout=subprocess.PIPE, text=True)
            child.stdout.readline()   # "ready"
            sent = subprocess.run(   # the publisher in its own process too, under the same profile
                [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import dds_transport as d;"
                 " print(d.publish((int(sys.argv[2]), int(sys.argv[3])), float(sys.argv[4]),"
                 " float(sys.argv[5])))", str(Path(__file__).parent), str(width), str(height),
                 str(args.rate), str(args.seconds)], env=env, capture_output=True, text=True)
            out, _ = child.communicate(timeout=args.seconds + 30)
            words = out.split()
            received = words[words.index("received") + 1] if "received" in words else "?"
            p50 = words[words.index("p50_ms") + 1] if "p50_ms" in words else "?"
            sent_n = sent.stdout.strip().splitlines()[-1] if sent.stdout.strip() else f"error: {sent.stderr[-200:]}"
            print(f"| {name} | {sent_n} | {received} | {p50} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
