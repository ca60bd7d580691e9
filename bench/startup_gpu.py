"""The node's start-up as a user meets it: a checkpoint file of the released size, the one-off
`lingbot-ros-prebuild`, then the node started twice (the first start after the prebuild, and a
restart), each timed from its process start to the first pose it publishes.

A camera publishes all along: the probe sends 518x378 images at 10 Hz from the moment the node
starts, so the first pose comes once the warm-up is done and the scale frames (phase 1) are in.
Per start: when the node loaded the model, finished its warm-up and went active (its log's
stamps), and when the first pose arrived. Before them, the model's loading part by part in a
fresh process (`--load-phases`: the imports, the model built on the device, the checkpoint
read and copied in, the matmul weights cast). The checkpoint is random weights of the released
architecture saved once (`--checkpoint`, default under /tmp, ~4.6 GB): it loads as a user's
`lingbot-map-long.pt` does (mmap, no random initialisation).

On the GPU machine, after `. bench/device/setup.sh` (the ROS bundle and FlashInfer; with
FlashInfer's modules prebuilt or not, as the machine is):

  python bench/startup_gpu.py                       # save the checkpoint, prebuild, two starts
  python bench/startup_gpu.py --skip-prebuild       # the two starts only
  python bench/startup_gpu.py --load-phases         # the loading part by part only
  python bench/startup_gpu.py --device cpu --model-config tiny --skip-prebuild   # smoke, no GPU
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

SIZE = "518x378"


def save_checkpoint(path: Path, model_config: str) -> float:
    """Random weights of the architecture, saved as {"model": state_dict}."""
    import torch

    from lingbot_ros.model import ModelConfig, build_model

    start = time.perf_counter()
    model = build_model(ModelConfig.preset(model_config), device="cpu", seed=0)
    tmp = path.with_name(path.name + ".partial")
    torch.save({"model": model.state_dict()}, tmp)
    os.replace(tmp, path)
    return time.perf_counter() - start


def prebuild(device: str, model_config: str) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "lingbot_ros.tools.prebuild", "--device", device,
                           "--model-config", model_config, "--warmup-image-size", SIZE,
                           "--image-width", "518", "--num-scale-frames", "8", "--sliding-window", "64"],
                          cwd=REPO, capture_output=True, text=True)
    phases = "; ".join(line.removeprefix("[prebuild] ") for line in done.stdout.splitlines() if ": " in line)
    if done.returncode != 0:
        raise SystemExit(f"prebuild failed ({done.returncode}): {done.stderr[-2000:]}")
    return time.perf_counter() - start, phases


def load_phases(checkpoint: Path, device: str, model_config: str) -> dict:
    """The model's loading part by part, in this process (run it in a fresh one: the imports
    count), seconds each, as factory.load_model does it."""
    times, start = {}, time.perf_counter()

    def lap(name: str) -> None:
        nonlocal start
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        now = time.perf_counter()
        times[name] = round(now - start, 2)
        start = now

    import torch
    lap("import torch")
    import rclpy  # noqa: F401
    lap("import rclpy")
    from lingbot_ros.mapping import factory
    from lingbot_ros.model import ModelConfig, build_model
    from lingbot_ros.model.checkpoint import load_checkpoint
    from lingbot_ros.ros import node  # noqa: F401
    lap("import lingbot_ros (the node's modules)")
    torch.zeros(1, device=device)
    lap("device context")
    model = build_model(ModelConfig.preset(model_config), device=device, random_init=False)
    lap("model built on the device (default init)")
    load_checkpoint(model, checkpoint)
    lap("checkpoint read (mmap) and copied in")
    settings = factory.MapperSettings(model_config=model_config, device=device)
    model.store_matmul_weights(factory.stream_settings(settings).compute_dtype(model.device))
    lap("matmul weights in the compute dtype")
    return times


def _log_seconds(log: Path, started_wall: float, pattern: str) -> float:
    """Seconds from the process start to the first log line matching ``pattern`` (rcutils stamps)."""
    for line in log.read_text(errors="replace").splitlines():
        if re.search(pattern, line):
            stamp = re.search(r"\[(\d+\.\d+)\]", line)
            if stamp:
                return float(stamp.group(1)) - started_wall
    return float("nan")


def one_start(checkpoint: Path, device: str, model_config: str, log: Path, timeout: float) -> dict:
    import node_latency   # not at the top: --load-phases times the imports in a fresh process
    args = node_latency.parse_args([
        "--device", device, "--model-config", model_config, "--checkpoint", str(checkpoint),
        "--image-width", "518", "--image-size", SIZE, "--num-scale-frames", "8", "--window", "64",
        "--node-log", str(log)])
    domain = 60 + os.getpid() % 30
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
               FASTDDS_DEFAULT_PROFILES_FILE=str(REPO / "config" / "fastdds.xml"), OMP_NUM_THREADS="1")
    os.environ["FASTDDS_DEFAULT_PROFILES_FILE"] = env["FASTDDS_DEFAULT_PROFILES_FILE"]
    probe = node_latency.Probe(domain, args.image_size, "raw")
    started_wall, started = time.time(), time.monotonic()
    node = node_latency.start_node(args, env)
    first_pose = float("nan")
    try:
        while time.monotonic() - started < timeout and node.poll() is None:
            probe.publish()
            if probe.pose_at:
                first_pose = min(probe.pose_at.values()) - started
                break
            time.sleep(0.1)
    finally:
        probe.close()
        node.terminate()
        node.wait(30)
    return {"loaded_s": _log_seconds(log, started_wall, r"loaded model"),
            "warmed_s": _log_seconds(log, started_wall, r"warm-up done"),
            "active_s": _log_seconds(log, started_wall, r"active: listening"),
            "first_pose_s": first_pose}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="checkpoint file (default: /tmp/lingbot_ros_random_<model-config>.pt, saved when absent)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model-config", default="lingbot-map", help="a preset")
    parser.add_argument("--skip-prebuild", action="store_true")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a start may take")
    parser.add_argument("--logs", type=Path, default=Path(os.environ.get("OUT", "/tmp")), help="node logs here")
    parser.add_argument("--load-phases", action="store_true", help="only the loading part by part")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)   # --load-phases' own run
    args = parser.parse_args()
    args.checkpoint = args.checkpoint or Path(f"/tmp/lingbot_ros_random_{args.model_config}.pt")
    if args.in_process:
        print(load_phases(args.checkpoint, args.device, args.model_config), flush=True)
        return 0
    if not args.checkpoint.exists():
        print(f"saving random weights of {args.model_config} to {args.checkpoint} ...", flush=True)
        print(f"saved in {save_checkpoint(args.checkpoint, args.model_config):.1f} s "
              f"({args.checkpoint.stat().st_size / 1e9:.2f} GB)", flush=True)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--in-process", "--checkpoint", str(args.checkpoint),
                           "--device", args.device, "--model-config", args.model_config],
                          cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"loading failed ({done.returncode}): {done.stderr[-2000:]}")
    print(f"loading part by part ({time.perf_counter() - started:.1f} s with the interpreter's start): "
          f"{done.stdout.strip()}", flush=True)
    if args.load_phases:
        return 0
    if not args.skip_prebuild:
        seconds, phases = prebuild(args.device, args.model_config)
        print(f"lingbot-ros-prebuild: {seconds:.1f} s ({phases})", flush=True)
    rows = []
    for name in ("first start after the prebuild", "restart"):
        row = one_start(args.checkpoint, args.device, args.model_config, args.logs / f"startup_{len(rows)}.log",
                        args.timeout)
        rows.append((name, row))
        print(f"{name}: {row}", flush=True)
    print("\n| start | model loaded s | warm-up done s | active s | first pose s |")
    print("| --- | --- | --- | --- | --- |")
    for name, r in rows:
        print(f"| {name} | {r['loaded_s']:.1f} | {r['warmed_s']:.1f} | {r['active_s']:.1f} | {r['first_pose_s']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
