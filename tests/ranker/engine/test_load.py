"""The ranker's load report, carried on every PreInfer answer: the fate of pre-inferred tokens (consumed or
wasted), leased bytes measured on the entries, backlogs from the latency curve, and the final say on a
PreInfer the ranker cannot finish in time."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

from relaygr.v1 import ranker_pb2
from services.ranker.engine.scheduler import Op, Priority
from tests.ranker.harness import running_ranker
from tests.support.metrics import metric
from tests.support.requests import history, pre_infer_request, rank_request

SHORT = [11, 12, 13]
CANDIDATES = [5, 99, 1234]


def test_a_consumed_prefix_counts_its_tokens_as_consumed_and_an_unconsumed_one_as_wasted():
    async def scenario():
        async with running_ranker(lease_ttl_ms=200, sweep_interval_ms=20) as r:
            kv_per_token = r.app.runner.kv_bytes_per_token
            wasted_before = metric("relaygr_pre_infer_tokens_total", fate="wasted")
            consumed_before = metric("relaygr_pre_infer_tokens_total", fate="consumed")
            used, unused = history(1, 48), history(2, 40)
            first = await r.stub.PreInfer(pre_infer_request("u-used", used))
            assert first.load.instance == "ranker-a"
            assert first.load.lease_ttl_ms == 200
            assert first.load.hbm_capacity_bytes == r.cache.hbm.budget_bytes
            second = await r.stub.PreInfer(pre_infer_request("u-unused", unused))
            # Held for the two prefixes: the first's reservation or leased entry, and the second's.
            assert second.load.leased_bytes == (48 + 40) * kv_per_token
            await r.settle()
            assert r.cache.leases.held_bytes() == (48 + 40) * kv_per_token  # measured on the tensors
            await r.stub.Rank(rank_request("u-used", used, SHORT, CANDIDATES, relay_instance="ranker-a"))
            await asyncio.sleep(0.5)  # the unused lease expires and the sweep ends it
            report = r.app.plane.load_report()
            assert (report.pre_infer_consumed_tokens, report.pre_infer_wasted_tokens) == (48, 40)
            assert report.leased_bytes == 0
            assert report.pre_infer_wasted_ms == r.cache.load.cost_ms("pre_infer_ms", 40) > 0
            assert metric("relaygr_pre_infer_tokens_total", fate="consumed") - consumed_before == 48
            assert metric("relaygr_pre_infer_tokens_total", fate="wasted") - wasted_before == 40
            # Leasing a consumed prefix again (from HBM, or reloaded from DRAM after its demotion) computes
            # nothing: when that lease expires unconsumed, no tokens are wasted.
            again = await r.stub.PreInfer(pre_infer_request("u-used", used))
            assert again.outcome in (
                ranker_pb2.PRE_INFER_OUTCOME_ALREADY_CACHED, ranker_pb2.PRE_INFER_OUTCOME_RELOADED,
            )  # fmt: skip
            await asyncio.sleep(0.5)
            assert r.app.plane.load_report().pre_infer_wasted_tokens == 40

    asyncio.run(scenario())


def test_backlogs_count_work_in_flight_and_return_to_zero():
    async def scenario():
        async with running_ranker() as r:
            load = r.cache.load
            answer = await r.stub.PreInfer(pre_infer_request("u1", history(1, 64)))
            # The answer comes as soon as the work is accepted: its cost is in the backlog it reports.
            assert answer.load.pre_infer_backlog_ms == load.cost_ms("pre_infer_ms", 64) > 0
            assert answer.load.device_busy_ms > 0  # the warm-up ran on the device thread
            await r.settle()
            await r.stub.Rank(rank_request("u2", history(2, 64), SHORT, CANDIDATES))  # a miss
            report = r.app.plane.load_report()
            assert report.pre_infer_backlog_ms == report.rank_backlog_ms == 0.0
            assert 0.0 <= report.busy_fraction <= 1.0

    asyncio.run(scenario())


def test_a_pre_infer_queued_behind_a_full_backlog_is_refused_before_any_work():
    """A PreInfer is refused only when what is queued ahead of it fills the bound, so it could save its Rank
    nothing; its own length does not count: one that starts in time saves what it finishes."""

    async def scenario():
        async with running_ranker() as r:
            r.cache.max_pre_infer_backlog_ms = r.cache.load.cost_ms("pre_infer_ms", 64) * 0.5
            before = metric("relaygr_productions_total", kind="compute")
            gate = threading.Event()  # holds the device thread, so the first production stays queued
            held = r.app.worker.submit(lambda: gate.wait(10), Priority.RANK, Op.PROFILE)
            first = await r.stub.PreInfer(pre_infer_request("u1", history(1, 64)))  # longer than the bound
            second = await r.stub.PreInfer(pre_infer_request("u2", history(2, 64)))
            gate.set()
            await held
            assert first.outcome == ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED
            assert second.outcome == ranker_pb2.PRE_INFER_OUTCOME_REJECTED_BACKLOG
            assert second.cache_bytes == 0
            assert metric("relaygr_productions_total", kind="compute") - before == 1
            await r.settle()
            third = await r.stub.PreInfer(pre_infer_request("u2", history(2, 64)))
            assert third.outcome == ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED  # the first one finished

    asyncio.run(scenario())


def test_a_provisional_curve_refuses_no_pre_infer_and_sheds_no_rank():
    """A curve measured disturbed may read every path far too slow: neither the backlog bound nor deadline
    shedding refuses work on its predictions."""

    async def scenario():
        async with running_ranker() as r:
            calibration = r.app.calibration
            slow = [dataclasses.replace(p, pre_infer_ms=p.pre_infer_ms * 1e4, rank_ms=p.rank_ms * 1e4)
                    for p in calibration.curve.points]  # fmt: skip
            calibration.set_curve(
                dataclasses.replace(calibration.curve, points=tuple(slow), provisional=True)
            )
            r.cache.max_pre_infer_backlog_ms = r.cache.load.cost_ms("pre_infer_ms", 64) * 0.5
            gate = threading.Event()
            held = r.app.worker.submit(lambda: gate.wait(10), Priority.RANK, Op.PROFILE)
            first = await r.stub.PreInfer(pre_infer_request("u1", history(1, 64)))
            second = await r.stub.PreInfer(pre_infer_request("u2", history(2, 64)))
            gate.set()
            await held
            assert (first.outcome, second.outcome) == (ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED,) * 2
            deadline_s = calibration.predict_ms("rank_ms", 64) / 1000 / 10  # a tenth of the slow prediction
            assert deadline_s > 1  # still ample for the real pass
            await r.settle()
            answer = await r.stub.Rank(
                rank_request("u1", history(1, 64), SHORT, CANDIDATES), timeout=deadline_s
            )
            assert len(answer.scores) == len(CANDIDATES)

    asyncio.run(scenario())
