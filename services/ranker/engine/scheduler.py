"""The scheduler: all model work of a ranker runs on one thread per device, by priority.

The asyncio event loop never runs model code. It submits jobs and awaits their futures; the worker
thread takes the most urgent job first (`Priority`: ranks against a ready prefix, then the prefixes Ranks
wait for, then reloads, then pre-inference; FIFO within a priority). A prefix is computed in chunks: its
job (`submit_yielding`) is handed a `Yield`, a callable it calls between two chunks, where the scheduler runs
every more urgent queued job, so a rank waits for at most one chunk of any prefix, a miss's included; the
job knows nothing else of the scheduler. A Rank that waits on a background job (it joined a
pre-inference) `promote`s that job to `Priority.AWAITED`, so pre-inferences that keep arriving cannot
starve it. A job whose deadline has passed, or whose awaiting future was cancelled, is dropped when it
reaches the front, before any work starts.

Each job's own thread CPU time (a job's Yield-nested jobs count theirs) is counted by op
(`relaygr_model_cpu_seconds`): what the host spends inside model passes, which the serving-overhead
benchmark subtracts from the process's CPU. The thread takes its own name as the OS's thread name, so
`top -H` and /proc tell the device thread from the event loop.

A job may carry its `work` (the events its pass covers); each ended job tells the `observer` its op, work and
own device time (its wall time less the jobs nested at its `Yield`; a batch: the pass, each job's work), from
which `Calibration` corrects the latency curve. Its future carries its `DeviceTime` (`device_time.py`).

Jobs submitted with a `Batch` (cached ranks) are run together: when one reaches the front, the jobs of the
same batch queued right behind it at its priority join it, up to `Batch.max_size`, and `Batch.run` does
them in one pass. Batching never waits for jobs to arrive: it takes what is queued, so it adds no latency
and turns a queue of small ranks into fewer, larger device passes. A batch that fails is run again one job
at a time, so each caller gets its own result or its own error. Jobs submitted inside `together` (a PreInfer
batch's productions) are handed over at once, with one wake-up of the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import functools
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from prometheus_client import Gauge

from services.common.errors import DeadlineExceeded
from services.common.threads import name_os_thread
from services.ranker import metrics
from services.ranker.engine.device_time import DeviceTime, JobClock

log = logging.getLogger(__name__)

T = TypeVar("T")
# Told each ended job's (op, the work of each of its jobs, its own device seconds) on the device thread.
Observer = Callable[["Op", Sequence[int], float], None]


class Priority(enum.IntEnum):
    """Most urgent first. A cached rank is short; a prefix a Rank waits for is long, so the ranks queued
    behind it run between its chunks (shortest first among the work Ranks wait on: a queue of ready ranks
    never waits behind a prefix computation)."""

    RANK = 0  # a rank against a ready prefix (and a Rank's reload, on the copy thread)
    AWAITED = 1  # a prefix a Rank waits for: a miss's computation, or a pre-inference a Rank joined
    RELOAD = 2  # a reload a PreInfer asked for, before its Rank arrives
    PRE_INFER = 3  # background pre-inference


# The priorities of device work that Ranks are waiting on (the bound of `--max-queued-ranks`).
FOR_RANKS = (Priority.RANK, Priority.AWAITED)


class Op(enum.StrEnum):
    """What a job does: the `op` label of relaygr_model_seconds."""

    PRE_INFER = "pre_infer"  # a prefix computed in chunks: for a PreInfer, or for a Rank that missed
    EXTEND = "extend"  # a cached prefix extended with the events appended since
    RANK = "rank"  # short-term events and candidates scored against a prefix
    UNCACHED = "uncached"  # a prefix computed, ranked against and dropped (no room to cache it)
    RELOAD = "reload"  # a copy DRAM -> HBM (copy thread)
    DEMOTE = "demote"  # a copy HBM -> DRAM (copy thread)
    HANDOFF = "handoff"  # a copy HBM -> host of a prefix handed to another ranker (copy thread)
    PROFILE = "profile"  # the warm-up latency curve


@dataclasses.dataclass(eq=False)
class Batch:
    """Jobs that may run together: `run(items)` returns one result per item, in order."""

    run: Callable[[list[Any]], list[Any]]
    max_size: int

    def __post_init__(self) -> None:
        if self.max_size < 1:
            raise ValueError("a batch holds at least one job")


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
    # Set for a job that may run with others of its batch; `fn` runs it alone.
    batch: Batch | None = dataclasses.field(default=None, compare=False)
    item: Any = dataclasses.field(default=None, compare=False)
    # Set for a job that yields between its steps: `fn` takes the running job's `Yield`.
    yields: bool = dataclasses.field(default=False, compare=False)
    # The events its model pass covers, for the observer (0: none told).
    work: int = dataclasses.field(default=0, compare=False)
    time: DeviceTime = dataclasses.field(default_factory=lambda: DeviceTime(time.time_ns()), compare=False)


@dataclasses.dataclass
class _Running:
    """A job on the device thread: its priority (raised by `promote`) and the future it resolves."""

    priority: int
    future: asyncio.Future


class Yield:
    """A running job's handle on the scheduler, passed to a job submitted with `submit_yielding`: calling it
    runs, there and then on the device thread, every queued job more urgent than this one (by the job's
    priority, as `promote` raises it), then returns. A long job calls it between two of its steps, so that
    the jobs queued behind it wait for one step at most. Valid only while its job runs, from its own code."""

    __slots__ = ("_running", "_scheduler")

    def __init__(self, scheduler: Scheduler, running: _Running) -> None:
        self._scheduler, self._running = scheduler, running

    def __call__(self) -> None:
        self._scheduler._run_more_urgent(self._running)


class Scheduler:
    """A single thread that runs submitted callables in priority order. Thread-safe `submit`."""

    def __init__(
        self, name: str = "device", depth_gauge: Gauge | None = None, observer: Observer | None = None
    ) -> None:
        """`depth_gauge` (labelled by priority), when given, reads this scheduler's queue depths when it is
        scraped (the device scheduler's: relaygr_device_queue_depth); `observer` is told every ended job
        that carries work (see the module docstring)."""
        self._heap: list[Job] = []
        self._counter = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._depth = {p: 0 for p in Priority}
        # The job on the thread, then each job run nested in it at a `Yield`, innermost last.
        self._running: list[_Running] = []
        self._clock = JobClock()
        # Jobs submitted inside `together`, by the thread that holds them, until it hands them over.
        self._held: list[Job] | None = None
        self._holder: int | None = None
        self.observer = observer
        if depth_gauge is not None:
            for priority in Priority:
                depth = functools.partial(self.queued, priority)
                depth_gauge.labels(priority.name.lower()).set_function(depth)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def busy_s(self) -> float:
        """Seconds the thread has spent running jobs (nested ones are inside their outer job's time)."""
        return self._clock.busy_s

    def queued(self, *priorities: Priority) -> int:
        """Jobs waiting at these priorities."""
        return sum(self._depth[priority] for priority in priorities)

    def submit(
        self, fn: Callable[[], T], priority: Priority, op: Op, deadline: float | None = None
    ) -> asyncio.Future[T]:
        """Queues `fn`; the returned future (of the running loop) resolves with its result.

        `deadline` is a `time.monotonic()` instant after which the job is dropped unstarted with
        DeadlineExceeded. `op` labels the model-time metric.
        """
        return self._push(fn, priority, op, deadline, None, None)

    def submit_yielding(
        self,
        fn: Callable[[Yield], T],
        priority: Priority,
        op: Op,
        deadline: float | None = None,
        work: int = 0,
    ) -> asyncio.Future[T]:
        """Queues `fn`, a long job that lets more urgent work run between its steps: it is called with its
        `Yield`, which it calls between two steps (see `submit`; `work` for the observer)."""
        return self._push(fn, priority, op, deadline, None, None, yields=True, work=work)

    def submit_batched(
        self,
        item: Any,
        batch: Batch,
        priority: Priority,
        op: Op,
        deadline: float | None = None,
        work: int = 0,
    ) -> asyncio.Future:
        """Queues `item` for `batch.run`, with the jobs of the same batch queued beside it (see `submit`;
        `work` for the observer)."""
        return self._push(lambda: batch.run([item])[0], priority, op, deadline, batch, item, work=work)

    def _push(self, fn, priority, op, deadline, batch, item, yields=False, work=0) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        job = Job(priority, next(self._counter), deadline, fn, future, op, batch, item, yields, work)
        future.device_time = job.time  # read back by `device_time(future)`
        if self._holder == threading.get_ident():
            self._held.append(job)
        else:
            self._queue([job])
        return future

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """Hands the jobs this thread submits inside over on exit, all at once: one lock, one wake-up of the
        device thread, which does not start the first while the others are being submitted (a PreInfer
        batch's productions). They queue as if submitted one by one; nested, the outermost hands over."""
        if self._holder is not None:
            yield
            return
        self._held, self._holder = [], threading.get_ident()
        try:
            yield
        finally:
            held, self._held, self._holder = self._held, None, None
            self._queue(held)

    def _queue(self, jobs: list[Job]) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("device worker is closed")
            for job in jobs:
                heapq.heappush(self._heap, job)
                self._count(job.priority, +1)
            self._cond.notify()

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

    def _run_more_urgent(self, running: _Running) -> None:
        """A `Yield`: runs, nested in `running` on the device thread, every queued job more urgent than it."""
        innermost = self._running[-1] if self._running else None
        if threading.current_thread() is not self._thread or innermost is not running:
            raise RuntimeError("a Yield is called by its own job, while that job runs on the device thread")
        while True:
            with self._cond:
                if not self._heap or self._heap[0].priority >= running.priority:
                    return
                jobs = self._pop_batch()
            self._run(jobs)

    def _pop(self) -> Job:
        job = heapq.heappop(self._heap)
        self._count(job.priority, -1)
        return job

    def _pop_batch(self) -> list[Job]:
        """The job at the front, and the jobs of its batch queued right behind it at its priority."""
        jobs = [self._pop()]
        batch = jobs[0].batch
        while (
            batch is not None
            and len(jobs) < batch.max_size
            and self._heap
            and self._heap[0].batch is batch
            and self._heap[0].priority == jobs[0].priority
        ):
            jobs.append(self._pop())
        return jobs

    def _count(self, priority: Priority, change: int) -> None:
        self._depth[priority] += change

    def _loop(self) -> None:
        name_os_thread(self._thread.name)
        while True:
            with self._cond:
                while not self._heap and not self._closed:
                    self._cond.wait()
                if not self._heap:
                    return
                jobs = self._pop_batch()
            self._run(jobs)

    def _run(self, jobs: list[Job]) -> None:
        """Runs jobs (one, or one batch) as the innermost running work: nested in another job, it yields by
        its own priority."""
        running = _Running(jobs[0].priority, jobs[0].future)
        with self._cond:
            self._running.append(running)
        try:
            live = [job for job in jobs if self._startable(job)]
            if len(live) == 1:
                self._execute(live[0], running)
            elif live:
                self._execute_batch(live, running)
        finally:
            with self._cond:
                self._running.pop()

    @staticmethod
    def _startable(job: Job) -> bool:
        """False for a job dropped unstarted: its caller is gone, or its deadline passed in the queue."""
        if job.future.cancelled():
            return False
        if job.deadline is not None and time.monotonic() > job.deadline:
            error = DeadlineExceeded(f"{job.op}: deadline passed in queue")
            job.future.get_loop().call_soon_threadsafe(_set_exception, job.future, error)
            return False
        return True

    def _observe(self, op: Op, works: Sequence[int], seconds: float) -> None:
        if self.observer is not None and any(works):
            try:
                self.observer(op, works, seconds)
            except Exception:  # an observer's fault must not take the device thread down
                log.exception("device job observer failed")

    def _execute(self, job: Job, running: _Running) -> None:
        """Runs one job; its time is counted (metrics, observer) before its caller is handed the outcome, so
        whoever sees a job's result sees it counted."""
        fn, future, op = job.fn, job.future, job.op
        job.time.started_ns = time.time_ns()
        self._clock.start()
        try:
            outcome = fn(Yield(self, running)) if job.yields else fn()
            deliver = _set_result
        except BaseException as exc:  # delivered to the awaiting coroutine, never lost on this thread
            log.debug("device job %s failed", op, exc_info=True)
            outcome, deliver = exc, _set_exception
        job.time.ended_ns = time.time_ns()
        own_s = self._clock.stop(op, served=1)
        if deliver is _set_result:
            self._observe(op, (job.work,), own_s)
        future.get_loop().call_soon_threadsafe(deliver, future, outcome)

    def _execute_batch(self, jobs: list[Job], running: _Running) -> None:
        """One pass for every job of a batch; if it fails, each job alone (its own result or error). Batched
        jobs never yield."""
        started_ns = time.time_ns()
        self._clock.start()
        try:
            results = jobs[0].batch.run([job.item for job in jobs])
        except Exception:
            self._clock.stop(jobs[0].op, served=0)
            log.debug("device batch of %d %s jobs failed; running them one by one", len(jobs), jobs[0].op)
            for job in jobs:
                self._execute(job, running)
            return
        self._observe(jobs[0].op, [job.work for job in jobs], self._clock.stop(jobs[0].op, served=len(jobs)))
        metrics.DEVICE_BATCH_SIZE.labels(jobs[0].op).observe(len(jobs))
        ended_ns = time.time_ns()
        for job in jobs:
            job.time.started_ns, job.time.ended_ns, job.time.batch_size = started_ns, ended_ns, len(jobs)
        for job, result in zip(jobs, results, strict=True):
            job.future.get_loop().call_soon_threadsafe(_set_result, job.future, result)


def _set_result(future: asyncio.Future, result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
