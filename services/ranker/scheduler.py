"""The scheduler: all model work of a ranker runs on one thread per device, by priority.

The asyncio event loop never runs model code. It submits jobs and awaits their futures; the worker
thread takes the most urgent job first (ranks before reloads before pre-inference, FIFO within a
priority). Pre-inference is submitted one chunk at a time, so a Rank that arrives behind it waits for
at most one chunk. A Rank that waits on a background job (it joined a pre-inference) `promote`s that job
to its own priority, so ranks that keep arriving cannot starve it. A job whose deadline has passed, or
whose awaiting future was cancelled, is dropped when it reaches the front, before any work starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from services.common.errors import DeadlineExceeded
from services.ranker import metrics

log = logging.getLogger(__name__)

T = TypeVar("T")


class Priority(enum.IntEnum):
    RANK = 0
    RELOAD = 1
    PRE_INFER = 2


class Op(enum.StrEnum):
    """What a job does: the `op` label of relaygr_model_seconds."""

    PRE_INFER = "pre_infer"  # a prefix computed in chunks: for a PreInfer, or for a Rank that missed
    EXTEND = "extend"  # a cached prefix extended with the events appended since
    RANK = "rank"  # short-term events and candidates scored against a prefix
    UNCACHED = "uncached"  # a prefix computed, ranked against and dropped (no room to cache it)
    RELOAD = "reload"  # a copy DRAM -> HBM (copy thread)
    DEMOTE = "demote"  # a copy HBM -> DRAM (copy thread)
    PROFILE = "profile"  # the warm-up latency curve


# The jobs that run the model (the others copy tensors or measure).
MODEL_PASSES = (Op.PRE_INFER, Op.EXTEND, Op.RANK, Op.UNCACHED)


@dataclasses.dataclass(order=True)
class Job:
    """A queued callable. Jobs order by priority, then by submission (FIFO within a priority)."""

    priority: Priority
    seq: int
    deadline: float | None = dataclasses.field(compare=False)
    fn: Callable[[], Any] = dataclasses.field(compare=False)
    future: asyncio.Future = dataclasses.field(compare=False)
    op: Op = dataclasses.field(compare=False)


@dataclasses.dataclass
class _Running:
    """A job on the device thread: its priority (raised by `promote`) and the future it resolves."""

    priority: int
    future: asyncio.Future


class Scheduler:
    """A single thread that runs submitted callables in priority order. Thread-safe `submit`."""

    def __init__(self, name: str = "device") -> None:
        self._heap: list[Job] = []
        self._counter = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._depth = {p: 0 for p in Priority}
        # The job on the thread, then each job run nested in it by run_more_urgent, innermost last.
        self._running: list[_Running] = []
        # Seconds the thread has spent running jobs (nested ones are inside their outer job's time).
        self.busy_s = 0.0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def queued(self, priority: Priority) -> int:
        return self._depth[priority]

    def submit(
        self, fn: Callable[[], T], priority: Priority, op: Op, deadline: float | None = None
    ) -> asyncio.Future[T]:
        """Queues `fn`; the returned future (of the running loop) resolves with its result.

        `deadline` is a `time.monotonic()` instant after which the job is dropped unstarted with
        DeadlineExceeded. `op` labels the model-time metric.
        """
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        with self._cond:
            if self._closed:
                raise RuntimeError("device worker is closed")
            heapq.heappush(self._heap, Job(priority, next(self._counter), deadline, fn, future, op))
            self._count(priority, +1)
            self._cond.notify()
        return future

    def promote(self, future: asyncio.Future, priority: Priority) -> None:
        """Makes the job that resolves `future` at least as urgent as `priority`: a queued job moves up
        the queue, a running one stops yielding to jobs of that priority. No-op for a finished job."""
        with self._cond:
            for running in self._running:
                if running.future is future:
                    running.priority = min(running.priority, priority)
                    return
            for job in self._heap:
                if job.future is future and job.priority > priority:
                    self._count(job.priority, -1)
                    self._count(priority, +1)
                    job.priority = priority
                    heapq.heapify(self._heap)
                    return

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def run_more_urgent(self) -> None:
        """Runs, on the calling device thread, every queued job more urgent than the running one.

        Long background jobs (chunked pre-inference) call this between chunks, so a rank never waits
        for more than one chunk.
        """
        while True:
            with self._cond:
                if not self._heap or self._heap[0].priority >= self._running[-1].priority:
                    return
                job = self._pop()
            self._run(job)

    def _pop(self) -> Job:
        job = heapq.heappop(self._heap)
        self._count(job.priority, -1)
        return job

    def _count(self, priority: Priority, change: int) -> None:
        self._depth[priority] += change
        metrics.DEVICE_QUEUE_DEPTH.labels(priority.name.lower()).set(self._depth[priority])

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._heap and not self._closed:
                    self._cond.wait()
                if not self._heap:
                    return
                job = self._pop()
            started = time.perf_counter()
            self._run(job)
            self.busy_s += time.perf_counter() - started

    def _run(self, job: Job) -> None:
        """Runs a job as the innermost running one: nested in another job, it yields by its own priority."""
        with self._cond:
            self._running.append(_Running(job.priority, job.future))
        try:
            self._execute(job)
        finally:
            with self._cond:
                self._running.pop()

    def _execute(self, job: Job) -> None:
        deadline, fn, future, op = job.deadline, job.fn, job.future, job.op
        loop = future.get_loop()
        if future.cancelled():
            return
        if deadline is not None and time.monotonic() > deadline:
            loop.call_soon_threadsafe(
                _set_exception, future, DeadlineExceeded(f"{op}: deadline passed in queue")
            )
            return
        started = time.perf_counter()
        try:
            result = fn()
        except BaseException as exc:  # delivered to the awaiting coroutine, never lost on this thread
            log.debug("device job %s failed", op, exc_info=True)
            loop.call_soon_threadsafe(_set_exception, future, exc)
        else:
            loop.call_soon_threadsafe(_set_result, future, result)
        finally:
            metrics.MODEL_SECONDS.labels(op).observe(time.perf_counter() - started)


def _set_result(future: asyncio.Future, result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
