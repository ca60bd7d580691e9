"""One worker thread per camera, one running at a time; their parked model steps run as one step.

Each camera's Mapper verb (``Baton.run``) runs in that camera's persistent worker thread. The
threads take turns, in camera order: the rig's thread hands the baton to a worker and waits until
the worker gives it back, by parking a model step (``Baton.step``, which a camera's session view
calls) or by finishing its verb. When every worker of the call has parked or finished, the parked
frames run as ONE ``MultiStreamSession.step`` in the rig's thread, and the parked workers resume,
in camera order, until each parks again or finishes. A verb that steps more than once (a window
switch runs overlap frames again, a held frame and the next one) takes more rounds.

So the Mappers' code never runs concurrently (no locks in it), and the order of everything is
fixed by the camera order: the outputs do not depend on thread timing. Nothing busy-waits: the
hand-overs are semaphores.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import torch

from ...stream import FrameError, FrameResult, MultiStreamSession, StreamFrame


class _Worker:
    """A camera's thread: runs the job it is handed, parks at each model step."""

    def __init__(self, stream: int, name: str, baton: "Baton"):
        self.stream, self.baton = stream, baton
        self.resume = threading.Semaphore(0)
        self.job: Callable[[], Any] | None = None     # None when handed: the thread ends
        self.result: Any = None
        self.error: BaseException | None = None
        self.parked: StreamFrame | None = None        # the frame of the step it waits on
        self.answer: list[FrameResult] | BaseException | None = None
        self.stopped = False
        self.thread = threading.Thread(target=self._loop, name=f"lingbot-rig-{name}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        self.baton._local.worker = self
        while True:
            self.resume.acquire()
            job, self.job = self.job, None
            if job is None:
                self.stopped = True
                self.baton._back.release()
                return
            try:
                self.result = job()
            except BaseException as error:   # the rig's caller gets it (run), after every camera's turn
                self.error = error
            self.baton._back.release()


class Baton:
    def __init__(self, session: MultiStreamSession, names: Sequence[str]):
        self.session = session
        self._back = threading.Semaphore(0)   # a worker gave the baton back
        self._local = threading.local()       # .worker: set in each worker's thread
        self._workers = [_Worker(stream, name, self) for stream, name in enumerate(names)]
        self._closed = False

    def run(self, jobs: dict[int, Callable[[], Any]]) -> dict[int, Any]:
        """``jobs[stream]()`` in stream ``stream``'s worker, every listed stream's, their model steps
        batched; the results by stream. Every job runs to its end, then the first error (in stream
        order) is raised."""
        if self._closed:
            raise RuntimeError("the rig is closed")
        active = []
        for stream in sorted(jobs):
            worker = self._workers[stream]
            worker.job, worker.result, worker.error = jobs[stream], None, None
            active.append(worker)
        ran = list(active)
        while active:
            for worker in active:
                self._hand(worker)
            active = [worker for worker in active if worker.parked is not None]
            if active:
                self._step(active)
        errors = [worker.error for worker in ran if worker.error is not None]
        if errors:
            raise errors[0]
        return {worker.stream: worker.result for worker in ran}

    def step(self, frame: StreamFrame) -> list[FrameResult]:
        """A session view's step: parked for the round's batched step when called in a rig verb
        (a camera's worker), else run alone here."""
        worker = getattr(self._local, "worker", None)
        if worker is None:
            return self.session.step([frame])[frame.stream]
        assert worker.stream == frame.stream, "a camera's worker steps its own stream only"
        worker.parked = frame
        self._back.release()
        worker.resume.acquire()
        answer, worker.answer = worker.answer, None
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def close(self) -> None:
        """End every worker thread and join it. Between verbs each is idle; after a verb a signal
        cut short (``run`` raised it mid-round), a parked one gets an error for its step, ends its
        verb, then its thread."""
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            while not worker.stopped:
                if worker.parked is not None:
                    worker.parked, worker.answer = None, RuntimeError("the rig closed during this step")
                worker.job = None
                self._hand(worker)
            worker.thread.join()

    @property
    def threads(self) -> list[threading.Thread]:
        return [worker.thread for worker in self._workers]

    def _hand(self, worker: _Worker) -> None:
        """The baton to ``worker`` until it parks or finishes. A signal meanwhile is raised after its
        turn: the turn changes the Mappers' state and must end whole."""
        worker.resume.release()
        interrupted = None
        while True:
            try:
                self._back.acquire()
                break
            except BaseException as error:
                interrupted = error
        if interrupted is not None:
            raise interrupted

    def _step(self, parked: list[_Worker]) -> None:
        """The parked frames as one batched step; each worker's answer its results or the error.
        A refused frame (FrameError: checked before anything ran, nothing changed) fails alone:
        the others run without it."""
        frames = [worker.parked for worker in parked]
        for worker in parked:
            worker.parked = None
        try:
            with torch.inference_mode():
                results = self.session.step(frames)
        except FrameError as error:
            if len(parked) == 1:
                parked[0].answer = error
                return
            for worker, frame in zip(parked, frames):
                try:
                    with torch.inference_mode():
                        worker.answer = self.session.step([frame])[frame.stream]
                except BaseException as alone:
                    worker.answer = alone
            return
        except BaseException as error:   # every parked camera's Mapper fails its frame and restarts
            for worker in parked:
                worker.answer = error
            return
        for worker in parked:
            worker.answer = results[worker.stream]
