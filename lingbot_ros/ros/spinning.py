"""Spinning an executor and stopping it before its nodes go: the node's executable, the demo and
the replay share these, so a shutdown that races a callback ends the same quiet way in all."""
from __future__ import annotations

import threading


def spin_once_guarded(executor, logger, on_error=None, timeout_sec: float = 0.1) -> None:
    """One ``executor.spin_once``. It re-raises a callback's exception: InvalidHandle means a
    transition or the shutdown destroyed an entity that callback used (its work is moot, the node
    is fine), logged at debug; any other goes to ``on_error`` (the node's safety net), or is
    logged as a warning. ShutdownException and ExternalShutdownException propagate: the loop ends."""
    from rclpy.exceptions import InvalidHandle
    from rclpy.executors import ExternalShutdownException, ShutdownException

    try:
        executor.spin_once(timeout_sec=timeout_sec)
    except (ShutdownException, ExternalShutdownException):
        raise
    except InvalidHandle as error:
        logger.debug(f"a callback met an entity destroyed by a transition or the shutdown: {error}")
    except Exception as error:   # a callback outside the node's own guards (rclpy's)
        if on_error is not None:
            on_error(error)
        else:
            logger.warning(f"a callback failed: {type(error).__name__}: {error}")


class BackgroundSpin:
    """Spins ``executor`` on a daemon thread until ``stop``, which also shuts the executor down
    (before the nodes it waits on are destroyed). ``executor.spin`` on a thread instead printed a
    traceback whenever the shutdown destroyed the executor's guard under a running callback."""

    def __init__(self, executor, logger, on_error=None):
        self.executor = executor
        self._logger = logger
        self._on_error = on_error
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spin", daemon=True)

    def start(self) -> "BackgroundSpin":
        self._thread.start()
        return self

    def _run(self) -> None:
        from rclpy.executors import ExternalShutdownException, ShutdownException

        try:
            while not self._stopping.is_set() and self.executor.context.ok():
                spin_once_guarded(self.executor, self._logger, self._on_error)
        except (ShutdownException, ExternalShutdownException):
            pass

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stopping.set()
        shut_down_executor(self.executor, self._thread if self._thread.is_alive() else None, self._logger)


def shut_down_executor(executor, spin_thread: threading.Thread | None, logger) -> None:
    """Stop ``executor`` before its nodes are destroyed: wait for the callbacks still running (its
    thread pool), join the thread spinning it, if any, and settle the callbacks' tasks that ended
    after the last spin_once collected them. An exception of theirs is retrieved and logged in one
    line (rclpy's Task prints "The following exception was never retrieved" when it is garbage
    collected otherwise; during the shutdown it is an entity or the context going away under a
    callback, not a bug to trace); one that had not ended is cancelled. rclpy keeps them in
    ``_futures``, with no public way to them."""
    from rclpy.exceptions import InvalidHandle

    executor.shutdown(timeout_sec=5.0)
    if spin_thread is not None:
        spin_thread.join(5.0)
    for task in list(getattr(executor, "_futures", ())):
        if not task.done():
            task.cancel()
            continue
        error = task.exception()
        if isinstance(error, InvalidHandle):   # the executor's own guard, destroyed by its shutdown
            logger.debug(f"a callback met an entity destroyed by the shutdown: {error}")
        elif error is not None:
            logger.warning(f"a callback ended during the shutdown with {type(error).__name__}: {error}")
