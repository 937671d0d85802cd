"""A cached rank run where it is asked, when the device thread is idle (`here_if_idle`).

The scheduler's clauses, on a real `Scheduler`:
- on an idle device, a batched job submitted `here_if_idle` runs at once on the submitting thread: its future
  is done when `submit_batched` returns, and it is counted (relaygr_model_seconds and
  relaygr_model_cpu_seconds under its op, the thread's busy time) and observed as on the device thread;
- a job running, a job queued, or jobs being handed over (`together`) make it queue as any job, and it then
  runs on the device thread;
- while it runs, the device thread starts nothing: a job submitted meanwhile starts after it ends;
- a deadline already passed drops it unrun with DeadlineExceeded, and its error reaches its caller.

The data plane's, on a CPU ranker: a Rank against a ready prefix runs its pass on the event loop's thread
when the device thread is idle and the curve puts the pass within `--inline-rank-max-ms`, else on the
device thread; its scores equal the full recomputation either way.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from services.common.errors import DeadlineExceeded
from services.ranker import metrics
from services.ranker.cache.acquired import Source
from services.ranker.engine.scheduler import Batch, Op, Priority, Scheduler
from tests.exact import assert_scores_equal
from tests.ranker.harness import CANDIDATES, SHORT, blocked, cache_app, events
from tests.support.metrics import metric


class Spy:
    """A batch's `run` that records the thread each call ran on, then answers each item doubled."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def run(self, items: list[int]) -> list[int]:
        self.threads.append(threading.current_thread().name)
        spin_until = time.thread_time() + 0.005  # CPU for the thread's clock to count
        while time.thread_time() < spin_until:
            pass
        return [2 * item for item in items]


def test_on_an_idle_device_the_job_runs_at_once_on_the_submitting_thread_and_is_counted():
    async def scenario():
        observed = []
        worker = Scheduler("test", observer=lambda op, works, seconds: observed.append((op, list(works))))
        try:
            spy = Spy()
            before = (
                metric("relaygr_model_seconds_count", op="rank"),
                metric("relaygr_model_cpu_seconds_total", op="rank"),
                worker.busy_s,
            )
            future = worker.submit_batched(
                21, Batch(spy.run, 8), Priority.RANK, Op.RANK, work=64, here_if_idle=True
            )
            assert future.done()  # nothing to await: it ran inside submit_batched
            assert await future == 42
            assert spy.threads == [threading.current_thread().name]
            assert metric("relaygr_model_seconds_count", op="rank") == before[0] + 1
            assert metric("relaygr_model_cpu_seconds_total", op="rank") >= before[1] + 0.004
            assert worker.busy_s > before[2]
            assert observed == [(Op.RANK, [64])]
        finally:
            worker.close()

    asyncio.run(scenario())


def test_a_running_job_queued_jobs_or_a_hand_over_make_it_queue_and_run_on_the_device_thread():
    async def scenario():
        worker = Scheduler("test", metrics.DEVICE_QUEUE_DEPTH)
        try:
            spy = Spy()
            batch = Batch(spy.run, 8)
            gate = blocked(worker)  # a job running
            running = worker.submit_batched(1, batch, Priority.RANK, Op.RANK, here_if_idle=True)
            assert not running.done()
            queued = worker.submit_batched(2, batch, Priority.RANK, Op.RANK, here_if_idle=True)  # one queued
            assert not queued.done()
            gate.set()
            assert await asyncio.gather(running, queued) == [2, 4]
            with worker.together():  # jobs being handed over
                handed = worker.submit_batched(3, batch, Priority.RANK, Op.RANK, here_if_idle=True)
            assert await handed == 6
            assert spy.threads and set(spy.threads) == {"test"}
        finally:
            worker.close()

    asyncio.run(scenario())


def test_while_it_runs_the_device_thread_starts_nothing():
    async def scenario():
        worker = Scheduler("test")
        log: list[str] = []
        try:
            submitted: list[asyncio.Future] = []

            def run_here(items: list[int]) -> list[int]:
                log.append("here: start")
                submitted.append(worker.submit(lambda: log.append("queued job"), Priority.RANK, Op.PROFILE))
                time.sleep(0.2)  # ample time for an idle device thread to start the queued job
                log.append("here: end")
                return items

            future = worker.submit_batched(7, Batch(run_here, 1), Priority.RANK, Op.RANK, here_if_idle=True)
            assert future.done() and await future == 7
            await submitted[0]
            assert log == ["here: start", "here: end", "queued job"]
        finally:
            worker.close()

    asyncio.run(scenario())


def test_a_passed_deadline_drops_it_unrun_and_its_error_reaches_its_caller():
    async def scenario():
        worker = Scheduler("test")
        try:
            spy = Spy()
            late = worker.submit_batched(
                1, Batch(spy.run, 8), Priority.RANK, Op.RANK, deadline=time.monotonic() - 1, here_if_idle=True
            )
            with pytest.raises(DeadlineExceeded, match="before it started"):
                await late
            assert spy.threads == []

            def fail(items):
                raise KeyError("boom")

            failed = worker.submit_batched(1, Batch(fail, 8), Priority.RANK, Op.RANK, here_if_idle=True)
            with pytest.raises(KeyError, match="boom"):
                await failed
            assert (
                await worker.submit(lambda: 5, Priority.RANK, Op.PROFILE) == 5
            )  # the device thread lives on
        finally:
            worker.close()

    asyncio.run(scenario())


LONG = list(range(1, 49))


@pytest.mark.parametrize(
    ("inline_rank_max_ms", "on_the_loop"), [(10_000.0, True), (1e-9, False), (0.0, False)]
)
def test_a_cached_rank_runs_on_the_loop_when_the_device_is_idle_and_its_pass_is_short(
    inline_rank_max_ms, on_the_loop
):
    """A huge bound puts every pass within it; a tiny one (the curve's rank at 48 events is longer) and 0
    (off) keep every rank on the device thread. The scores are the full recomputation's either way."""

    async def scenario():
        async with cache_app(inline_rank_max_ms=inline_rank_max_ms) as app:
            await app.warm_up()
            assert await app.plane.pre_infer("u", events(LONG))
            while app.cache.productions:
                await asyncio.sleep(0.01)
            ran_on: list[str] = []
            batch = app.runner._rank_batch
            real_run = batch.run

            def spied(items):
                ran_on.append(threading.current_thread().name)
                return real_run(items)

            batch.run = spied
            result = await app.plane.rank("u", events(LONG), events(SHORT), CANDIDATES, "ranker-a", None)
            assert result.source is Source.HBM
            assert ran_on == [threading.current_thread().name if on_the_loop else "device"]
            assert_scores_equal(result.scores, app.runner.full_sync(events(LONG), events(SHORT), CANDIDATES))

    asyncio.run(scenario())
