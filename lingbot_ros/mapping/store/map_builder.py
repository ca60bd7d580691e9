"""Map insertion off the frame loop: a thread that merges points into the VoxelMap in order.

An insert into a full map of millions of voxels costs milliseconds of CPU (sorted-index updates,
the periodic drop of the least recent voxels); done on the worker it would add to every
keyframe's latency. The Mapper hands each keyframe's points to this thread and goes on with the
next frame; anything that reads or changes the map waits for the queue first (``map``), so the
map is always what in-order, synchronous inserts would have made.

Inserts are staged and handed over by ``release``, which the Mapper calls when it is about to
wait for the device: the thread's numpy work then holds the GIL while the frame loop has nothing
to do. Handed over at once, it ran while the loop placed the frame, and every blocking call of
the loop (a device sync, a copy) could wait up to a thread switch interval (5 ms) for the GIL
afterwards: ~4 ms per frame on the H200 (bench/README.md, Mapper overhead).

A read that need not be synchronous (the live view's sample) runs on the thread too (``after``):
the caller hands it over and goes on; the map it reads is the one the inserts before it made.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
from concurrent.futures import Future
from typing import Callable

import numpy as np

from .voxel_map import VoxelMap


@dataclasses.dataclass(frozen=True)
class _Read:
    job: Callable[[VoxelMap], object]
    future: Future


class MapBuilder:
    def __init__(self, voxel_map: VoxelMap):
        self._map = voxel_map
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._staged: list[tuple[np.ndarray, np.ndarray]] = []
        self._thread = threading.Thread(target=self._run, name="lingbot_map_builder", daemon=True)
        self._thread.start()

    def insert(self, xyz: np.ndarray, rgb: np.ndarray) -> None:
        """Stage points; the thread takes them at the next ``release`` (or read of the map)."""
        self._raise_error()
        self._staged.append((xyz, rgb))

    def release(self) -> None:
        """Hand the staged inserts to the thread, in order."""
        for item in self._staged:
            self._queue.put(item)
        self._staged.clear()

    def after(self, job: Callable[[VoxelMap], object]) -> Future:
        """``job(map)`` on the thread once every insert so far is in; never waits. The map does
        not change while it runs: everything that changes it waits for the queue (``map``,
        ``swap``). Its result or error is the future's."""
        future: Future = Future()
        if not self._thread.is_alive():   # closed: the map is final, read it here
            _run_read(_Read(job, future), self._map)
            return future
        self.release()
        self._queue.put(_Read(job, future))
        return future

    @property
    def map(self) -> VoxelMap:
        """The map once every staged and queued insert is in (an insert's error is raised here)."""
        self.release()
        self._queue.join()
        self._raise_error()
        return self._map

    def swap(self, voxel_map: VoxelMap) -> None:
        """Put ``voxel_map`` in the old one's place once every staged and queued insert is in."""
        self.release()
        self._queue.join()
        self._raise_error()
        self._map = voxel_map

    def __len__(self) -> int:
        """Voxels so far (staged and queued inserts may still add some): for status, never waits."""
        return len(self._map)

    def close(self) -> None:
        """Finish the queued inserts and end the thread (the map stays readable)."""
        if self._thread.is_alive():
            self.release()
            self._queue.put(None)
            self._thread.join()

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.task_done()
                return
            try:
                if isinstance(item, _Read):
                    _run_read(item, self._map)
                else:
                    self._map.insert(*item)
            except BaseException as error:   # handed to the next caller (VoxelRangeError, ...)
                self._error = error
            finally:
                self._queue.task_done()


def _run_read(read: _Read, voxel_map: VoxelMap) -> None:
    try:
        read.future.set_result(read.job(voxel_map))
    except BaseException as error:   # the reader's, not the map's
        read.future.set_exception(error)
