"""The node's multi-threaded executor: rclpy's MultiThreadedExecutor without its dispatch spin.

rclpy's executor (Jazzy 7.1, Kilted 9.1) yields a callback's task again, and its
MultiThreadedExecutor submits it to the pool again, for as long as the task waits in the pool's
queue without having started. The spinning thread then loops at full speed, holding the GIL the
pool's threads need to start the task (rclpy issue #1452, fixed upstream after these releases).
Measured: 2 threads of Python work beside a 30 Hz subscription cost 14,891 submissions for 300
callbacks (bench/executor_dispatch.py), and on the 16-core GPU machine the node took 30 of 50
images at 10 Hz; pinned to 2 cores, 50 of 50 (bench/README.md, "The executor's dispatch loop").

``PoolExecutor`` submits each task once. A task yielded again while it waits to start is not
submitted again: the spinning thread waits (without the GIL) until a pool thread starts it.
"""
from __future__ import annotations

import threading

from rclpy.executors import (ConditionReachedException, ExternalShutdownException, MultiThreadedExecutor,
                             ShutdownException, TimeoutException)

# How long the spinning thread waits for a re-yielded task to start before it looks again (the
# pool's threads may all be busy: it must still see shutdowns and its own timeout).
RESTART_WAIT_S = 0.01


class PoolExecutor(MultiThreadedExecutor):
    def __init__(self, num_threads: int, *, context=None):
        super().__init__(num_threads, context=context)
        self._not_started: set = set()          # tasks submitted whose pool thread has not begun
        self._started = threading.Condition()

    def _spin_once_impl(self, timeout_sec=None, wait_condition=lambda: False) -> None:
        try:
            task, _, _ = self.wait_for_ready_callbacks(timeout_sec, None, wait_condition)
        except (ExternalShutdownException, ShutdownException, TimeoutException, ConditionReachedException):
            return
        with self._started:
            if task in self._not_started:
                self._started.wait_for(lambda: task not in self._not_started, timeout=RESTART_WAIT_S)
                return
            self._not_started.add(task)
        self._executor.submit(self._start, task)
        # As rclpy's: a task that ended with an exception raises it here, in the spinning thread.
        self._futures.append(task)
        for future in self._futures[:]:
            if future.done():
                self._futures.remove(future)
                future.result()

    def _start(self, task) -> None:
        with self._started:
            self._not_started.discard(task)
            self._started.notify_all()
        task()
