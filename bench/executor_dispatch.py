"""What rclpy's MultiThreadedExecutor costs beside Python work, against lingbot_ros.ros.executor.

A subscription (keep-last 1, its own callback group, 2 ms of work per message) receives 30 Hz
messages from another node of the process while ``--busy`` threads do Python work in bursts (as
the node's worker, output and map threads do). Per executor: callbacks and the pool submissions
they took, the spinning thread's CPU time, publish-to-callback latency, and the busy threads'
progress (the GIL share the rest of the node keeps).

  python bench/executor_dispatch.py                # 0 and 2 busy threads, 10 s each
  python bench/executor_dispatch.py --busy 4 --seconds 5
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run(kind: str, busy: int, seconds: float, rate: float) -> dict:
    import rclpy
    from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
    from rclpy.context import Context
    from rclpy.executors import MultiThreadedExecutor
    from std_msgs.msg import Header

    from lingbot_ros.ros.executor import PoolExecutor

    context = Context()
    rclpy.init(context=context)
    sub_node = rclpy.create_node("dispatch_sub", context=context)
    pub_node = rclpy.create_node("dispatch_pub", context=context)
    latencies: list[float] = []

    def on_message(msg) -> None:
        latencies.append(time.time() - (msg.stamp.sec + msg.stamp.nanosec * 1e-9))
        time.sleep(0.002)

    sub_node.create_subscription(Header, "/dispatch", on_message, 1,
                                 callback_group=MutuallyExclusiveCallbackGroup())
    publisher = pub_node.create_publisher(Header, "/dispatch", 1)
    executor = (PoolExecutor if kind == "pool" else MultiThreadedExecutor)(4, context=context)
    executor.add_node(sub_node)
    submissions = [0]
    submit = executor._executor.submit

    def counted(*args, **kwargs):
        submissions[0] += 1
        return submit(*args, **kwargs)

    executor._executor.submit = counted
    stop = threading.Event()
    progress = [0] * busy

    def work(k: int) -> None:
        while not stop.is_set():
            total = 0
            for i in range(20_000):
                total += i
            progress[k] += 1
            time.sleep(0.001)

    spin_cpu = [0.0]

    def spin() -> None:
        while not stop.is_set():
            executor.spin_once(timeout_sec=0.1)
        spin_cpu[0] = time.thread_time()

    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(busy)]
    threads.append(threading.Thread(target=spin, daemon=True))
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    before, sent = sum(progress), 0
    latencies.clear()
    submissions[0] = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        msg = Header()
        msg.stamp.sec, msg.stamp.nanosec = divmod(time.time_ns(), 10**9)
        publisher.publish(msg)
        sent += 1
        time.sleep(max(0.0, start + sent / rate - time.monotonic()))
    time.sleep(0.3)
    work_done = sum(progress) - before
    stop.set()
    for thread in threads:
        thread.join(2.0)
    executor.shutdown(timeout_sec=2.0)
    rclpy.shutdown(context=context)
    latencies.sort()
    pick = lambda q: 1e3 * latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else float("nan")
    return {"executor": kind, "busy": busy, "sent": sent, "callbacks": len(latencies),
            "submissions": submissions[0], "spin_cpu_s": spin_cpu[0], "p50_ms": pick(0.5), "p99_ms": pick(0.99),
            "work_per_s": work_done / seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 2], help="threads of Python work")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=30.0)
    args = parser.parse_args()
    print("| executor | busy threads | sent | callbacks | pool submissions | spinning thread CPU s | "
          "latency p50 / p99 ms | busy threads' work bursts/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for busy in args.busy:
        for kind in ("rclpy", "pool"):
            r = run(kind, busy, args.seconds, args.rate)
            name = "rclpy MultiThreadedExecutor" if kind == "rclpy" else "lingbot_ros PoolExecutor"
            print(f"| {name} | {busy} | {r['sent']} | {r['callbacks']} | {r['submissions']} | "
                  f"{r['spin_cpu_s']:.2f} | {r['p50_ms']:.2f} / {r['p99_ms']:.2f} | {r['work_per_s']:.0f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
