"""The worker thread: sole owner of the model, fed by a frame inbox and a command queue.

Subscription callbacks only decode and ``put`` frames; service callbacks ``submit`` commands and
wait on the returned future. Commands run between frames, so nothing races an inference step.
"""
from __future__ import annotations

import collections
import queue
import threading
from concurrent.futures import Future
from typing import Callable

# Commands waiting for the worker, at most: a caller past this is refused at once (the periodic
# ~/map publication is coalesced to one; services wait for their own).
MAX_COMMANDS = 64
# How often a worker waiting for the next frame looks whether the device finished the step it
# runs (a frame's arrival wakes it at once): at most this much later, the step's frame is placed.
POLL_S = 0.0005


class Inbox:
    """What the worker's inboxes share: a condition over their items, and ``close``."""

    def __init__(self):
        self._cond = threading.Condition()
        self._closed = False

    def close(self) -> None:
        """Wake and release any producer blocked in put (deactivate, shutdown)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class FrameInbox(Inbox):
    """Newest-frame-wins slot (``keep_all=False``) or a bounded FIFO (``keep_all=True``).

    ``put`` returns how many waiting frames it dropped (0 or 1). In FIFO mode it never drops: it
    waits for space, which back-pressures a reliable publisher (bag replay).
    """

    def __init__(self, keep_all: bool, capacity: int, merge: Callable | None = None):
        """``merge(new, dropped)``: the item that takes a dropped one's place (newest-frame-wins)."""
        super().__init__()
        self.keep_all = keep_all
        self.capacity = capacity if keep_all else 1
        self._merge = merge
        self._items: collections.deque = collections.deque()

    def put(self, item) -> int:
        """Queue ``item``; return how many frames this dropped. A closed inbox (deactivated)
        drops the item itself: an image callback still running then must not feed the worker."""
        with self._cond:
            dropped = 0
            if self.keep_all:
                while len(self._items) >= self.capacity and not self._closed:
                    self._cond.wait(0.1)
            if self._closed:
                return 1
            if not self.keep_all and self._items:
                older = self._items.popleft()
                item = self._merge(item, older) if self._merge is not None else item
                dropped = 1
            self._items.append(item)
            self._cond.notify_all()
            return dropped

    def get(self, timeout: float):
        with self._cond:
            if not self._items:
                self._cond.wait(timeout)
            if not self._items:
                return None
            item = self._items.popleft()
            self._cond.notify_all()
            return item

    def get_while(self, busy: Callable[[], bool], poll_s: float = POLL_S):
        """The next frame if one is waiting or comes while ``busy()`` (the device still runs the
        step before it); None as soon as nothing came and ``busy()`` is False, or once closed."""
        with self._cond:
            while not self._items and not self._closed and busy():
                self._cond.wait(poll_s)
            if not self._items or self._closed:
                return None
            item = self._items.popleft()
            self._cond.notify_all()
            return item

    def clear(self) -> int:
        """Drop every waiting frame; return how many."""
        with self._cond:
            count = len(self._items)
            self._items.clear()
            self._cond.notify_all()
            return count

    def __len__(self) -> int:
        return len(self._items)


class Worker:
    """Runs ``handle_frame`` for each inbox frame and submitted commands in between.

    ``inbox`` may be replaced between activations (its kind follows the input parameters).
    An exception from ``handle_frame`` goes to ``on_error`` and the worker goes on: one bad frame
    must not stop the node.
    """

    def __init__(self, inbox: FrameInbox, handle_frame: Callable, on_error: Callable[[BaseException], None],
                 name: str = "lingbot_worker"):
        self.inbox = inbox
        self._handle_frame = handle_frame
        self._on_error = on_error
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.busy = False

    def start(self) -> None:
        self._thread.start()

    def submit(self, fn: Callable, *args) -> Future:
        """Run ``fn(*args)`` on the worker before the next frame; the future holds its result."""
        future: Future = Future()
        if self._stop.is_set():
            future.set_exception(RuntimeError("the worker has stopped"))
        elif self._commands.qsize() >= MAX_COMMANDS:
            future.set_exception(RuntimeError(f"the worker is busy: {MAX_COMMANDS} requests already waiting, "
                                              "nothing done"))
        else:
            self._commands.put((future, fn, args))
        return future

    def next_frame(self, busy: Callable[[], bool]):
        """For a ``handle_frame`` that goes on with the frames that keep coming: the inbox's next
        frame while ``busy()`` (``FrameInbox.get_while``); None when a command waits (commands
        run between frames) or the worker stops."""
        if self._stop.is_set() or not self._commands.empty():
            return None
        return self.inbox.get_while(busy)

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop after the current frame; return True if the thread ended in time."""
        self._stop.set()
        self.inbox.close()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        # Anything still queued will never run: say so instead of leaving callers waiting.
        while not self._commands.empty():
            future, _, _ = self._commands.get_nowait()
            future.set_exception(RuntimeError("the worker stopped before running this request"))
        return not self._thread.is_alive()

    def _run_commands(self) -> None:
        while not self._commands.empty():
            future, fn, args = self._commands.get_nowait()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as error:   # handed to the waiting caller, who reports it
                future.set_exception(error)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._run_commands()
            frame = self.inbox.get(timeout=0.02)
            if frame is not None and not self._stop.is_set():
                self.busy = True
                try:
                    self._handle_frame(frame)
                except Exception as error:
                    self._on_error(error)
                finally:
                    self.busy = False
        self._run_commands()
