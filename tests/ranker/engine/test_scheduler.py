"""The scheduler's contract: one device thread runs every job, most urgent first.

Each test states one clause, observed on a real `Scheduler` whose thread is held (`blocked`) while jobs
queue, so that the order is decided by the scheduler alone:

- priorities: RANK before AWAITED before RELOAD before PRE_INFER; FIFO within a priority;
- every job runs on the scheduler's own thread, one at a time; its result or error reaches its future, and
  an error does not stop the thread;
- a yielding job (`submit_yielding`) is handed a `Yield`; calling it runs every queued job more urgent than
  that job, and only those, in order, before the job goes on: a rank waits for one step of a long job;
- a job run at a `Yield` yields in turn by its own priority;
- a `Yield` works only for its own job while that job runs;
- `promote` raises a queued job (never lowers it): it runs in its new priority's FIFO place; a running
  job that is promoted stops yielding to jobs of that priority; a finished job is left alone;
- a job whose deadline passed in the queue fails with DeadlineExceeded, and one whose future was cancelled
  is dropped, both before any of its work starts;
- jobs of a `Batch` queued right behind one another at one priority run as one `Batch.run`, up to
  `max_size`; other jobs and other priorities split them;
- a batch that fails is run again one job at a time: each caller gets its own result or error;
- `queued(*priorities)` counts the jobs waiting at those priorities (`FOR_RANKS`, the bound of
  `--max-queued-ranks`, is RANK and AWAITED), and the queue-depth gauge follows it;
- metrics: each job served counts once in relaygr_model_seconds under its op (a batch's jobs with equal
  shares of the pass), each batch pass once in relaygr_device_batch_size; a dropped job counts nowhere;
- `close` runs what is queued and stops the thread; nothing can be submitted after;
- jobs submitted inside `together` are handed over on its exit, all at once, with one wake-up of the
  thread, and then run as if submitted one by one.

The runner's side of the bounded wait (it calls its `Yield` between two chunks of a prefix, on the CPU and
with asynchronous streams) is in test_streams.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.errors import DeadlineExceeded
from services.ranker import metrics
from services.ranker.engine.scheduler import FOR_RANKS, Batch, Op, Priority, Scheduler, Yield
from tests.ranker.harness import blocked
from tests.support.metrics import metric

PRIORITIES = st.sampled_from(list(Priority))


@contextlib.asynccontextmanager
async def scheduler():
    worker = Scheduler("test", metrics.DEVICE_QUEUE_DEPTH)
    try:
        yield worker
    finally:
        worker.close()


def recorder(log: list, name) -> Callable[[], object]:
    """A job that appends `name` to `log` when it runs, and returns `name`."""

    def job():
        log.append(name)
        return name

    return job


def test_the_priorities_are_ranks_then_awaited_prefixes_then_reloads_then_pre_inference():
    assert sorted(Priority) == [Priority.RANK, Priority.AWAITED, Priority.RELOAD, Priority.PRE_INFER]
    assert FOR_RANKS == (Priority.RANK, Priority.AWAITED)


@settings(max_examples=40, deadline=None)
@given(priorities=st.lists(PRIORITIES, min_size=1, max_size=24))
def test_queued_jobs_run_most_urgent_first_and_in_submission_order_within_a_priority(priorities):
    async def scenario():
        log: list[int] = []
        async with scheduler() as worker:
            gate = blocked(worker)
            futures = [worker.submit(recorder(log, i), p, Op.PROFILE) for i, p in enumerate(priorities)]
            gate.set()
            assert await asyncio.gather(*futures) == list(range(len(priorities)))
        assert log == sorted(range(len(priorities)), key=lambda i: (priorities[i], i))

    asyncio.run(scenario())


def test_jobs_run_on_the_scheduler_thread_and_their_errors_reach_their_callers():
    async def scenario():
        threads: list[threading.Thread] = []
        async with scheduler() as worker:

            def fail():
                threads.append(threading.current_thread())
                raise KeyError("boom")

            def succeed():
                threads.append(threading.current_thread())
                return 42

            failed = worker.submit(fail, Priority.RANK, Op.PROFILE)
            with pytest.raises(KeyError, match="boom"):
                await failed
            assert await worker.submit(succeed, Priority.RANK, Op.PROFILE) == 42  # the thread lives on
        assert threads[0] is threads[1] is not threading.current_thread()
        assert threads[0].name == "test"

    asyncio.run(scenario())


class LongJob:
    """A yielding job of `steps` steps, logged as `name@step`, that yields between two steps and holds its
    first step (`started` is set) until `gate` is set."""

    def __init__(self, log: list, steps: int, name: str = "long") -> None:
        self.log, self.steps, self.name = log, steps, name
        self.started, self.gate = threading.Event(), threading.Event()

    def __call__(self, yield_: Yield) -> str:
        for step in range(self.steps):
            if step:
                yield_()
            self.log.append(f"{self.name}@{step}")
            if step == 0:
                self.started.set()
                assert self.gate.wait(10)
        return self.name


@settings(max_examples=30, deadline=None)
@given(own=PRIORITIES, queued=st.lists(PRIORITIES, max_size=12))
def test_a_yield_runs_every_queued_job_more_urgent_than_its_own_and_only_those(own, queued):
    async def scenario():
        log: list = []
        job = LongJob(log, steps=3)
        async with scheduler() as worker:
            long = worker.submit_yielding(job, own, Op.PRE_INFER)
            assert job.started.wait(10)
            futures = [worker.submit(recorder(log, i), p, Op.PROFILE) for i, p in enumerate(queued)]
            job.gate.set()
            await asyncio.gather(long, *futures)
        more_urgent = sorted((i for i, p in enumerate(queued) if p < own), key=lambda i: (queued[i], i))
        the_rest = sorted((i for i, p in enumerate(queued) if p >= own), key=lambda i: (queued[i], i))
        # Everything more urgent ran at the first yield, before the second step; nothing else came in between.
        assert log == ["long@0", *more_urgent, "long@1", "long@2", *the_rest]

    asyncio.run(scenario())


def test_a_job_run_at_a_yield_yields_by_its_own_priority():
    """A pre-inference yields to a miss's prefix, which runs in it and yields to a rank, and not to a reload:
    the reload waits for the miss to finish, then runs at the pre-inference's yield."""

    async def scenario():
        log: list = []
        outer, inner = LongJob(log, steps=2, name="pre-infer"), LongJob(log, steps=2, name="miss")
        async with scheduler() as worker:
            background = worker.submit_yielding(outer, Priority.PRE_INFER, Op.PRE_INFER)
            assert outer.started.wait(10)
            miss = worker.submit_yielding(inner, Priority.AWAITED, Op.PRE_INFER)
            outer.gate.set()
            assert inner.started.wait(10)
            reload = worker.submit(recorder(log, "reload"), Priority.RELOAD, Op.RELOAD)
            rank = worker.submit(recorder(log, "rank"), Priority.RANK, Op.RANK)
            inner.gate.set()
            await asyncio.gather(background, miss, reload, rank)
        assert log == ["pre-infer@0", "miss@0", "rank", "miss@1", "reload", "pre-infer@1"]

    asyncio.run(scenario())


def test_a_yield_works_only_for_its_own_job_while_it_runs():
    async def scenario():
        kept: list[Yield] = []
        async with scheduler() as worker:
            await worker.submit_yielding(kept.append, Priority.PRE_INFER, Op.PRE_INFER)
            with pytest.raises(RuntimeError, match="Yield"):
                kept[0]()  # off the device thread
            with pytest.raises(RuntimeError, match="Yield"):
                await worker.submit(kept[0], Priority.RANK, Op.PROFILE)  # its job is over

    asyncio.run(scenario())


@settings(max_examples=40, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(PRIORITIES, st.lists(PRIORITIES, max_size=2)),  # a job's priority, the promotions it gets
        min_size=1,
        max_size=16,
    )
)
def test_a_promoted_queued_job_takes_its_fifo_place_at_the_higher_priority_and_is_never_lowered(jobs):
    async def scenario():
        log: list[int] = []
        async with scheduler() as worker:
            gate = blocked(worker)
            futures = [worker.submit(recorder(log, i), p, Op.PROFILE) for i, (p, _) in enumerate(jobs)]
            for future, (_, promotions) in zip(futures, jobs, strict=True):
                for target in promotions:
                    worker.promote(future, target)
            depths = [worker.queued(priority) for priority in Priority]
            gate.set()
            await asyncio.gather(*futures)
        effective = [min([p, *promotions]) for p, promotions in jobs]
        assert depths == [effective.count(priority) for priority in Priority]
        assert log == sorted(range(len(jobs)), key=lambda i: (effective[i], i))

    asyncio.run(scenario())


def test_a_promoted_running_job_stops_yielding_to_jobs_of_its_new_priority():
    async def scenario():
        log: list = []
        job = LongJob(log, steps=2)
        async with scheduler() as worker:
            long = worker.submit_yielding(job, Priority.PRE_INFER, Op.PRE_INFER)
            assert job.started.wait(10)
            worker.promote(long, Priority.AWAITED)
            others = [
                worker.submit(recorder(log, p.name), p, Op.PROFILE)
                for p in (Priority.PRE_INFER, Priority.RELOAD, Priority.AWAITED, Priority.RANK)
            ]
            job.gate.set()
            await asyncio.gather(long, *others)
            assert log == ["long@0", "RANK", "long@1", "AWAITED", "RELOAD", "PRE_INFER"]
            worker.promote(long, Priority.RANK)  # finished: nothing to do
            assert all(worker.queued(p) == 0 for p in Priority)

    asyncio.run(scenario())


def test_a_job_past_its_deadline_or_cancelled_is_dropped_before_it_starts():
    async def scenario():
        log: list[str] = []
        passes = metric("relaygr_model_seconds_count", op="profile")
        async with scheduler() as worker:
            gate = blocked(worker)
            passes += 1  # the job holding the thread
            late = worker.submit(recorder(log, "late"), Priority.RANK, Op.PROFILE, deadline=0.0)
            cancelled = worker.submit(recorder(log, "cancelled"), Priority.RANK, Op.PROFILE)
            long = worker.submit_yielding(
                lambda _: log.append("long"), Priority.AWAITED, Op.PROFILE, deadline=0.0
            )
            on_time = worker.submit(
                recorder(log, "on time"), Priority.RANK, Op.PROFILE, deadline=float("inf")
            )
            cancelled.cancel()
            gate.set()
            with pytest.raises(DeadlineExceeded, match="deadline passed in queue"):
                await late
            with pytest.raises(DeadlineExceeded):
                await long
            assert await on_time == "on time"
            assert cancelled.cancelled()
        assert log == ["on time"]
        assert metric("relaygr_model_seconds_count", op="profile") - passes == 1  # dropped jobs count nowhere

    asyncio.run(scenario())


def test_queued_jobs_of_one_batch_run_together_up_to_its_size():
    async def scenario():
        calls: list[list[int]] = []

        def run(items: list[int]) -> list[int]:
            calls.append(list(items))
            return [item * 10 for item in items]

        batch = Batch(run, max_size=3)
        async with scheduler() as worker:
            gate = blocked(worker)
            futures = [worker.submit_batched(i, batch, Priority.RANK, Op.RANK) for i in range(4)]
            alone = worker.submit(lambda: "alone", Priority.RANK, Op.RANK)
            later = worker.submit_batched(9, batch, Priority.RANK, Op.RANK)
            gate.set()
            results = await asyncio.gather(*futures, alone, later)
        assert results == [0, 10, 20, 30, "alone", 90]
        # FIFO is kept: a batch takes only the jobs of its batch queued right behind its first job.
        assert calls == [[0, 1, 2], [3], [9]]

    asyncio.run(scenario())


@settings(max_examples=40, deadline=None)
@given(
    jobs=st.lists(st.tuples(st.sampled_from(["a", "b", None]), PRIORITIES), min_size=1, max_size=20),
    sizes=st.tuples(st.integers(1, 4), st.integers(1, 4)),
)
def test_a_batch_takes_the_jobs_of_its_batch_right_behind_it_at_its_priority(jobs, sizes):
    async def scenario():
        passes: list[tuple] = []

        def batch_of(name: str) -> Callable[[list[int]], list[int]]:
            def run(items: list[int]) -> list[int]:
                passes.append((name, *items))
                return [-item for item in items]

            return run

        batches = {name: Batch(batch_of(name), size) for name, size in zip("ab", sizes, strict=True)}
        async with scheduler() as worker:
            gate = blocked(worker)
            futures = [
                worker.submit_batched(i, batches[name], p, Op.RANK)
                if name
                else worker.submit(lambda i=i: passes.append((None, i)) or -i, p, Op.RANK)
                for i, (name, p) in enumerate(jobs)
            ]
            gate.set()
            assert await asyncio.gather(*futures) == [-i for i in range(len(jobs))]
        # The queue's order, cut after every job but those of one batch, at one priority, up to its size.
        expected: list[tuple] = []
        for i in sorted(range(len(jobs)), key=lambda i: (jobs[i][1], i)):
            name, priority = jobs[i]
            last = expected[-1] if expected else ()
            joins = (
                name is not None
                and last[:1] == (name,)
                and jobs[last[-1]][1] == priority
                and len(last) - 1 < batches[name].max_size
            )
            if joins:
                expected[-1] = (*last, i)
            else:
                expected.append((name, i))
        assert passes == expected

    asyncio.run(scenario())


def test_a_failed_batch_gives_each_job_its_own_result_or_error():
    async def scenario():
        calls: list[list[int]] = []

        def run(items: list[int]) -> list[int]:
            calls.append(list(items))
            if any(item < 0 for item in items):
                raise ValueError(f"negative item in {items}")
            return [item + 1 for item in items]

        batch = Batch(run, max_size=8)
        async with scheduler() as worker:
            gate = blocked(worker)
            futures = [worker.submit_batched(i, batch, Priority.RANK, Op.RANK) for i in (1, -1, 2)]
            gate.set()
            results = await asyncio.gather(*futures, return_exceptions=True)
        assert results[0] == 2 and results[2] == 3
        assert isinstance(results[1], ValueError) and "[-1]" in str(results[1])
        assert calls == [[1, -1, 2], [1], [-1], [2]]

    asyncio.run(scenario())


def test_a_job_past_its_deadline_leaves_the_batch_unstarted():
    async def scenario():
        seen: list[list[int]] = []
        batch = Batch(lambda items: seen.append(items) or items, max_size=8)
        async with scheduler() as worker:
            gate = blocked(worker)
            on_time = worker.submit_batched(1, batch, Priority.RANK, Op.RANK)
            late = worker.submit_batched(2, batch, Priority.RANK, Op.RANK, deadline=0.0)
            also = worker.submit_batched(3, batch, Priority.RANK, Op.RANK)
            gate.set()
            results = await asyncio.gather(on_time, late, also, return_exceptions=True)
        assert results[0] == 1 and results[2] == 3
        assert isinstance(results[1], DeadlineExceeded)
        assert seen == [[1, 3]]

    asyncio.run(scenario())


def test_a_batch_holds_at_least_one_job():
    with pytest.raises(ValueError, match="at least one"):
        Batch(lambda items: items, max_size=0)


def test_queued_counts_the_jobs_waiting_at_given_priorities_and_the_gauge_follows():
    def gauge(priority: Priority) -> float:
        return metric("relaygr_device_queue_depth", priority=priority.name.lower())

    async def scenario():
        async with scheduler() as worker:
            gate = blocked(worker)
            assert worker.queued(*Priority) == 0  # the running job is not waiting
            futures = [
                worker.submit(lambda: None, p, Op.PROFILE)
                for p in (
                    Priority.RANK,
                    Priority.AWAITED,
                    Priority.AWAITED,
                    Priority.RELOAD,
                    Priority.PRE_INFER,
                )
            ]
            assert worker.queued(*FOR_RANKS) == 3
            assert (worker.queued(Priority.RELOAD), worker.queued(Priority.PRE_INFER)) == (1, 1)
            worker.promote(futures[-1], Priority.AWAITED)
            assert worker.queued(*FOR_RANKS) == 4 and worker.queued(Priority.PRE_INFER) == 0
            assert [gauge(p) for p in Priority] == [1, 3, 1, 0]
            gate.set()
            await asyncio.gather(*futures)
            assert worker.queued(*Priority) == 0
            assert [gauge(p) for p in Priority] == [0, 0, 0, 0]

    asyncio.run(scenario())


def test_each_job_served_counts_once_under_its_op_and_each_batch_pass_once():
    def counts() -> tuple[float, float, float, float]:
        return (
            metric("relaygr_model_seconds_count", op="rank"),
            metric("relaygr_model_seconds_count", op="extend"),
            metric("relaygr_device_batch_size_count", op="rank"),
            metric("relaygr_device_batch_size_sum", op="rank"),
        )

    async def scenario():
        batch = Batch(lambda items: items, max_size=8)
        failing = Batch(lambda items: 1 / 0, max_size=8)
        before = counts()
        async with scheduler() as worker:
            gate = blocked(worker)
            ranks = [worker.submit_batched(i, batch, Priority.RANK, Op.RANK) for i in range(3)]
            extend = worker.submit_yielding(lambda yield_: yield_(), Priority.AWAITED, Op.EXTEND)
            failed = [worker.submit_batched(i, failing, Priority.RELOAD, Op.RANK) for i in range(2)]
            gate.set()
            await asyncio.gather(*ranks, extend, *failed, return_exceptions=True)
        ranks_served, extends, batch_passes, batched_jobs = (
            a - b for a, b in zip(counts(), before, strict=True)
        )
        # Three ranks in one pass, two more that failed together and were then run (and failed) alone.
        assert (ranks_served, extends, batch_passes, batched_jobs) == (5, 1, 1, 3)

    asyncio.run(scenario())


def test_whoever_sees_a_job_result_sees_its_time_in_the_thread_busy_time():
    """A load report read right after a job's answer (the warm-up's, before the first PreInfer) counts the
    job's time: the thread's busy time is counted before the caller is handed the outcome, for a job, a
    batch, and a job with another run at its yield (counted once, inside its outer job)."""

    async def scenario():
        batch = Batch(lambda items: [time.sleep(0.02) or item for item in items], max_size=8)
        async with scheduler() as worker:
            await worker.submit(lambda: time.sleep(0.05), Priority.RANK, Op.PROFILE)
            assert worker.busy_s >= 0.05
            gate = blocked(worker)
            ranks = [worker.submit_batched(i, batch, Priority.RANK, Op.RANK) for i in range(2)]
            gate.set()
            await asyncio.gather(*ranks)
            after_batch = worker.busy_s
            assert after_batch >= 0.07

            def outer(yield_) -> None:
                time.sleep(0.02)
                yield_()  # runs the rank queued meanwhile: 0.1 s inside this job's time
                time.sleep(0.02)

            started = asyncio.Event()
            loop = asyncio.get_running_loop()

            def first_half(yield_) -> None:
                loop.call_soon_threadsafe(started.set)
                time.sleep(0.05)  # the rank below is queued by now
                outer(yield_)

            job = worker.submit_yielding(first_half, Priority.PRE_INFER, Op.PRE_INFER)
            await started.wait()
            nested = worker.submit(lambda: time.sleep(0.1), Priority.RANK, Op.RANK)
            await nested
            await job
            # 0.05 + 0.02 + 0.1 + 0.02: the rank once (counted twice, it would read 0.29 or more)
            assert 0.19 <= worker.busy_s - after_batch < 0.27

    asyncio.run(scenario())


def test_close_runs_what_is_queued_then_refuses_new_jobs():
    async def scenario():
        log: list[int] = []
        worker = Scheduler("test")
        gate = blocked(worker)
        futures = [worker.submit(recorder(log, i), Priority.PRE_INFER, Op.PROFILE) for i in range(3)]
        closer = threading.Thread(target=worker.close)
        closer.start()
        gate.set()
        await asyncio.to_thread(closer.join)
        assert log == [0, 1, 2]  # close returned once the jobs queued before it had run
        assert await asyncio.gather(*futures) == [0, 1, 2]
        with pytest.raises(RuntimeError, match="closed"):
            worker.submit(lambda: None, Priority.RANK, Op.PROFILE)

    asyncio.run(scenario())


def burn(cpu_s: float) -> None:
    """Spends `cpu_s` of this thread's CPU time."""
    until = time.thread_time() + cpu_s
    while time.thread_time() < until:
        pass


def test_each_job_counts_its_own_cpu_time_and_not_the_jobs_run_at_its_yield():
    """relaygr_model_cpu_seconds is what bench.micro.serving subtracts as the model: a rank run between two
    chunks of a pre-inference is counted once, as a rank, so the per-op sums add up to the thread's time in
    jobs."""

    def cpu(op: Op) -> float:
        return metric("relaygr_model_cpu_seconds_total", op=op.value)

    async def scenario():
        async with scheduler() as worker:
            started, rank_queued = threading.Event(), threading.Event()

            def pre_infer(yield_) -> None:
                started.set()
                burn(0.03)
                assert rank_queued.wait(10)
                yield_()  # the rank runs here, nested
                burn(0.03)

            before = cpu(Op.PRE_INFER), cpu(Op.RANK)
            outer = worker.submit_yielding(pre_infer, Priority.PRE_INFER, Op.PRE_INFER)
            assert await asyncio.to_thread(started.wait, 10)
            nested = worker.submit(lambda: burn(0.05), Priority.RANK, Op.RANK)
            rank_queued.set()
            await asyncio.gather(outer, nested)
            pre_infer_s, rank_s = cpu(Op.PRE_INFER) - before[0], cpu(Op.RANK) - before[1]
        assert 0.05 <= rank_s < 0.07
        assert 0.06 <= pre_infer_s < 0.08  # its own two steps, without the rank's 0.05

    asyncio.run(scenario())


@settings(max_examples=30, deadline=None)
@given(priorities=st.lists(PRIORITIES, min_size=1, max_size=12))
def test_jobs_submitted_together_are_handed_over_at_once(priorities):
    """Inside `together`, nothing reaches the queue; on exit the jobs are queued at once with one wake-up of
    the thread, and run in the order they would have run submitted one by one."""

    async def scenario():
        log: list[int] = []
        async with scheduler() as worker:
            before = blocked(worker)  # so that the order below is the scheduler's alone
            wakes = []
            notify = worker._cond.notify
            worker._cond.notify = lambda *args: (wakes.append(1), notify(*args))
            with worker.together():
                futures = [worker.submit(recorder(log, i), p, Op.PROFILE) for i, p in enumerate(priorities)]
                with worker.together():  # nested: the outermost hands over
                    futures.append(
                        worker.submit(recorder(log, len(priorities)), Priority.PRE_INFER, Op.PROFILE)
                    )
                assert worker.queued(*Priority) == 0 and wakes == []
            assert worker.queued(*Priority) == len(futures) and wakes == [1]
            before.set()
            assert await asyncio.gather(*futures) == list(range(len(futures)))
        order = [*priorities, Priority.PRE_INFER]
        assert log == sorted(range(len(order)), key=lambda i: (order[i], i))

    asyncio.run(scenario())
