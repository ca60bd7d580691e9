"""The live view in the command-line tools: the flags, the start (a refusal is reported and the
work goes on without the view) and serving the final picture until Ctrl-C."""
from __future__ import annotations

import argparse
import sys
import time

from lingbot_ros.process import interrupts

from .live_view import DEFAULT_POINT_BUDGET, LiveView, ViewerError

DEFAULT_PORT = 8080   # viser's own default
SETTLE_S = 30.0       # how long the end waits for the last scene update to be drawn


def port(text: str) -> int:
    """The node's viewer_port rule (ros/params.py), less its 0 (off): a flag left out is off."""
    value = int(text)
    if not 1024 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 1024 to 65535 (lower ones need root), got {value}")
    return value


def point_budget(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser, flag: str = "--viewer", required: bool = False) -> None:
    if required:   # a command that is only a view: the port has a default
        parser.add_argument("--port", dest="viewer", type=port, default=DEFAULT_PORT,
                            help="port of the page on 127.0.0.1 (default %(default)s)")
    else:
        parser.add_argument(flag, nargs="?", type=port, const=DEFAULT_PORT, metavar="PORT",
                            help="serve a live 3D view (map points, trajectory, newest camera) on "
                                 f"http://127.0.0.1:PORT (default port {DEFAULT_PORT}) while frames are "
                                 "processed, then the final map until Ctrl-C; needs viser "
                                 "(pip install 'lingbot_ros[viewer]')")
    parser.add_argument("--viewer-point-budget", type=point_budget, default=DEFAULT_POINT_BUDGET, metavar="N",
                        help="most map points the view sends, an even sample of the map (default %(default)s)")


def start(args, prog: str) -> LiveView | None:
    """The view the flags ask for, or None (not asked, or refused: said on stderr)."""
    if args.viewer is None:
        return None
    try:
        viewer = LiveView(args.viewer, args.viewer_point_budget)
    except ViewerError as error:
        print(f"{prog}: error: live view off: {error}", file=sys.stderr, flush=True)
        return None
    print(f"{prog}: live view: {viewer.url}", file=sys.stderr, flush=True)
    return viewer


def close(viewer: LiveView | None) -> None:
    if viewer is not None:
        viewer.close()


def until_stopped(viewer: LiveView | None, prog: str, what: str) -> None:
    """Serve ``what`` once drawn, until Ctrl-C or SIGTERM (process/interrupts.py ends the tool).
    A run already stopped by one is not served: the user asked to end, and interrupts.py ignores
    every later signal (the page would be served until a kill)."""
    if viewer is None:
        return
    try:
        stopped = interrupts.requested()
        if stopped:
            print(f"{prog}: live view closed: stopped by {stopped}", file=sys.stderr, flush=True)
            return
        viewer.settle(SETTLE_S)
        if viewer.error:
            print(f"{prog}: warning: live view: {viewer.error}", file=sys.stderr, flush=True)
        print(f"{prog}: live view of {what} on {viewer.url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
        while True:
            time.sleep(0.5)
    finally:
        viewer.close()
