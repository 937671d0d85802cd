"""A ranker refuses what it cannot serve in time before doing any of the work, and says so at once.

An in-process ranker on loopback, whose device thread the test holds busy with a job of its own: whatever
comes back while the device is held was decided without touching it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator

import grpc
import pytest

from relaygr.v1 import common_pb2, ranker_pb2
from services.ranker.config import RankerConfig
from services.ranker.engine.scheduler import FOR_RANKS, MODEL_PASSES, Priority
from tests.ranker.harness import Ranker, running_ranker
from tests.support.metrics import metric
from tests.support.polling import eventually
from tests.support.requests import history, pre_infer_request, rank_request

SHORT = [1, 2, 3]
CANDIDATES = [7, 8, 9]


class HeldDevice:
    """Occupies a ranker's device thread until released."""

    def __init__(self, ranker: Ranker) -> None:
        self._release = threading.Event()
        self._started = threading.Event()

        def hold() -> None:
            self._started.set()
            self._release.wait()

        self.done = ranker.app.worker.submit(hold, Priority.RANK, "hold")

    async def started(self) -> None:
        await eventually(self._started.is_set)

    async def release(self) -> None:
        self._release.set()
        await self.done


@contextlib.asynccontextmanager
async def held_ranker(**overrides) -> AsyncIterator[tuple[Ranker, HeldDevice]]:
    """A running ranker (BASE with `overrides`) whose device thread is busy until `held.release()`."""
    async with running_ranker(**overrides) as ranker:
        held = HeldDevice(ranker)
        await held.started()
        yield ranker, held


def run(coro):
    return asyncio.run(coro)


def model_passes() -> float:
    """Model passes of every kind the device thread ran: prefixes computed or extended, ranks."""
    return sum(metric("relaygr_model_seconds_count", op=op) for op in MODEL_PASSES)


def test_a_rank_beyond_the_queue_bound_is_refused_while_the_device_is_busy():
    async def scenario():
        async with held_ranker(max_queued_ranks=2) as (r, held):
            before = metric("relaygr_shed_requests_total", method="Rank", reason="queue_full")
            queued = [
                asyncio.ensure_future(r.stub.Rank(rank_request(f"q{i}", history(i, 32), SHORT, CANDIDATES)))
                for i in range(2)
            ]
            await eventually(lambda: r.app.worker.queued(*FOR_RANKS) == 2)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await r.stub.Rank(rank_request("late", history(9, 32), SHORT, CANDIDATES), timeout=10)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "rank queue is full" in refused.value.details()
            assert not held.done.done()  # answered while the device was still held
            assert metric("relaygr_shed_requests_total", method="Rank", reason="queue_full") == before + 1
            await held.release()
            answers = await asyncio.gather(*queued)
            assert all(len(a.scores) == len(CANDIDATES) for a in answers)

    run(scenario())


def test_a_rank_whose_deadline_passes_in_the_queue_costs_no_model_work():
    async def scenario():
        async with held_ranker() as (r, held):
            passes = model_passes()
            with pytest.raises(grpc.aio.AioRpcError) as late:
                await r.stub.Rank(rank_request("gone", history(1, 64), SHORT, CANDIDATES), timeout=0.3)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await held.release()
            await r.settle()
            # Neither the prefix the Rank started nor its scoring ran, and nothing stays reserved.
            assert model_passes() == passes
            assert r.cache.hbm.used_bytes == 0 and not r.cache.entries
            # The ranker serves the same user normally afterwards.
            answer = await r.stub.Rank(rank_request("gone", history(1, 64), SHORT, CANDIDATES), timeout=10)
            assert len(answer.scores) == len(CANDIDATES)

    run(scenario())


def test_a_rank_that_joins_a_pre_inference_is_not_starved_by_ranks_arriving_after_it():
    async def scenario():
        async with held_ranker() as (r, held):
            relayed = history(1, 256)
            answer = await r.stub.PreInfer(pre_infer_request("relayed", relayed))
            assert answer.outcome == ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED  # queued as background work
            finished: list[str] = []

            async def rank(user: str, long: list[int]) -> None:
                await r.stub.Rank(rank_request(user, long, SHORT, CANDIDATES), timeout=30)
                finished.append(user)

            others = [asyncio.ensure_future(rank(f"other-{i}", history(10 + i, 256))) for i in range(3)]
            await eventually(lambda: r.app.worker.queued(Priority.AWAITED) == 3)  # three misses
            joins = metric("relaygr_production_joins_total")
            joined = asyncio.ensure_future(rank("relayed", relayed))
            await eventually(lambda: metric("relaygr_production_joins_total") == joins + 1)
            assert r.app.worker.queued(Priority.PRE_INFER) == 0  # the shared pre-inference moved up
            await held.release()
            await asyncio.gather(joined, *others)
            # Promoted to AWAITED, the shared pre-inference runs before the misses queued after it.
            assert finished.index("relayed") < finished.index("other-2"), finished

    run(scenario())


def test_a_joined_pre_inference_stops_yielding_even_when_it_runs_inside_another():
    async def scenario():
        async with running_ranker(pre_infer_chunk_tokens=16) as r:
            served: list[str] = []
            stop = asyncio.Event()

            async def flood(lane: int) -> None:  # keeps ranks queued, so background work keeps yielding
                for n in range(10_000):
                    if stop.is_set():
                        return
                    user = f"flood-{lane}-{n}"
                    await r.stub.Rank(rank_request(user, history(100 + n, 32), SHORT, CANDIDATES), timeout=30)
                    served.append(user)

            lanes = [asyncio.ensure_future(flood(lane)) for lane in range(3)]
            await eventually(lambda: len(served) > 10)
            # Two background pre-inferences: the first runs, the second waits behind it.
            for user, seed in (("first", 1), ("second", 2)):
                accepted = await r.stub.PreInfer(pre_infer_request(user, history(seed, 1024)))
                assert accepted.outcome == ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED, user
            # A Rank joins the second: promoted, it runs at rank priority inside the first's yield and
            # must not yield in turn to every flood rank that arrives meanwhile.
            at_join = len(served)
            joined = rank_request("second", history(2, 1024), SHORT, CANDIDATES)
            answer = await r.stub.Rank(joined, timeout=30)
            overtaken = len(served) - at_join
            stop.set()
            await asyncio.gather(*lanes)
            assert answer.cache_source == common_pb2.CACHE_SOURCE_HBM
            assert overtaken < 20, f"{overtaken} later ranks overtook the joined pre-inference"

    run(scenario())


def test_pre_inference_beyond_the_pending_bound_is_refused_as_overload_and_starts_nothing():
    pending = RankerConfig.max_pending_pre_infer  # the shipped default bound

    async def scenario():
        async with running_ranker() as r:
            assert r.app.config.max_pending_pre_infer == pending
            held = HeldDevice(r)
            await held.started()
            refused = metric("relaygr_pre_infer_total", outcome="rejected_overload")
            passes = model_passes()
            accepted = [
                await r.stub.PreInfer(pre_infer_request(f"p{i}", history(i, 48))) for i in range(pending)
            ]
            assert [a.outcome for a in accepted] == [ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED] * pending
            late = await r.stub.PreInfer(pre_infer_request("late", history(pending, 48)))
            assert late.outcome == ranker_pb2.PRE_INFER_OUTCOME_REJECTED_OVERLOAD
            assert late.cache_bytes == 0
            assert metric("relaygr_pre_infer_total", outcome="rejected_overload") == refused + 1
            # Only the accepted productions exist, reserving only their bytes.
            assert len(r.cache.productions) == pending
            assert r.cache.hbm.used_bytes == pending * 48 * r.app.runner.kv_bytes_per_token
            # A Rank of the refused user is still served, in full (the cache never fails a Rank).
            ranking = asyncio.ensure_future(
                r.stub.Rank(rank_request("late", history(pending, 48), SHORT, CANDIDATES))
            )
            await held.release()
            ranked = await ranking
            assert ranked.cache_source == common_pb2.CACHE_SOURCE_MISS
            await r.settle()
            # The accepted pre-inferences and the refused user's miss (its prefix and its rank) ran, no more.
            assert model_passes() == passes + pending + 2
            # The bound frees as productions finish: the next PreInfer is accepted again.
            again = await r.stub.PreInfer(pre_infer_request("again", history(pending + 1, 48)))
            assert again.outcome == ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED

    run(scenario())
