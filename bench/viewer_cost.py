"""The live view's cost on the frame loop (lingbot_ros/viewer): its hook's time per frame at 30 Hz,
and what its drawing thread takes from the loop's own host work (the GIL), with browsers connected.

A Mapper (tiny fixture model, CPU) first maps the first ``--frames`` courthouse images; then the
frame loop is imitated at ``--rate-hz`` for ``--seconds``: each tick replays one of the recorded
outcomes through ``LiveView.update`` (a real map read, ``Mapper.view``, every MAP_REFRESH_S) and
then runs a fixed host workload standing in for the loop's own work. ``--clients`` websocket
clients in a process of their own take every scene update meanwhile (viser's own protocol, as a
browser's page does). The same ticks run once without the view: the workload's time with it
minus without is what the view's threads (drawing, viser's sending) take from the loop.

    python bench/viewer_cost.py                          # 60 frames at width 224, 20 s at 30 Hz
    python bench/viewer_cost.py --frames 200 --image-width 518 --point-budget 500000
    python bench/viewer_cost.py --path-poses 100000 1000000   # only the path's read at those lengths
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))   # run from a checkout, installed or not

SHARED = Path(os.environ.get("LINGBOT_SHARED", REPO.parent / "shared"))
FIXTURE = SHARED / "fixtures" / "tiny_default"


def _clients(port: int, count: int, stop, totals) -> None:
    """``count`` websocket clients taking every scene update until ``stop``; puts (messages, bytes)
    on ``totals``. Runs in a process of its own, as a browser does: decoding 100 MB of updates in
    the bench's process would hold its GIL and be counted as the view's cost."""
    import viser
    import websockets

    received = []

    async def one():
        async with websockets.connect(f"ws://127.0.0.1:{port}", subprotocols=[f"viser-v{viser.__version__}"],
                                      max_size=None) as connection:
            while not stop.is_set():
                try:
                    received.append(len(await asyncio.wait_for(connection.recv(), 0.2)))
                except asyncio.TimeoutError:
                    pass

    async def all_of_them():
        await asyncio.gather(*(one() for _ in range(count)))

    asyncio.run(all_of_them())
    totals.put((len(received), sum(received)))


def _workload(data: np.ndarray) -> None:
    """Host work of a frame loop: numpy and Python, ~ a few ms."""
    total = 0.0
    for row in data:
        total += float(row.sum())
    np.sort(data, axis=None)


def _ticks(args, outcomes, hook) -> tuple[list, list, list]:
    """(hook ms, workload ms, whether the hook asked for a map sample) per tick."""
    period = 1.0 / args.rate_hz
    data = np.random.default_rng(0).random((400, 512))
    hook_ms, work_ms, refreshed = [], [], []
    start = time.perf_counter()
    for tick in range(round(args.seconds * args.rate_hz)):
        due = start + tick * period
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        t0 = time.perf_counter()
        refreshed.append(hook is not None and hook(outcomes[tick % len(outcomes)]))
        t1 = time.perf_counter()
        _workload(data)
        t2 = time.perf_counter()
        hook_ms.append((t1 - t0) * 1e3)
        work_ms.append((t2 - t1) * 1e3)
    return hook_ms, work_ms, refreshed


def _path_read_ms(lengths: list[int]) -> dict:
    """The frame loop's read of the view's path (MapStore.view_path, POSE_BUDGET of them) from a
    trajectory of each length, the best of three."""
    from lingbot_ros.mapping.placement.conversion import MapConversion
    from lingbot_ros.mapping.store.map_store import MapStore
    from lingbot_ros.mapping.placement.metric_scale import MetricScale
    from lingbot_ros.viewer.live_view import POSE_BUDGET

    conversion = MapConversion(MetricScale(True, 2.0, 0.0, 10, ""), np.eye(4), np.ones(3), np.zeros(3))
    result = {}
    for length in lengths:
        store = MapStore(0.05, 10, length, recorder=None)
        for i in range(length):
            store.add_pose(i, i, np.eye(4))
        times = []
        for _ in range(3):
            start = time.perf_counter()
            store.view_path(conversion, POSE_BUDGET)
            times.append((time.perf_counter() - start) * 1e3)
        result[length] = min(times)
        store.close()
    return result


def _stats(values: list) -> dict:
    a = np.array(values)
    return {"median": float(np.median(a)), "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max()), "mean": float(a.mean())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--image-width", type=int, default=224)
    parser.add_argument("--rate-hz", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--point-budget", type=int, default=200_000)
    parser.add_argument("--out", type=Path, default=Path("out/viewer_cost.json"))
    parser.add_argument("--path-poses", type=int, nargs="+", metavar="N",
                        help="only time the path's read from trajectories of these lengths")
    args = parser.parse_args(argv)
    if args.path_poses:
        print(json.dumps({"path_read_ms": _path_read_ms(args.path_poses)}, indent=2))
        return 0

    import torch

    from lingbot_ros.io.sources import open_source
    from lingbot_ros.mapping import factory
    from lingbot_ros.mapping.mapper import Mapper
    from lingbot_ros.mapping.records import InputFrame
    from lingbot_ros.mapping.settings import MapperSettings
    from lingbot_ros.viewer.live_view import LiveView

    torch.set_num_threads(1)
    settings = MapperSettings(checkpoint=str(FIXTURE / "ckpt.pt"), model_config=str(FIXTURE / "config.json"),
                              device="cpu", image_width=args.image_width, warmup=False, map_points_stride=1,
                              min_confidence=0.0, map_voxel_size_m=0.002, long_run_policy="reset")
    mapper = Mapper(settings, factory.build(settings))
    outcomes = []
    for item in open_source(str(SHARED / "data" / "courthouse_jpg"), rate_hz=30.0):
        outcome = mapper.process(InputFrame(rgb=item.rgb, stamp_ns=item.stamp_ns))
        if outcome.new:
            outcomes.append(outcome)
        if len(outcomes) + settings.num_scale_frames > args.frames:
            break
    map_points = mapper.snapshot.map_points
    print(f"map: {map_points} points, {len(outcomes)} outcomes to replay", file=sys.stderr)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    viewer = LiveView(port, args.point_budget)
    spawn = multiprocessing.get_context("spawn")
    stop, totals = spawn.Event(), spawn.Queue()
    clients = spawn.Process(target=_clients, args=(port, args.clients, stop, totals), daemon=True)
    clients.start()
    time.sleep(1.0)
    views = []   # the ticks whose update asked the Mapper for a map sample (every MAP_REFRESH_S)
    view = mapper.view
    mapper.view = lambda *budgets: views.append(1) or view(*budgets)

    def hook(outcome) -> bool:
        before = len(views)
        viewer.update(mapper, outcome)
        return len(views) > before

    try:
        hook_ms, work_with, refreshed = _ticks(args, outcomes, hook)
        viewer.settle(30.0)
    finally:
        stop.set()
        messages, received = totals.get(timeout=30.0)
        clients.join(5.0)
        viewer.close()
    _, work_without, _ = _ticks(args, outcomes, None)
    mapper.close()
    result = {
        "command": "python bench/viewer_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "map_points": map_points, "point_budget": args.point_budget, "rate_hz": args.rate_hz,
        "ticks": len(hook_ms), "clients": args.clients, "client_messages": messages,
        "client_mb": received / 1e6, "hook_ms": _stats(hook_ms),
        "hook_ms_map_sample_ticks": _stats([ms for ms, r in zip(hook_ms, refreshed) if r]),
        "workload_ms_with_view": _stats(work_with), "workload_ms_without_view": _stats(work_without),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
