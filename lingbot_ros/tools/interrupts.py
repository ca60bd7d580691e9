"""Ctrl-C and SIGTERM for the command-line tools: a clean stop with exit 0, in every phase.

rclpy's own handlers shut the context down under the tools' feet (a spinning thread then dies
with a traceback, and a --wait-for-node player waited for a status that could no longer come).
``run(main, argv)`` installs handlers that raise KeyboardInterrupt once in the main thread
(later signals are ignored, so the clean-up is not interrupted) and turns it into exit 0. The
tool calls ``rclpy.init(..., signal_handler_options=SignalHandlerOptions.NO)``.
"""
from __future__ import annotations

import signal


def _stop(signum, frame):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def run(main, argv=None) -> int:
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        return main(argv)
    except KeyboardInterrupt:
        return 0
