"""lingbot-ros-node: run map_node until SIGINT or SIGTERM (the executable launch_ros starts)."""
from __future__ import annotations

import signal
import sys
import textwrap
import threading

import rclpy
from rclpy.exceptions import InvalidHandle
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.signals import SignalHandlerOptions

from lingbot_ros.ros.node import MapNode

USAGE = """usage: lingbot-ros-node [-h] [--ros-args -p NAME:=VALUE ... --params-file FILE -r FROM:=TO ...]

map_node: LingBot-Map streaming 3D reconstruction on a camera topic (a lifecycle node). It
configures and activates itself (autostart) and runs until SIGINT or SIGTERM. Parameters go after
--ros-args, as for every ROS 2 node:

  lingbot-ros-node --ros-args --params-file config/map.yaml -p checkpoint:=lingbot-map-long.pt \\
      -p device:=cuda -r /map_node/image:=/camera/image_raw

Parameters (name, default, meaning; config/map.yaml lists them too):
"""


def help_text(width: int = 100) -> str:
    """Usage and every parameter with its default and description, from the parameter list."""
    import json

    from lingbot_ros.ros import params

    lines = [USAGE]
    for name, field in params.FIELDS.items():
        default = field.default if isinstance(field.default, float) else json.dumps(field.default)
        lines.append(f"  {name} (default {default})")
        lines.extend(textwrap.wrap(params.descriptor(field).description, width, initial_indent=" " * 6,
                                   subsequent_indent=" " * 6))
    return "\n".join(lines) + "\n"


def main(args=None) -> int:
    """Run map_node until SIGINT or SIGTERM; exit 0 on either, in every lifecycle state."""
    own = (sys.argv if args is None else args)[1:]
    own = own[:own.index("--ros-args")] if "--ros-args" in own else own
    if "-h" in own or "--help" in own:
        print(help_text(), end="")
        return 0
    stop = threading.Event()
    starting = [True]

    def on_signal(signum, frame):
        stop.set()
        if starting[0]:   # interrupt a start-up that is still loading or warming up
            raise KeyboardInterrupt

    # Installed before anything ROS starts: rclpy's own handler would shut the context down under
    # the worker's feet (it then published into a dead context: a traceback at every Ctrl-C).
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    node = executor = None
    code = 0
    try:
        rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
        node = MapNode()
        executor = MultiThreadedExecutor(num_threads=4)
        executor.add_node(node)
        if node.get_parameter("autostart").value:
            if node.trigger_configure() != TransitionCallbackReturn.SUCCESS:
                node.get_logger().fatal(f"autostart: {node.configure_error or 'configure failed'}; exiting")
                code = 1
            elif node.trigger_activate() != TransitionCallbackReturn.SUCCESS:
                node.get_logger().fatal("autostart: activate failed (see above); exiting")
                code = 1
        starting[0] = False
        while code == 0 and not stop.is_set():
            try:
                executor.spin_once(timeout_sec=0.1)
            except InvalidHandle as error:
                # spin_once re-raises a callback's exception. This one means a transition destroyed
                # an entity that callback was using (a service answering as cleanup removes it):
                # the callback's work is moot, the node is fine.
                node.get_logger().debug(f"a callback met an entity destroyed by a transition: {error}")
            except Exception as error:   # a callback outside the safety net's guards (rclpy's own)
                node.safety.caught("executor", error)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        starting[0] = False
        if node is not None and node.worker is not None:
            node.worker.inbox.close()   # an image callback waiting for queue space returns
        if executor is not None:
            executor.shutdown(timeout_sec=5.0)   # waits for the callbacks still running
        if node is not None:
            node.release()   # the worker stops while the context is valid for its last publish
            node.destroy_node()
        rclpy.try_shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
