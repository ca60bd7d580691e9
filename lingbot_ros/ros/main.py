"""lingbot-ros-node: run map_node until SIGINT or SIGTERM (the executable launch_ros starts)."""
from __future__ import annotations

import sys
import textwrap

# Only what installs the signal handlers is imported here: rclpy, torch and the node load inside
# ``interrupts.run`` (seconds), so a Ctrl-C while they load is a clean stop, not a traceback.
from lingbot_ros.process import interrupts

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
    # The handlers are installed before anything ROS starts: rclpy's own would shut the context
    # down under the worker's feet (it then published into a dead context: a traceback at every
    # Ctrl-C). A signal during the start-up (loading, warming up) interrupts it.
    return interrupts.run(_run, args, "lingbot-ros-node")


def _run(args) -> int:
    with interrupts.importing():
        import rclpy
        from rclpy.executors import ExternalShutdownException, ShutdownException
        from rclpy.lifecycle import TransitionCallbackReturn
        from rclpy.signals import SignalHandlerOptions

        from lingbot_ros.ros.executor import PoolExecutor
        from lingbot_ros.ros.node import MapNode
        from lingbot_ros.ros.spinning import shut_down_executor, spin_once_guarded

    node = executor = None
    code = 0
    try:
        rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
        node = MapNode()
        executor = PoolExecutor(node.executor_threads())
        executor.add_node(node)
        if node.get_parameter("autostart").value:
            if node.trigger_configure() != TransitionCallbackReturn.SUCCESS:
                node.get_logger().fatal(f"autostart: {node.configure_error or 'configure failed'}; exiting")
                code = 1
            elif node.trigger_activate() != TransitionCallbackReturn.SUCCESS:
                node.get_logger().fatal("autostart: activate failed (see above); exiting")
                code = 1
        with interrupts.deferred():   # from here a signal ends the loop below, between callbacks
            while code == 0 and not interrupts.requested():
                spin_once_guarded(executor, node.get_logger(), lambda error: node.safety.caught("executor", error))
            if interrupts.requested():
                node.get_logger().info(f"{interrupts.requested()}: shutting down")
    except (ExternalShutdownException, ShutdownException):
        pass
    finally:
        if node is not None and node.worker is not None:
            node.worker.inbox.close()   # an image callback waiting for queue space returns
        if executor is not None:
            shut_down_executor(executor, None, node.get_logger())
        if node is not None:
            node.release()   # the worker stops while the context is valid for its last publish
            node.destroy_node()
        rclpy.try_shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
