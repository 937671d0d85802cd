"""What a RankResponse says of its critical path: the long-term events the Rank computed itself
(`computed_prefix_events`) and its wait for the prefix (`prefix_wait_ms`), for every way a prefix is
served."""

from __future__ import annotations

import asyncio

from relaygr.v1 import common_pb2
from tests.ranker.harness import running_ranker
from tests.support.requests import history, pre_infer_request, rank_request

SHORT = [11, 12, 13]
CANDIDATES = [5, 99, 1234, 7]
HBM, DRAM, EXTENDED, MISS = (
    common_pb2.CACHE_SOURCE_HBM, common_pb2.CACHE_SOURCE_DRAM,
    common_pb2.CACHE_SOURCE_EXTENDED, common_pb2.CACHE_SOURCE_MISS,
)  # fmt: skip


def test_each_source_reports_the_prefix_events_its_rank_computed() -> None:
    async def scenario() -> None:
        async with running_ranker() as r:
            long = history(21, 60)
            cold = await r.stub.Rank(rank_request("u21", long, SHORT, CANDIDATES))
            assert (cold.cache_source, cold.computed_prefix_events) == (MISS, 60)
            assert cold.prefix_wait_ms > 0  # it waited for the computation it started
            await r.settle()  # consumed: demoted to DRAM

            reloaded = await r.stub.Rank(rank_request("u21", long, SHORT, CANDIDATES))
            assert (reloaded.cache_source, reloaded.computed_prefix_events) == (DRAM, 0)
            await r.settle()

            grown = await r.stub.Rank(rank_request("u21", history(21, 67), SHORT, CANDIDATES))
            assert (grown.cache_source, grown.computed_prefix_events) == (EXTENDED, 7)
            await r.settle()

            # Relayed: pre-inferred off the critical path, so the Rank computed no prefix event.
            relayed = history(22, 80)
            await r.stub.PreInfer(pre_infer_request("u22", relayed))
            await r.settle()
            hit = await r.stub.Rank(
                rank_request("u22", relayed, SHORT, CANDIDATES, relay_instance="ranker-a")
            )
            assert (hit.cache_source, hit.computed_prefix_events) == (HBM, 0)
            assert 0 <= hit.prefix_wait_ms < cold.prefix_wait_ms + 1000  # a number, not a stale field

    asyncio.run(scenario())


def test_a_rank_with_no_room_to_cache_still_counts_the_prefix_it_computed() -> None:
    async def scenario() -> None:
        # A 64-event prefix of cpu-tiny is 32 KiB: an 8 KiB HBM tier cannot hold it.
        async with running_ranker(hbm_budget_mb=8 / 1024, dram_budget_mb=8 / 1024) as r:
            answer = await r.stub.Rank(rank_request("u23", history(23, 64), SHORT, CANDIDATES))
            assert (answer.cache_source, answer.computed_prefix_events) == (MISS, 64)
            await r.settle()
            assert not r.cache.entries  # computed in full on the Rank's path, and not cached

    asyncio.run(scenario())
