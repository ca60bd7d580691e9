"""The depth head's transient memory for phase 1's batch: all frames at once against
`FrameCompute`'s DEPTH_HEAD_FRAMES at a time (released architecture, random head weights and
inputs; only the head runs, so it takes seconds on a CPU).

    python bench/depth_head_memory.py                    # CPU: peak RSS above the inputs, per run
    python bench/depth_head_memory.py --device cuda      # GPU: peak allocated above the inputs

Each chunk size runs in a process of its own (peak RSS never goes down).
"""
from __future__ import annotations

import argparse
import resource
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lingbot_ros.model import ModelConfig  # noqa: E402
from lingbot_ros.model.dpt_head import DPTHead  # noqa: E402
from lingbot_ros.stream.frame_compute import DEPTH_HEAD_FRAMES  # noqa: E402


def peak_gib(device: str, frames: int, chunk: int, height: int, width: int) -> float:
    torch.set_num_threads(1)
    cfg = ModelConfig.preset("lingbot-map")
    head = DPTHead(cfg).to(device).eval()
    tokens = cfg.num_special_tokens + (height // cfg.patch_size) * (width // cfg.patch_size)
    levels = [torch.randn(frames, tokens, cfg.camera_dim, dtype=torch.bfloat16, device=device) for _ in range(4)]
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with torch.no_grad():
        for i in range(0, frames, chunk):
            head([o[i:i + chunk].float() for o in levels], height, width)
    if cuda:
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**30
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base) / 2**30


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--frames", type=int, default=8, help="phase 1's batch (num_scale_frames)")
    parser.add_argument("--height", type=int, default=378)
    parser.add_argument("--width", type=int, default=518)
    parser.add_argument("--chunk", type=int, default=None, help=argparse.SUPPRESS)   # one run, in a child
    args = parser.parse_args()
    if args.chunk is not None:
        print(peak_gib(args.device, args.frames, args.chunk, args.height, args.width))
        return 0
    print(f"| frames at once | peak above the inputs GiB ({args.device}, {args.frames} frames, "
          f"{args.width}x{args.height}) |\n| --- | --- |")
    for chunk in sorted({args.frames, DEPTH_HEAD_FRAMES}, reverse=True):
        out = subprocess.run([sys.executable, __file__, "--device", args.device, "--frames", str(args.frames),
                              "--height", str(args.height), "--width", str(args.width), "--chunk", str(chunk)],
                             capture_output=True, text=True, check=True).stdout
        print(f"| {chunk} | {float(out):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
