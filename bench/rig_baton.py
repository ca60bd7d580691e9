"""What the rig's baton (mapping/rig/baton.py) costs per round, apart from the model.

The RigMapper runs each camera's Mapper verb in a worker thread of its own and batches their model
steps: every round hands the baton to each camera's thread in turn (two semaphore hand-overs per
camera) and runs one batched step. This measures the hand-overs alone: a session whose step
returns at once, N cameras whose verb is one step (a group of frames past phase 1), on the CPU.

    python bench/rig_baton.py                    # N = 1, 2, 4, 8; 2000 rounds each
    python bench/rig_baton.py --cameras 4 --rounds 500
"""
from __future__ import annotations

import argparse
import statistics
import time

from lingbot_ros.mapping.rig.baton import Baton
from lingbot_ros.mapping.rig.session_view import StreamView


class InstantSession:
    """A MultiStreamSession's step that returns at once (no model)."""

    def step(self, frames):
        return {frame.stream: [] for frame in frames}


def per_round_us(cameras: int, rounds: int) -> float:
    baton = Baton(InstantSession(), [f"cam{i}" for i in range(cameras)])
    views = [StreamView(baton, stream) for stream in range(cameras)]
    try:
        jobs = {stream: (lambda view=view: view.step(None)) for stream, view in enumerate(views)}
        for _ in range(50):   # threads started and scheduled once
            baton.run(jobs)
        start = time.perf_counter()
        for _ in range(rounds):
            baton.run(jobs)
        return (time.perf_counter() - start) / rounds * 1e6
    finally:
        baton.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cameras", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("| cameras | per round (us), median of repeats | per camera (us) |\n| --- | --- | --- |")
    for n in args.cameras:
        us = statistics.median(per_round_us(n, args.rounds) for _ in range(args.repeats))
        print(f"| {n} | {us:.0f} | {us / n:.0f} |")


if __name__ == "__main__":
    main()
