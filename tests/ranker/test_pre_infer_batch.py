"""RankerService.PreInferBatch over loopback gRPC: each entry answered as the same PreInfer alone, a bad entry
refused by its own field, the batch refused whole only for its size, the entries' device jobs handed over
together, and the prefixes it produced served to their Ranks exactly."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest

from relaygr.v1 import common_pb2, ranker_pb2
from services.ranker.engine.latency_curve import LatencyPoint
from tests.exact import assert_scores_equal
from tests.ranker.harness import blocked, running_ranker
from tests.support.metrics import metric
from tests.support.requests import history, pre_infer_request, rank_request

SHORT = [11, 12, 13]
CANDIDATES = [5, 99, 1234, 7, 42]
# cpu-tiny holds 512 KV bytes per event: 256 KiB hold the 40-event prefixes, never a 600-event one.
HBM_BUDGET_MB = 0.25
# A fixed curve on which a 40-event pre-inference costs 100 ms of device time (the backlog's unit).
CURVE = (LatencyPoint(16, 200.0, 100.0, 1.0), LatencyPoint(64, 200.0, 100.0, 1.0))
BAD = ranker_pb2.PreInferRequest(
    user_id="", long_term=common_pb2.BehaviorSequence(item_ids=[1], action_types=[1])
)


def batch(*requests: ranker_pb2.PreInferRequest) -> ranker_pb2.PreInferBatchRequest:
    return ranker_pb2.PreInferBatchRequest(requests=requests)


def entries() -> list[ranker_pb2.PreInferRequest]:
    """A batch that meets every per-entry rule: a compute, a renewal, a bad entry, a join, a prefix HBM cannot
    hold, more computes (until the limit under test refuses them), and a reload from DRAM."""
    return [
        pre_infer_request("a", history(1, 40)),
        pre_infer_request("cached", history(2, 40)),
        BAD,
        pre_infer_request("a", history(1, 40)),
        pre_infer_request("huge", history(3, 600)),
        pre_infer_request("b", history(4, 40)),
        pre_infer_request("c", history(5, 40)),
        pre_infer_request("d", history(6, 40)),
        pre_infer_request("e", history(7, 40)),
        pre_infer_request("dram", history(8, 40)),
    ]


async def prepared(r) -> None:
    """`cached` leased in HBM, `dram` consumed and demoted to DRAM; then the fixed curve."""
    await r.stub.PreInfer(pre_infer_request("cached", history(2, 40)))
    await r.stub.PreInfer(pre_infer_request("dram", history(8, 40)))
    await r.settle()
    ranked = await r.stub.Rank(rank_request("dram", history(8, 40), SHORT, CANDIDATES, "ranker-a"))
    assert ranked.cache_source == common_pb2.CACHE_SOURCE_HBM
    await r.settle()
    calibration = r.app.plane.calibration
    calibration.set_curve(dataclasses.replace(calibration.curve, points=CURVE))


async def singles(r, requests: list[ranker_pb2.PreInferRequest]) -> list[tuple[int, int, str]]:
    """Each request as a single PreInfer, in order: (outcome, cache_bytes, error) per request."""
    answers = []
    for request in requests:
        try:
            answer = await r.stub.PreInfer(request)
            answers.append((answer.outcome, answer.cache_bytes, ""))
        except grpc.aio.AioRpcError as exc:
            answers.append((0, 0, f"{exc.code().value[0]} {exc.details()}"))
    return answers


def as_answers(response: ranker_pb2.PreInferBatchResponse) -> list[tuple[int, int, str]]:
    return [
        (a.outcome, a.cache_bytes, f"{a.error.code} {a.error.message}" if a.HasField("error") else "")
        for a in response.answers
    ]


@pytest.mark.parametrize(
    "limits",
    [{"max_pending_pre_infer": 3}, {"max_pre_infer_backlog_ms": 250.0}],
    ids=["overload", "backlog"],
)
def test_each_entry_is_answered_as_the_same_pre_infer_alone_on_an_identical_ranker(limits):
    """Two rankers alike, their device threads held so that nothing finishes meanwhile: the batch on one,
    the same requests as single PreInfers in order on the other. Every answer is the same, the bad entry's
    error naming its field within the batch, and both rankers then hold the same productions."""

    async def scenario():
        settings = {"hbm_budget_mb": HBM_BUDGET_MB, **limits}
        async with running_ranker(**settings) as batched, running_ranker(**settings) as single:
            for r in (batched, single):
                await prepared(r)
            gates = [blocked(r.app.worker) for r in (batched, single)]
            try:
                response = await batched.stub.PreInferBatch(batch(*entries()))
                alone = await singles(single, entries())
                assert response.instance == "ranker-a"
                got = as_answers(response)
                assert got[2] == (0, 0, "3 requests[2].user_id: is required")
                assert alone[2] == (0, 0, "3 user_id: is required")
                assert got[:2] + got[3:] == alone[:2] + alone[3:]
                outcomes = {outcome for outcome, _, _ in got}
                refused = ranker_pb2.PRE_INFER_OUTCOME_REJECTED_OVERLOAD
                if "max_pre_infer_backlog_ms" in limits:
                    refused = ranker_pb2.PRE_INFER_OUTCOME_REJECTED_BACKLOG
                    assert ranker_pb2.PRE_INFER_OUTCOME_RELOADED in outcomes
                assert {
                    ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED,
                    ranker_pb2.PRE_INFER_OUTCOME_ALREADY_CACHED,
                    ranker_pb2.PRE_INFER_OUTCOME_REJECTED_CAPACITY,
                    refused,
                } <= outcomes
                assert set(batched.cache.productions) == set(single.cache.productions)
                assert response.load.leased_bytes == batched.app.plane.load_report().leased_bytes
            finally:
                for gate in gates:
                    gate.set()
            for r in (batched, single):
                await r.settle()
            assert set(batched.cache.entries) == set(single.cache.entries)

    asyncio.run(scenario())


def test_the_entries_device_jobs_are_handed_over_at_once_with_one_wake_up():
    """Three computes: a batch queues their jobs in one hand-off, three single PreInfers in three."""

    async def scenario():
        async with running_ranker() as r:
            handed: list[int] = []
            queue = r.app.worker._queue

            def counting(jobs):
                handed.append(len(jobs))
                queue(jobs)

            r.app.worker._queue = counting
            await r.stub.PreInferBatch(batch(*(pre_infer_request(f"u{i}", history(i, 40)) for i in range(3))))
            assert handed == [3]
            handed.clear()
            for i in range(3, 6):
                await r.stub.PreInfer(pre_infer_request(f"u{i}", history(i, 40)))
            assert handed == [1, 1, 1]
            await r.settle()

    asyncio.run(scenario())


def test_a_rank_after_a_batched_pre_infer_hits_hbm_and_equals_a_full_recomputation():
    async def scenario():
        async with running_ranker() as r:
            users = {f"user-{i}": history(30 + i, 20 + 10 * i) for i in range(3)}
            before = metric("relaygr_pre_infer_batch_size_count"), metric("relaygr_pre_infer_batch_size_sum")
            accepted = metric("relaygr_pre_infer_total", outcome="accepted")
            response = await r.stub.PreInferBatch(batch(*(pre_infer_request(u, h) for u, h in users.items())))
            assert [a.outcome for a in response.answers] == [ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED] * 3
            assert [a.cache_bytes for a in response.answers] == [
                len(h) * r.app.runner.kv_bytes_per_token for h in users.values()
            ]
            # Each entry is counted as a PreInfer; the batch once, by its size.
            assert metric("relaygr_pre_infer_total", outcome="accepted") == accepted + 3
            after = metric("relaygr_pre_infer_batch_size_count"), metric("relaygr_pre_infer_batch_size_sum")
            assert (after[0] - before[0], after[1] - before[1]) == (1, 3)
            await r.settle()
            for user, long in users.items():
                ranked = await r.stub.Rank(rank_request(user, long, SHORT, CANDIDATES, response.instance))
                assert ranked.cache_source == common_pb2.CACHE_SOURCE_HBM
                assert_scores_equal(list(ranked.scores), r.reference(long, SHORT, CANDIDATES))

    asyncio.run(scenario())


@pytest.mark.parametrize("size", [0, 5])
def test_an_empty_or_oversized_batch_is_refused_whole_naming_requests(size):
    async def scenario():
        async with running_ranker(max_pre_infer_batch=4) as r:
            requests = [pre_infer_request(f"u{i}", history(i, 20)) for i in range(5)]
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await r.stub.PreInferBatch(batch(*requests[:size]))
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details().startswith("requests: ")
            assert r.cache.productions == {} and r.cache.entries == {}
            # A batch at the limit is served.
            served = await r.stub.PreInferBatch(batch(*requests[:4]))
            assert [a.outcome for a in served.answers] == [ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED] * 4
            await r.settle()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "bad, field",
    [
        (BAD, "requests[1].user_id"),
        (
            ranker_pb2.PreInferRequest(
                user_id="x", long_term=common_pb2.BehaviorSequence(item_ids=[1], action_types=[99])
            ),
            "requests[1].long_term.action_types",
        ),
        (pre_infer_request("x", []), "requests[1].long_term.item_ids"),
    ],
)
def test_a_bad_entry_is_refused_by_its_field_and_the_others_are_accepted(bad, field):
    async def scenario():
        async with running_ranker() as r:
            good = [pre_infer_request("g0", history(40, 30)), pre_infer_request("g2", history(42, 30))]
            response = await r.stub.PreInferBatch(batch(good[0], bad, good[1]))
            first, refused, last = response.answers
            assert (first.outcome, last.outcome) == (ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED,) * 2
            assert refused.outcome == ranker_pb2.PRE_INFER_OUTCOME_UNSPECIFIED and refused.cache_bytes == 0
            assert refused.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
            assert refused.error.message.startswith(f"{field}: ")
            await r.settle()
            assert {key.user_id for key in r.cache.entries} == {"g0", "g2"}

    asyncio.run(scenario())
