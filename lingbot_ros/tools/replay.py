"""lingbot-ros-replay: publish rosbag2s (mcap or sqlite3) with their original timing, without ROS.

  lingbot-ros-replay BAG [--rate 2] [--loop] [--start 5] [--duration 10] \
      [--remap /camera/image_raw/compressed:=/map_node/image/compressed] [--clock] \
      [--qos-override /tf_static:=latched] [--hold 30] [--wait-for-node /map_node --max-lead 10] \
      [--wait-for-subscribers 30 --subscriber /map_node]
  lingbot-ros-replay BAG_A BAG_B --camera front --camera rear [--node /map_node]   # a camera rig
  lingbot-ros-replay BAG --camera front:=/front/image_raw --camera rear:=/rear/image_raw

Messages are published as the bag's raw CDR bytes (no deserialisation), each at
``wall_start + (t - t_first) / rate``, t being the bag's receive time. With --clock, /clock
(rosgraph_msgs/Clock) carries the bag time, for nodes run with use_sim_time. ``ros2 bag play``
is not available from PyPI; this covers what the node's tests, demos and benchmarks need.

Each topic is offered the QoS it was recorded with (see replay_qos.py), else --qos;
--qos-override forces a preset. Latched (transient-local) messages reach late subscribers only
while the player runs: --hold keeps it alive after the last message. --wait-for-node holds the
images back while the node has more than --max-lead of them unaccounted for (replay_pacing.py);
the playback clock pauses meanwhile.

Several bags play as one, merged in receive-time order; --camera gives each camera of a rig node
(``cameras:=[front, rear]``) its image topic, published as ``<node>/<name>/image[/compressed]``
(replay_inputs.py).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import sys
import time

import rclpy
from rclpy.duration import Duration
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import HistoryPolicy, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions
from rosbags.rosbag2 import Reader
from rosgraph_msgs.msg import Clock

from lingbot_ros.process import interrupts
from lingbot_ros.ros.spinning import BackgroundSpin
from lingbot_ros.tools.command_line import Parser
from lingbot_ros.tools.replay_inputs import apart, bag_folder, choose_tracks, merged_messages, parse_cameras
from lingbot_ros.tools.replay_pacing import IMAGE_TYPES, NodeNotKeepingUpError, NodePacing
from lingbot_ros.tools.replay_progress import PlaybackProgress
from lingbot_ros.tools.replay_qos import PRESETS, describe, parse_overrides, preset, recorded_profile
from lingbot_ros.tools.replay_wait import wait_for_subscribers

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
    parser = Parser(prog="lingbot-ros-replay", description=__doc__.split("\n")[0])
    parser.add_argument("bag", nargs="+", help="rosbag2 directory (or its .mcap / .db3 file); several play "
                                               "together, merged in receive-time order")
    parser.add_argument("--rate", type=float, default=1.0, help="playback speed factor (default 1)")
    parser.add_argument("--loop", action="store_true", help="start again at the end")
    parser.add_argument("--start", type=float, default=0.0, help="skip the first S seconds")
    parser.add_argument("--duration", type=float, default=None, help="play only S seconds")
    parser.add_argument("--topics", nargs="*", default=None, help="only these topics (default: all), besides --camera's")
    parser.add_argument("--remap", action="append", default=[], metavar="OLD:=NEW",
                        help="publish topic OLD as NEW (repeatable)")
    parser.add_argument("--camera", action="append", default=[], metavar="NAME[:=TOPIC]",
                        help="publish an image topic for camera NAME of a rig node (cameras:=[NAME, ...]) as "
                             "<node>/NAME/image (/compressed for a compressed topic), and the camera_info "
                             "recorded beside it as <node>/NAME/camera_info: with several bags the "
                             "i-th --camera takes the i-th bag's image topic (TOPIC names it where the bag has "
                             "several); with one bag each names its TOPIC (repeatable)")
    parser.add_argument("--node", default=None,
                        help="the rig node whose ~/NAME/image topics --camera publishes to (default: "
                             "--wait-for-node's node, else /map_node)")
    parser.add_argument("--clock", action="store_true", help="publish /clock with the bag time")
    parser.add_argument("--qos", choices=PRESETS, default="reliable",
                        help="QoS of topics the bag recorded no QoS for (default reliable: matches "
                             "every volatile subscriber; latched = reliable + transient-local)")
    parser.add_argument("--qos-override", action="append", default=[], metavar="[TOPIC:=]PRESET",
                        help=f"offer PRESET ({', '.join(PRESETS)}) instead of the recorded QoS, "
                             "on TOPIC (the bag's name) or on every topic (repeatable)")
    parser.add_argument("--depth", type=int, default=10,
                        help="history depth of the reliable and latched presets (default 10)")
    parser.add_argument("--wait-for-subscribers", type=float, default=0.0, metavar="S",
                        help="wait up to S seconds until every topic (and /clock with --clock) has a "
                             "subscriber, or until each --subscriber is there")
    parser.add_argument("--subscriber", action="append", default=[], metavar="NODE|TOPIC",
                        help="with --wait-for-subscribers: wait for this node (e.g. /map_node: until it "
                             "subscribes to a played topic) or topic (until it has a subscriber) "
                             "instead of every topic (repeatable)")
    parser.add_argument("--hold", type=float, default=0.0, metavar="S",
                        help="keep the publishers alive S seconds after the last message, for "
                             "late subscribers of latched topics (inf: until Ctrl-C)")
    parser.add_argument("--wait-for-node", default=None, metavar="NODE",
                        help="pace the images by NODE's lingbot_ros/MapStatus on NODE/status "
                             "(e.g. /map_node): lossless replay for process_all_frames")
    parser.add_argument("--max-lead", type=int, default=10, metavar="N",
                        help="with --wait-for-node: at most N images unaccounted for (default 10)")
    parser.add_argument("--node-timeout", type=float, default=60.0, metavar="S",
                        help="with --wait-for-node: give up when NODE has no status or reads no "
                             "image topic after S seconds, or is silent S seconds while the player "
                             "waits for it (default 60)")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress output (default: a progress bar on a terminal, a line "
                             "every few seconds otherwise)")
    return parser


def _check_args(args) -> str | None:
    """The first usage error in ``args``, or None."""
    if args.rate <= 0:
        return "--rate must be > 0"
    if args.depth < 1:
        return "--depth must be >= 1"
    if args.hold < 0:
        return "--hold must be >= 0"
    if args.max_lead < 1:
        return "--max-lead must be >= 1 (the node must be allowed one image in flight)"
    if args.node_timeout <= 0:
        return "--node-timeout must be > 0"
    if args.subscriber and args.wait_for_subscribers <= 0:
        return "--subscriber needs --wait-for-subscribers S (how long to wait for it)"
    return None


def main(argv=None) -> int:
    return interrupts.run(_main, argv)


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    error = _check_args(args)
    if error is not None:
        print(f"lingbot-ros-replay: {error}", file=sys.stderr)
        return 2
    try:
        remaps = parse_remaps(args.remap)
        overrides = parse_overrides(args.qos_override)
        cameras = parse_cameras(args.camera)
    except ValueError as error:
        print(f"lingbot-ros-replay: {error}", file=sys.stderr)
        return 2
    bags = [bag_folder(arg) for arg in args.bag]
    for arg, bag in zip(args.bag, bags):
        if bag is None:
            print(f"lingbot-ros-replay: {arg} is not a rosbag2 (no metadata.yaml)", file=sys.stderr)
            return 2

    status_type = None
    if args.wait_for_node:
        try:
            from lingbot_ros.msg import MapStatus as status_type
        except ImportError:
            print("lingbot-ros-replay: --wait-for-node needs the lingbot_ros interfaces "
                  "(lingbot_ros.msg.MapStatus), which are not built: run scripts/setup.sh",
                  file=sys.stderr)
            return 2
    # Not sys.argv: rcl would read this tool's OLD:=NEW and TOPIC:=PRESET values as remap rules.
    rclpy.init(args=[], signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node("lingbot_replay", start_parameter_services=False)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    # Spins only the --wait-for-node status subscription; publishing stays on this thread.
    spinner = BackgroundSpin(executor, node.get_logger())
    try:
        with contextlib.ExitStack() as stack:
            readers = [stack.enter_context(Reader(bag)) for bag in bags]
            try:
                tracks = choose_tracks([reader.connections for reader in readers], cameras, remaps, args.topics,
                                       args.node or args.wait_for_node or "/map_node")
            except ValueError as error:
                print(f"lingbot-ros-replay: {error}", file=sys.stderr)
                return 2
            if not tracks:
                print(f"lingbot-ros-replay: no matching topics in {', '.join(map(str, bags))}", file=sys.stderr)
                return 2
            warning = apart(readers, [str(bag) for bag in bags])
            if warning:
                print(f"lingbot-ros-replay: warning: {warning}", file=sys.stderr, flush=True)
            publishers, clock_pub = _create_publishers(node, tracks, overrides, args, several=len(bags) > 1)
            pacer, paced_ids = None, frozenset()
            if status_type is not None:
                images = {t.key: t.topic for t in tracks if t.connection.msgtype in IMAGE_TYPES}
                if not images:
                    print("lingbot-ros-replay: --wait-for-node: none of the selected topics is "
                          "an image topic", file=sys.stderr)
                    return 2
                pacer = NodePacing(node, status_type, args.wait_for_node, args.max_lead,
                                   args.node_timeout)
                spinner.start()
                # Only the image topics the node reads are paced: others would never be counted.
                paced = pacer.paced_topics(node, {images[i]: publishers[i] for i in images})
                paced_ids = frozenset(i for i, topic in images.items() if topic in paced)
            # /clock counts too: a use_sim_time node that misses the first clock ticks stalls.
            waited = list(publishers.values()) + ([clock_pub] if clock_pub else [])
            if args.wait_for_subscribers > 0:
                missing = wait_for_subscribers(node, {p.topic_name: p for p in waited}, args.subscriber,
                                               args.wait_for_subscribers)
                if missing:
                    what = "not every --subscriber is there" if args.subscriber else "no subscriber on every topic"
                    print(f"lingbot-ros-replay: warning: {what} after {args.wait_for_subscribers:g} s "
                          f"({', '.join(missing)}); publishing anyway", file=sys.stderr, flush=True)
            t0 = min(reader.start_time for reader in readers) + round(args.start * 1e9)
            t_last = max(reader.end_time for reader in readers)
            t_end = t0 + round(args.duration * 1e9) if args.duration is not None else None
            count = 0
            while True:
                progress = PlaybackProgress(t0, min(t_end or t_last, t_last), enabled=not args.quiet)
                played = _play_once(readers, tracks, publishers, clock_pub, t0, t_end, args,
                                    pacer, paced_ids, progress)
                progress.close()
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
            if pacer is not None:
                pacer.wait_until_caught_up()
            if not args.quiet:
                print(f"lingbot-ros-replay: published {count} messages", flush=True)
                if pacer is not None:
                    print(f"lingbot-ros-replay: waited {pacer.waited_s:.2f} s in total for "
                          f"{pacer.target} to keep up", flush=True)
            _hold(args.hold, args.quiet)
    except NodeNotKeepingUpError as error:
        print(f"lingbot-ros-replay: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    finally:
        spinner.stop()   # before the node: one destroyed under a spinning executor aborts the process
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


def _create_publishers(node, tracks, overrides, args, several: bool):
    """One publisher per track (keyed by ``Track.key``), each with the QoS of ``_choose_qos``;
    and /clock's. ``several``: bags, each line names its bag."""
    publishers = {}
    for track in tracks:
        qos, source = _choose_qos(track.connection, overrides, args)
        if not args.quiet:
            origin = (f" (bag {track.bag + 1}: {track.connection.topic})" if several else
                      f" ({track.connection.topic})" if track.camera else "")
            print(f"lingbot-ros-replay: {track.topic}: {describe(qos)} ({source}){origin}", flush=True)
        publishers[track.key] = node.create_publisher(message_class(track.connection.msgtype), track.topic, qos)
    clock_pub = node.create_publisher(Clock, "/clock", 10) if args.clock else None
    return publishers, clock_pub


def _choose_qos(connection, overrides, args):
    """(profile, where it came from): an override, else the recorded offers, else --qos; image
    topics paced by --wait-for-node are made reliable keep-all, so no image is overwritten."""
    every, per_topic = overrides
    name = per_topic.get(connection.topic, every)
    if name is not None:
        return preset(name, args.depth), f"--qos-override {name}"
    fallback = preset(args.qos, args.depth)
    offers = connection.ext.offered_qos_profiles
    qos = recorded_profile(offers, fallback)
    if qos is None:
        qos, source = fallback, f"--qos {args.qos}: none recorded"
    else:
        source = "recorded" if len(offers) == 1 else f"recorded by {len(offers)} publishers"
    if args.wait_for_node and connection.msgtype in IMAGE_TYPES:
        qos.reliability, qos.history = ReliabilityPolicy.RELIABLE, HistoryPolicy.KEEP_ALL
        source += ", reliable keep_all for --wait-for-node"
    return qos, source


def _hold(hold_s: float, quiet: bool) -> None:
    """Keep the publishers (and what latched topics hold) alive; Ctrl-C ends it early."""
    if hold_s <= 0:
        return
    if not quiet:
        forever = "until interrupted" if math.isinf(hold_s) else f"for {hold_s:g} s"
        print(f"lingbot-ros-replay: holding the publishers {forever}", flush=True)
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        time.sleep(min(1.0, deadline - time.monotonic()))


def _publish_clock(clock_pub, bag_ns: int) -> None:
    msg = Clock()
    msg.clock.sec, msg.clock.nanosec = divmod(bag_ns, 10**9)
    clock_pub.publish(msg)


def _play_once(readers, tracks, publishers, clock_pub, t0, t_end, args, pacer, paced_ids, progress) -> int:
    wall0 = time.monotonic()
    count = 0
    for track, timestamp, rawdata in merged_messages(readers, tracks, t0, t_end):
        due = wall0 + (timestamp - t0) / 1e9 / args.rate
        while True:
            remaining = due - time.monotonic()
            if remaining <= 0:
                break
            if clock_pub is not None:
                now_bag = t0 + int((time.monotonic() - wall0) * args.rate * 1e9)
                _publish_clock(clock_pub, min(now_bag, timestamp))
            time.sleep(min(remaining, CLOCK_PERIOD_S) if clock_pub else remaining)
        paced = track.key in paced_ids
        if paced:
            # The playback clock stands still while the node catches up: the rest of the
            # schedule moves by the wait, so /clock resumes where it stopped.
            wall0 += pacer.before_image()
        if clock_pub is not None:
            _publish_clock(clock_pub, timestamp)
        publishers[track.key].publish(bytes(rawdata))
        if paced:
            pacer.image_published()
        progress.published(timestamp)
        count += 1
    return count


if __name__ == "__main__":
    sys.exit(main())
