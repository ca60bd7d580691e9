"""lingbot-ros-camera: publish frames from a folder, video, camera device or a synthetic pattern.

  lingbot-ros-camera --source ../shared/data/courthouse_jpg --rate 10 --topic /camera/image_raw
  lingbot-ros-camera --source 0 --compressed          # OpenCV device 0, as <topic>/compressed jpeg
  lingbot-ros-camera --source synthetic:320x240 --frames 100

Images are stamped with the publishing time (as a live camera driver does), frame_id
``--frame-id``. Raw images go out as rgb8 on --topic; with --compressed, jpeg on <topic>/compressed.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time

from lingbot_ros.process import interrupts
from lingbot_ros.tools.command_line import Parser

DEFAULT_TOPIC = "/camera/image_raw"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="lingbot-ros-camera", description=__doc__.split("\n")[0])
    parser.add_argument("--source", default="synthetic",
                        help="image folder, video file, camera index (e.g. 0), or synthetic[:WxH]")
    parser.add_argument("--rate", type=float, default=10.0, help="frames per second (default 10)")
    parser.add_argument("--topic", default=DEFAULT_TOPIC, help=f"image topic (default {DEFAULT_TOPIC})")
    parser.add_argument("--frame-id", default="camera_optical_frame", help="header frame_id")
    parser.add_argument("--compressed", action="store_true", help="publish jpeg on <topic>/compressed")
    parser.add_argument("--frames", type=int, default=0, help="stop after N frames (0 = all / endless)")
    parser.add_argument("--loop", action="store_true", help="restart a folder or video at its end")
    parser.add_argument("--reliable", action="store_true",
                        help="reliable QoS (default: sensor data, best effort, as camera drivers)")
    return parser


def main(argv=None) -> int:
    return interrupts.run(_main, argv)


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    if args.rate <= 0:
        print("lingbot-ros-camera: --rate must be > 0", file=sys.stderr)
        return 2
    from lingbot_ros.io.sources import SourceError, open_source

    try:
        source = open_source(args.source, rate_hz=args.rate)
    except (SourceError, ValueError) as error:
        print(f"lingbot-ros-camera: {error}", file=sys.stderr)
        return 2

    import rclpy
    from rclpy.signals import SignalHandlerOptions
    from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
    from sensor_msgs.msg import CompressedImage, Image

    from lingbot_ros.io.image_codec import fill_compressed, fill_image

    rclpy.init(args=None, signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node("lingbot_camera")
    qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE) if args.reliable \
        else qos_profile_sensor_data
    msg_type, topic = (CompressedImage, args.topic + "/compressed") if args.compressed \
        else (Image, args.topic)
    publisher = node.create_publisher(msg_type, topic, qos)
    period = 1.0 / args.rate
    sent = 0
    try:
        while True:
            with contextlib.closing(iter(source)) as frames:
                for frame in frames:
                    msg = msg_type()
                    msg.header.stamp = node.get_clock().now().to_msg()
                    msg.header.frame_id = args.frame_id
                    if args.compressed:
                        fill_compressed(msg, frame.rgb)
                    else:
                        fill_image(msg, frame.rgb, "rgb8")
                    publisher.publish(msg)
                    sent += 1
                    if args.frames and sent >= args.frames:
                        return 0
                    time.sleep(max(0.0, period - (time.monotonic() % period)))
            if not args.loop or sent == 0:
                return 0
    except KeyboardInterrupt:
        return 0
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())
