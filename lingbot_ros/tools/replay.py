"""lingbot-ros-replay: publish a rosbag2 (mcap or sqlite3) with its original timing, without ROS.

  lingbot-ros-replay BAG [--rate 2] [--loop] [--start 5] [--duration 10] \
      [--remap /camera/image_raw/compressed:=/map_node/image/compressed] [--clock]

Messages are published as the bag's raw CDR bytes (no deserialisation), each at
``wall_start + (t - t_first) / rate``, t being the bag's receive time. With --clock, /clock
(rosgraph_msgs/Clock) carries the bag time, for nodes run with use_sim_time. ``ros2 bag play``
is not available from PyPI; this covers what the node's tests, demos and benchmarks need.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

CLOCK_PERIOD_S = 0.01   # /clock is refreshed at 100 Hz while waiting for the next message
ACK_TIMEOUT_S = 10.0    # at the end, how long reliable subscribers get to acknowledge


def message_class(msgtype: str):
    """'sensor_msgs/msg/Image' -> the rclpy class (the package must be installed)."""
    package, kind, name = msgtype.split("/")
    return getattr(importlib.import_module(f"{package}.{kind}"), name)


def parse_remaps(items: list[str]) -> dict[str, str]:
    remaps = {}
    for item in items:
        source, sep, target = item.partition(":=")
        if not sep or not source or not target:
            raise ValueError(f"--remap expects OLD:=NEW, got '{item}'")
        remaps[source] = target
    return remaps


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lingbot-ros-replay", description=__doc__.split("\n")[0])
    parser.add_argument("bag", help="rosbag2 directory (or its .mcap / .db3 file)")
    parser.add_argument("--rate", type=float, default=1.0, help="playback speed factor (default 1)")
    parser.add_argument("--loop", action="store_true", help="start again at the end")
    parser.add_argument("--start", type=float, default=0.0, help="skip the first S seconds")
    parser.add_argument("--duration", type=float, default=None, help="play only S seconds")
    parser.add_argument("--topics", nargs="*", default=None, help="only these topics (default: all)")
    parser.add_argument("--remap", action="append", default=[], metavar="OLD:=NEW",
                        help="publish topic OLD as NEW (repeatable)")
    parser.add_argument("--clock", action="store_true", help="publish /clock with the bag time")
    parser.add_argument("--qos", choices=("reliable", "sensor_data"), default="reliable",
                        help="publisher QoS (default reliable: matches every subscriber)")
    parser.add_argument("--depth", type=int, default=10, help="publisher history depth")
    parser.add_argument("--wait-for-subscribers", type=float, default=0.0, metavar="S",
                        help="wait up to S seconds until every topic (and /clock with --clock) has a subscriber")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.rate <= 0:
        print("lingbot-ros-replay: --rate must be > 0", file=sys.stderr)
        return 2
    try:
        remaps = parse_remaps(args.remap)
    except ValueError as error:
        print(f"lingbot-ros-replay: {error}", file=sys.stderr)
        return 2
    bag = Path(args.bag)
    if bag.is_file():
        bag = bag.parent
    if not (bag / "metadata.yaml").exists():
        print(f"lingbot-ros-replay: {args.bag} is not a rosbag2 (no metadata.yaml)", file=sys.stderr)
        return 2

    import rclpy
    from rclpy.duration import Duration
    from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
    from rosbags.rosbag2 import Reader
    from rosgraph_msgs.msg import Clock

    rclpy.init(args=None)
    node = rclpy.create_node("lingbot_replay")
    qos = (QoSProfile(depth=args.depth, reliability=ReliabilityPolicy.RELIABLE)
           if args.qos == "reliable" else qos_profile_sensor_data)
    try:
        with Reader(bag) as reader:
            connections = [c for c in reader.connections
                           if args.topics is None or c.topic in args.topics]
            if not connections:
                print(f"lingbot-ros-replay: no matching topics in {bag}", file=sys.stderr)
                return 2
            publishers = {}
            for connection in connections:
                topic = remaps.get(connection.topic, connection.topic)
                publishers[connection.id] = node.create_publisher(
                    message_class(connection.msgtype), topic, qos)
            clock_pub = node.create_publisher(Clock, "/clock", 10) if args.clock else None
            # /clock counts too: a use_sim_time node that misses the first clock ticks stalls.
            waited = list(publishers.values()) + ([clock_pub] if clock_pub else [])
            if args.wait_for_subscribers > 0 and not _wait_for_subscribers(waited, args.wait_for_subscribers):
                print(f"lingbot-ros-replay: warning: no subscriber on every topic after "
                      f"{args.wait_for_subscribers:g} s; publishing anyway", file=sys.stderr, flush=True)
            t0 = reader.start_time + int(args.start * 1e9)
            t_end = t0 + int(args.duration * 1e9) if args.duration is not None else None
            count = 0
            while True:
                played = _play_once(reader, connections, publishers, clock_pub, t0, t_end, args)
                count += played
                if played == 0:
                    # Also ends --loop: an empty range would otherwise spin forever.
                    print("lingbot-ros-replay: no messages in the selected time range "
                          "(check --start / --duration)", file=sys.stderr)
                    return 2
                if not args.loop:
                    break
            # A reliable publisher destroyed right after its last publish can take the messages
            # still in flight with it: let every subscriber acknowledge them first.
            if not all(p.wait_for_all_acked(Duration(seconds=ACK_TIMEOUT_S)) for p in waited):
                print(f"lingbot-ros-replay: warning: not every subscriber acknowledged the last "
                      f"messages within {ACK_TIMEOUT_S:g} s", file=sys.stderr, flush=True)
            if not args.quiet:
                print(f"lingbot-ros-replay: published {count} messages", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


def _wait_for_subscribers(publishers, timeout_s: float) -> bool:
    """True once every publisher has a subscriber, False if ``timeout_s`` passed first."""
    deadline = time.monotonic() + timeout_s
    while not all(p.get_subscription_count() for p in publishers):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _publish_clock(clock_pub, bag_ns: int) -> None:
    from rosgraph_msgs.msg import Clock

    msg = Clock()
    msg.clock.sec, msg.clock.nanosec = divmod(bag_ns, 10**9)
    clock_pub.publish(msg)


def _play_once(reader, connections, publishers, clock_pub, t0, t_end, args) -> int:
    wall0 = time.monotonic()
    count = 0
    for connection, timestamp, rawdata in reader.messages(connections=connections, start=t0,
                                                          stop=t_end):
        due = wall0 + (timestamp - t0) / 1e9 / args.rate
        while True:
            remaining = due - time.monotonic()
            if remaining <= 0:
                break
            if clock_pub is not None:
                now_bag = t0 + int((time.monotonic() - wall0) * args.rate * 1e9)
                _publish_clock(clock_pub, min(now_bag, timestamp))
            time.sleep(min(remaining, CLOCK_PERIOD_S) if clock_pub else remaining)
        if clock_pub is not None:
            _publish_clock(clock_pub, timestamp)
        publishers[connection.id].publish(bytes(rawdata))
        count += 1
    return count


if __name__ == "__main__":
    sys.exit(main())
