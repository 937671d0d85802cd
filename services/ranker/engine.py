"""The device thread: all model work of a ranker runs on one thread per device, by priority.

The asyncio event loop never runs model code. It submits jobs and awaits their futures; the worker
thread takes the most urgent job first (ranks before reloads before pre-inference, FIFO within a
priority). Pre-inference is submitted one chunk at a time, so a Rank that arrives behind it waits for
at most one chunk. A job whose deadline has passed, or whose awaiting future was cancelled, is dropped
when it reaches the front, before any work starts.
"""

from __future__ import annotations

import asyncio
import enum
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from services.common import metrics
from services.common.errors import DeadlineExceeded

log = logging.getLogger(__name__)

T = TypeVar("T")


class Priority(enum.IntEnum):
    RANK = 0
    RELOAD = 1
    PRE_INFER = 2


class DeviceWorker:
    """A single thread that runs submitted callables in priority order. Thread-safe `submit`."""

    def __init__(self, name: str = "device") -> None:
        self._heap: list[tuple[int, int, float | None, Callable[[], Any], asyncio.Future, str]] = []
        self._counter = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._depth = {p: 0 for p in Priority}
        self._running = len(Priority)  # priority of the job on the thread; len(Priority) when idle
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def queued(self, priority: Priority) -> int:
        return self._depth[priority]

    def submit(
        self, fn: Callable[[], T], priority: Priority, op: str, deadline: float | None = None
    ) -> asyncio.Future[T]:
        """Queues `fn`; the returned future (of the running loop) resolves with its result.

        `deadline` is a `time.monotonic()` instant after which the job is dropped unstarted with
        DeadlineExceeded. `op` labels the model-time metric.
        """
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        with self._cond:
            if self._closed:
                raise RuntimeError("device worker is closed")
            heapq.heappush(self._heap, (priority, next(self._counter), deadline, fn, future, op))
            self._depth[priority] += 1
            metrics.DEVICE_QUEUE_DEPTH.labels(priority.name.lower()).set(self._depth[priority])
            self._cond.notify()
        return future

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
                if not self._heap or self._heap[0][0] >= self._running:
                    return
                job = self._pop()
            self._run(job)

    def _pop(self):
        job = heapq.heappop(self._heap)
        priority = Priority(job[0])
        self._depth[priority] -= 1
        metrics.DEVICE_QUEUE_DEPTH.labels(priority.name.lower()).set(self._depth[priority])
        return job

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._heap and not self._closed:
                    self._cond.wait()
                if not self._heap:
                    return
                job = self._pop()
            self._running = job[0]
            self._run(job)
            self._running = len(Priority)

    def _run(self, job) -> None:
        _, _, deadline, fn, future, op = job
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
