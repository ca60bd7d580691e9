"""The safety net under every callback: an unexpected exception is a bug, not the end of the node.

Validation refuses bad input where it enters (input_checks.py, params.py); this catches what it
missed. ``SafetyNet.guard(name, fn)`` wraps a subscription, timer or service callback: an
exception is counted, logged at ERROR with its traceback the first time for that callback (then
throttled), counted through ``count`` (/diagnostics: ERROR), and the callback returns None instead of raising into the executor, whose spin would
re-raise it in main and end the process. ``guard_service`` answers a failure instead (a
service without a response leaves its client waiting). ``net_of(node)`` is the node's net (the
map node's counts into its counters), or for a node without one a net that logs only.
"""
from __future__ import annotations

import functools
import threading
import traceback

_LOG_PERIOD_S = 10.0


class SafetyNet:
    """``count(text)`` is called for each exception caught (the node's counters)."""

    def __init__(self, logger, count):
        self._logger = logger
        self._count = count
        self._lock = threading.Lock()
        self._seen: set[str] = set()

    def guard(self, name: str, fn):
        # functools.wraps: rclpy reads the callback's signature (a message-info argument or not).
        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as error:   # the net itself: never into the executor
                self.caught(name, error)
                return None
        return guarded

    def guard_service(self, name: str, fn):
        """As ``guard`` for a service callback(request, response): the answer says it failed."""
        @functools.wraps(fn)
        def guarded(request, response):
            try:
                return fn(request, response)
            except Exception as error:
                self.caught(name, error)
                if hasattr(response, "success"):
                    response.success = False
                if hasattr(response, "message"):
                    response.message = f"failed: {type(error).__name__}: {error}"
                return response
        return guarded

    def caught(self, name: str, error: BaseException) -> None:
        text = f"bug: {name} raised {type(error).__name__}: {error} (the node goes on)"
        with self._lock:
            first = name not in self._seen
            self._seen.add(name)
        self._count(text)
        if first:
            self._logger.error(text + "\n" + "".join(traceback.format_exception(error)))
        else:
            self._logger.error(text, throttle_duration_sec=_LOG_PERIOD_S)


def net_of(node) -> SafetyNet:
    """``node.safety`` where the node has a net (map_node), else one that logs to its logger."""
    net = getattr(node, "safety", None)
    return net if net is not None else SafetyNet(node.get_logger(), lambda text: None)
