"""Ctrl-C and SIGTERM for the command-line tools and the node: a clean stop with exit 0, in every
phase. Every entry point calls ``run``.

rclpy's own handlers shut the context down under the tools' feet (a spinning thread then dies
with a traceback, and a --wait-for-node player waited for a status that could no longer come).
``run(main, argv, prog)`` installs handlers that raise KeyboardInterrupt once in the main thread
and turns it into exit 0, with one line on stderr naming the signal (and what the stop left, where
the tool raised KeyboardInterrupt with a text). The first signal is the
only one: later ones are ignored, so the clean-up (a save, a shutdown) is not interrupted. A tool
that uses rclpy calls ``rclpy.init(..., signal_handler_options=SignalHandlerOptions.NO)``.

Work that must not be cut in the middle (a frame inside the model, whose results the tool then
saves) runs inside ``deferred()``: there a signal is only recorded, and the work asks
``requested()`` between its steps and stops at a consistent point.

Imports of large libraries (torch, rclpy) run inside ``importing()``: there a signal ends the
process at once, exit 0 and the one line, without raising. A KeyboardInterrupt raised in the
middle of a library's import left it half-initialised (numpy's lazy ``linalg`` then recursed
without end), or was caught by an extension's own code and made the interpreter end by SIGINT
after a clean return (exit 130). Nothing that a stop must finish exists during an import.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_state = {"received": None, "deferring": 0, "importing": 0, "prog": ""}


def _stop(signum, frame):
    for each in _SIGNALS:
        signal.signal(each, signal.SIG_IGN)
    _state["received"] = signal.Signals(signum).name
    if _state["importing"]:
        _say_stopped("")
        sys.stdout.flush()
        os._exit(0)
    if not _state["deferring"]:
        raise KeyboardInterrupt


def _say_stopped(why: str) -> None:
    if _state["prog"]:
        print(f"{_state['prog']}: stopped by {requested() or 'SIGINT'}{why}", file=sys.stderr, flush=True)


def requested() -> str | None:
    """The signal's name (SIGINT, SIGTERM) once one came, else None."""
    return _state["received"]


@contextlib.contextmanager
def importing():
    """Inside, a signal ends the process at once with exit 0 (see the module)."""
    _state["importing"] += 1
    try:
        yield
    finally:
        _state["importing"] -= 1


@contextlib.contextmanager
def deferred():
    """Inside, a signal is recorded for ``requested()`` instead of raised (see the module)."""
    _state["deferring"] += 1
    try:
        yield
    finally:
        _state["deferring"] -= 1


def run(main, argv=None, prog: str = "") -> int:
    """``main(argv)`` with the handlers installed; a signal that ends it is exit 0. Where none came,
    the previous handlers are put back when it returns (a caller in the same process, a test);
    after one, signals stay ignored while the process ends."""
    _state["received"], _state["prog"] = None, prog
    previous = {each: signal.signal(each, _stop) for each in _SIGNALS}
    try:
        return main(argv)
    except KeyboardInterrupt as stop:   # its text, if any, says what the stop left
        _say_stopped(f": {stop}" if stop.args else "")
        return 0
    finally:
        if requested() is None:
            for each, handler in previous.items():
                signal.signal(each, handler)
