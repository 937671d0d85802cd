"""RankerService over loopback gRPC: exact relay, HBM tier and leases, bad input refused."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest

from relaygr.v1 import common_pb2, ranker_pb2
from services.ranker.engine.latency_curve import LatencyPoint
from services.ranker.model.events import Events
from tests.exact import assert_scores_equal
from tests.ranker.harness import events, model_passes, running_ranker
from tests.support.metrics import metric
from tests.support.requests import history, pre_infer_request, rank_request, sequence

HBM = common_pb2.CACHE_SOURCE_HBM
MISS = common_pb2.CACHE_SOURCE_MISS
SHORT = [11, 12, 13]
CANDIDATES = [5, 99, 1234, 7, 42]


def run(coro):
    return asyncio.run(coro)


def test_pre_infer_then_rank_hits_hbm_and_equals_full_recompute():
    async def scenario():
        async with running_ranker() as r:
            long = history(1, 40)
            answer = await r.stub.PreInfer(pre_infer_request("u1", long))
            assert answer.outcome == ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED
            assert answer.instance == "ranker-a"
            assert answer.cache_bytes == 40 * r.app.runner.kv_bytes_per_token
            await r.settle()
            again = await r.stub.PreInfer(pre_infer_request("u1", long))
            assert again.outcome == ranker_pb2.PRE_INFER_OUTCOME_ALREADY_CACHED

            ranked = await r.stub.Rank(rank_request("u1", long, SHORT, CANDIDATES, relay_instance="ranker-a"))
            assert ranked.cache_source == HBM
            assert ranked.miss_reason == common_pb2.MISS_REASON_UNSPECIFIED
            assert ranked.instance == "ranker-a"
            assert not ranked.lossy
            assert len(ranked.scores) == len(CANDIDATES)
            assert_scores_equal(list(ranked.scores), r.reference(long, SHORT, CANDIDATES))

            cold = await r.stub.Rank(rank_request("u2", long, SHORT, CANDIDATES))
            assert cold.cache_source == MISS
            assert cold.miss_reason == common_pb2.MISS_REASON_NEVER_PRE_INFERRED
            assert_scores_equal(list(cold.scores), list(ranked.scores))

    run(scenario())


def test_rank_joins_the_in_flight_pre_inference():
    async def scenario():
        async with running_ranker(pre_infer_chunk_tokens=16) as r:
            long = history(3, 300)
            before = metric("relaygr_productions_total", kind="compute")
            joins = metric("relaygr_production_joins_total")
            await r.stub.PreInfer(pre_infer_request("u3", long))
            ranked = await r.stub.Rank(rank_request("u3", long, SHORT, CANDIDATES))
            assert ranked.cache_source == HBM
            assert metric("relaygr_productions_total", kind="compute") == before + 1
            assert metric("relaygr_production_joins_total") == joins + 1
            assert_scores_equal(list(ranked.scores), r.reference(long, SHORT, CANDIDATES))

    run(scenario())


def test_scores_keep_request_order_and_cover_every_candidate():
    async def scenario():
        async with running_ranker() as r:
            long = history(4, 20)
            forward = await r.stub.Rank(rank_request("u4", long, SHORT, CANDIDATES))
            backward = await r.stub.Rank(rank_request("u4", long, SHORT, CANDIDATES[::-1]))
            assert_scores_equal(list(backward.scores), list(forward.scores)[::-1])
            assert len(set(forward.scores)) == len(CANDIDATES)

    run(scenario())


@pytest.mark.parametrize("field", ["item_ids", "action_types"])
def test_stale_prefix_is_never_used(field):
    """One event of the cached history changed (its item, or only its action type): never the cached KV."""

    async def scenario():
        async with running_ranker() as r:
            old = sequence(history(5, 50))
            await r.stub.PreInfer(ranker_pb2.PreInferRequest(user_id="u5", long_term=old))
            await r.settle()
            changed = common_pb2.BehaviorSequence()
            changed.CopyFrom(old)
            values = getattr(changed, field)
            values[25] = (values[25] + 1) % r.app.runner.model.preset.num_action_types
            request = ranker_pb2.RankRequest(
                user_id="u5", long_term=changed, short_term=sequence(SHORT), candidate_item_ids=CANDIDATES
            )
            ranked = await r.stub.Rank(request)
            assert ranked.cache_source == MISS
            assert ranked.miss_reason == common_pb2.MISS_REASON_STALE_PREFIX
            fresh = r.app.runner.full_sync(as_events(changed), events(SHORT), CANDIDATES)
            stale = r.app.runner.full_sync(as_events(old), events(SHORT), CANDIDATES)
            assert_scores_equal(ranked.scores, fresh)
            assert max(abs(a - b) for a, b in zip(fresh, stale, strict=True)) > 1e-4

    run(scenario())


def as_events(seq: common_pb2.BehaviorSequence) -> Events:
    return Events.of(seq.item_ids, seq.action_types, seq.timestamps_ms)


def test_hbm_budget_refuses_pre_inference_instead_of_overflowing():
    async def scenario():
        # cpu-tiny: 2 layers x 2 heads x (16+16) x 4 bytes = 512 bytes per token; 64 KiB hold 128 tokens.
        async with running_ranker(hbm_budget_mb=64 / 1024, dram_budget_mb=0) as r:
            first = await r.stub.PreInfer(pre_infer_request("a", history(10, 100)))
            second = await r.stub.PreInfer(pre_infer_request("b", history(11, 100)))
            assert first.outcome == ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED
            assert second.outcome == ranker_pb2.PRE_INFER_OUTCOME_REJECTED_CAPACITY
            assert r.cache.hbm.used_bytes <= r.cache.hbm.budget_bytes
            too_long = await r.stub.PreInfer(pre_infer_request("c", history(12, 200)))
            assert too_long.outcome == ranker_pb2.PRE_INFER_OUTCOME_REJECTED_CAPACITY
            # The cache never makes a Rank fail: the refused user is ranked in full.
            ranked = await r.stub.Rank(rank_request("b", history(11, 100), SHORT, CANDIDATES))
            assert ranked.cache_source == MISS
            assert ranked.miss_reason == common_pb2.MISS_REASON_REJECTED_CAPACITY
            assert_scores_equal(list(ranked.scores), r.reference(history(11, 100), SHORT, CANDIDATES))

    run(scenario())


BAD_REQUESTS = [
    ("user_id", rank_request("", [1, 2], SHORT, CANDIDATES)),
    (
        "long_term.action_types",
        rank_request("u", [1, 2], SHORT, CANDIDATES).__class__(
            user_id="u",
            long_term=common_pb2.BehaviorSequence(item_ids=[1, 2, 3], action_types=[0, 1]),
            candidate_item_ids=[1],
        ),
    ),
    ("long_term.item_ids", rank_request("u", [1, -2], SHORT, CANDIDATES)),
    ("long_term.item_ids", rank_request("u", [], SHORT, CANDIDATES)),
    ("long_term.item_ids", rank_request("u", list(range(300)), SHORT, CANDIDATES)),
    ("candidate_item_ids", rank_request("u", [1, 2], SHORT, [])),
    ("candidate_item_ids", rank_request("u", [1, 2], SHORT, list(range(40)))),
    ("candidate_item_ids", rank_request("u", [1, 2], SHORT, [3, -1])),
    ("short_term.item_ids", rank_request("u", [1, 2], list(range(50)), CANDIDATES)),
]


@pytest.mark.parametrize(("field", "request_"), BAD_REQUESTS, ids=[f for f, _ in BAD_REQUESTS])
def test_bad_input_is_invalid_argument_naming_the_field(field, request_):
    async def scenario():
        async with running_ranker(max_long_term_events=256, max_candidates=32, max_short_term_events=16) as r:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await r.stub.Rank(request_)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details().startswith(field)
            bad_pre = ranker_pb2.PreInferRequest(
                user_id="u", long_term=common_pb2.BehaviorSequence(item_ids=[1], action_types=[99])
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await r.stub.PreInfer(bad_pre)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "long_term.action_types" in caught.value.details()
            # The ranker is still healthy and serving.
            ok = await r.stub.Rank(rank_request("u", [1, 2], SHORT, CANDIDATES))
            assert len(ok.scores) == len(CANDIDATES)

    run(scenario())


def test_a_rank_that_cannot_meet_its_deadline_is_shed_before_the_work():
    async def scenario():
        async with running_ranker() as r:
            # The latency curve is the ranker's own measurement; here it says a rank of any length takes
            # 10 s, so a Rank with 2 s left reaches the server and is shed there, before any work.
            slow = LatencyPoint(prefix_length=60, full_ms=20_000.0, pre_infer_ms=10_000.0, rank_ms=10_000.0)
            calibration = r.app.plane.calibration
            calibration.set_curve(dataclasses.replace(calibration.curve, points=(slow,)))
            shed = metric("relaygr_shed_requests_total", method="Rank", reason="deadline")
            passes = model_passes()
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await r.stub.Rank(rank_request("u", history(1, 60), SHORT, CANDIDATES), timeout=2.0)
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "is shorter than the 10000.0 ms a rank takes" in caught.value.details()
            assert metric("relaygr_shed_requests_total", method="Rank", reason="deadline") == shed + 1
            assert r.cache.productions == {} and r.cache.entries == {}
            assert model_passes() == passes

    run(scenario())


def test_get_profile_reports_the_measured_curve():
    async def scenario():
        async with running_ranker() as r:
            profile = await r.stub.GetProfile(ranker_pb2.GetProfileRequest())
            assert profile.preset == "cpu-tiny"
            assert profile.kv_bytes_per_token == 512
            assert [p.prefix_length for p in profile.latency_curve] == [16, 64]
            assert all(p.full_ms > 0 and p.pre_infer_ms > 0 and p.rank_ms > 0 for p in profile.latency_curve)
            assert profile.profile_num_candidates == 8
            assert profile.fleet_members == 1
            assert profile.model_version.startswith("cpu-tiny-")

    run(scenario())


def test_rank_with_timestamps_and_empty_short_term():
    async def scenario():
        async with running_ranker() as r:
            long = sequence(history(8, 30))
            long.timestamps_ms.extend(range(1000, 1030))
            request = ranker_pb2.RankRequest(user_id="u8", long_term=long, candidate_item_ids=CANDIDATES)
            await r.stub.PreInfer(ranker_pb2.PreInferRequest(user_id="u8", long_term=long))
            ranked = await r.stub.Rank(request)
            assert ranked.cache_source == HBM
            assert_scores_equal(list(ranked.scores), r.reference(history(8, 30), [], CANDIDATES))

    run(scenario())
