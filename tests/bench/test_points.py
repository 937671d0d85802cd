"""A point's summary: warm-up excluded, failures counted as violations, abandoned calls left out, the
P99's interval, prefix sources and reasons; and a point driven over loopback stops once it has failed."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest

from bench.lib.config import BenchConfig
from bench.lib.driving import Plan
from bench.lib.points import FIRST_SEED, Before, PointSpec, failed_for_certain, run_point, summarize
from bench.lib.workload import RevisitSampler
from bench.run.experiments import Bench
from relaygr.v1 import common_pb2, recommend_pb2, recommend_pb2_grpc, trigger_pb2
from services.loadgen.openloop import CallRecord

SPEC = PointSpec(rate=10, warmup=5, measured=100, timeout_s=2, slo_ms=50, max_error_fraction=0.001, seed=0)


def ok(index: int, rank_ms: float, source: int = common_pb2.CACHE_SOURCE_HBM, **fields) -> CallRecord:
    response = recommend_pb2.RecommendResponse(
        rank_latency_ms=rank_ms, cache_source=source, long_term_length=1000, **fields
    )
    return CallRecord(index, index / 10, index / 10, (rank_ms + 40) / 1000, grpc.StatusCode.OK, "", response)


def dropped(index: int, admitted: bool = True) -> CallRecord:
    """An abandoned call; its made-up rank latency would fail the SLO if it were counted."""
    response = recommend_pb2.RecommendResponse(abandoned=True, admitted=admitted, rank_latency_ms=900.0)
    return CallRecord(index, index / 10, index / 10, 0.1, grpc.StatusCode.OK, "", response)


def failed(index: int) -> CallRecord:
    return CallRecord(index, index / 10, index / 10, 1.0, grpc.StatusCode.DEADLINE_EXCEEDED, "late", None)


def records(slow: int = 0, errors: int = 0) -> list[CallRecord]:
    """5 warm-up calls (all very slow) and 100 measured ones, `slow` of them over the SLO."""
    warmup = [ok(i, 900.0) for i in range(SPEC.warmup)]
    measured = [ok(SPEC.warmup + i, 10.0 + i * 0.1) for i in range(100 - slow - errors)]
    measured += [ok(SPEC.warmup + 100 - slow - errors + i, 80.0) for i in range(slow)]
    measured += [failed(SPEC.warmup + 100 - errors + i) for i in range(errors)]
    return warmup + measured


def test_warm_up_calls_are_not_counted_and_a_clean_point_meets_the_slo():
    result = summarize(records(), SPEC, aborted=False, wall_s=11.0)
    assert result.measured == 100 and result.violations == 0 and result.meets_slo
    assert result.rank_ms.p99 == 19.8 and result.e2e_ms.p99 == 59.8
    assert result.cache_sources == {"hbm": 100} and result.hbm_hit_rank_p50_ms == 14.9
    low, high = result.rank_p99_ci_ms
    assert 19.0 <= low <= 19.8 <= high <= 19.9  # within the few slowest of 10.0 … 19.9 ms
    assert result.abandoned == 0


def test_one_slow_call_in_a_hundred_is_tolerated_two_are_not():
    assert summarize(records(slow=1), SPEC, aborted=False, wall_s=11.0).meets_slo
    two = summarize(records(slow=2), SPEC, aborted=False, wall_s=11.0)
    assert not two.meets_slo and two.violations == 2 and two.rank_ms.p99 == 80.0


def test_a_failed_call_is_a_violation_and_an_error_beyond_the_error_bound():
    result = summarize(records(errors=1), SPEC, aborted=False, wall_s=11.0)
    assert result.errors == 1 and result.error_codes == {"DEADLINE_EXCEEDED": 1} and result.violations == 1
    assert result.rank_ms.p99 is not None and not result.meets_slo  # P99 fine, but 1% errors ≥ 0.1%
    assert summarize(records(errors=2), SPEC, aborted=False, wall_s=11.0).rank_ms.p99 is None


def test_a_point_stopped_early_never_meets_the_slo():
    assert not summarize(records()[:50], SPEC, aborted=True, wall_s=5.0).meets_slo


def test_sources_miss_reasons_and_admit_reasons_are_counted_by_label():
    calls = [
        ok(SPEC.warmup, 5.0, admit_reason=trigger_pb2.ADMIT_REASON_ADMITTED),
        ok(
            SPEC.warmup + 1,
            5.0,
            common_pb2.CACHE_SOURCE_DRAM,
            admit_reason=trigger_pb2.ADMIT_REASON_DUPLICATE,
        ),
        ok(SPEC.warmup + 2, 30.0, common_pb2.CACHE_SOURCE_MISS, miss_reason=common_pb2.MISS_REASON_COLD),
    ]
    result = summarize(calls, SPEC, aborted=False, wall_s=1.0)
    assert result.cache_sources == {"hbm": 1, "dram": 1, "miss": 1}
    assert result.miss_reasons == {"cold": 1}
    assert result.admit_reasons == {"admitted": 1, "duplicate": 1, "no_answer": 1}
    assert result.mean_long_term == 1000.0


def test_the_ranks_over_the_slo_say_where_their_prefixes_came_from_and_whether_they_came_together():
    # Sent 0.1 s apart: a burst of three hits that waited (indices 10-12), then two lone ones far apart
    # (a miss that computed its whole prefix, and a failure), among fast calls.
    slow = {
        10: ok(10, 90.0, admit_reason=trigger_pb2.ADMIT_REASON_ADMITTED, prefix_wait_ms=30.0),
        11: ok(11, 95.0, admit_reason=trigger_pb2.ADMIT_REASON_ADMITTED, prefix_wait_ms=40.0),
        12: ok(12, 99.0, common_pb2.CACHE_SOURCE_DRAM, admit_reason=trigger_pb2.ADMIT_REASON_DUPLICATE),
        40: ok(
            40, 70.0, common_pb2.CACHE_SOURCE_MISS, miss_reason=common_pb2.MISS_REASON_EVICTED_HBM,
            computed_prefix_events=1000,
        ),
        70: failed(70),
    }  # fmt: skip
    calls = [slow.get(i) or ok(i, 10.0, prefix_wait_ms=5.0) for i in range(SPEC.warmup, SPEC.warmup + 100)]
    over = summarize(calls, SPEC, aborted=False, wall_s=11.0).over_slo
    assert over.requests == 5 and over.failed == 1
    assert over.cache_sources == {"hbm": 2, "dram": 1, "miss": 1}
    assert over.miss_reasons == {"evicted_hbm": 1}
    assert over.admit_reasons == {"admitted": 2, "duplicate": 1, "no_answer": 1}
    assert over.prefix_wait_ms == 70.0  # 30 + 40: the fast calls' 5 ms each are not among them
    assert (over.computed_prefix_events, over.long_term_events) == (1000, 4000)  # the 4 answered ones'
    assert (over.bursts, over.largest_burst) == (3, 3)


def test_a_point_without_ranks_over_the_slo_has_an_empty_account_of_them():
    over = summarize(records(), SPEC, aborted=False, wall_s=11.0).over_slo
    assert (over.requests, over.bursts, over.largest_burst, over.cache_sources) == (0, 0, 0, {})
    assert (over.prefix_wait_ms, over.long_term_events, over.computed_prefix_events) == (0.0, 0, 0)


def test_abandoned_calls_are_counted_but_left_out_of_the_latencies_and_the_verdict():
    calls = records(slow=1)
    calls += [dropped(SPEC.warmup + 100 + i, admitted=i % 2 == 0) for i in range(30)]
    spec = dataclasses.replace(SPEC, measured=130)
    result = summarize(calls, spec, aborted=False, wall_s=14.0)
    assert result.measured == 130 and result.abandoned == 30 and result.abandoned_admitted == 15
    assert result.meets_slo and result.violations == 1  # 1 slow Rank of the 100 that happened
    assert result.rank_ms.p99 == 19.8 and result.cache_sources == {"hbm": 100}
    assert result.admit_reasons == {"no_answer": 100}  # the abandoned calls' Admits are not among them


def test_a_point_with_every_call_abandoned_has_no_p99_and_fails():
    spec = dataclasses.replace(SPEC, warmup=0, measured=10)
    result = summarize([dropped(i) for i in range(10)], spec, aborted=False, wall_s=1.0)
    assert result.abandoned == 10 and not result.meets_slo
    assert result.rank_ms.p99 is None and result.rank_p99_ci_ms == [None, None]


@pytest.mark.parametrize(
    ("violations", "errors", "most_ranked", "failed"),
    [
        (1, 0, 100, False),  # one slow call in a hundred is within a P99
        (2, 0, 100, True),
        (1, 0, 99, True),  # 99 calls left to rank: no slow one allowed
        (0, 1, 1000, True),  # 0.1% errors is the bound itself
        (0, 1, 1001, False),
        (0, 0, 0, False),  # nothing can be ranked: nothing has failed yet
    ],
)
def test_a_point_has_failed_for_certain_only_once_no_outcome_of_the_rest_can_save_it(
    violations, errors, most_ranked, failed
):
    assert failed_for_certain(violations, errors, most_ranked, 0.001) is failed


class ScriptedStub(recommend_pb2_grpc.RecommendServiceServicer):
    """Abandons every user whose number is a multiple of 3 (with a huge made-up rank latency); ranks the
    others in 5 ms, or in 500 ms for users of the namespace "slow"."""

    async def Recommend(self, request, context):
        namespace, number = request.user_id.rsplit("-", 1)
        if int(number) % 3 == 0:
            return recommend_pb2.RecommendResponse(abandoned=True, rank_latency_ms=10_000.0)
        latency_ms = 500.0 if namespace == "slow" else 5.0
        return recommend_pb2.RecommendResponse(
            item_ids=[1], scores=[1.0], cache_source=common_pb2.CACHE_SOURCE_HBM, rank_latency_ms=latency_ms
        )


# The early-stop tests' rate: a stop takes effect once an answer is back, and the loop that reads answers
# also sends, catching up on late sends first; at 400 calls a second a busy machine sent all 96 before the
# first answer was read (the point "stopped" with none left to stop). 96 calls at 60 a second take 1.6 s.
RATE = 60


async def drive(namespace: str, spec: PointSpec):
    server = grpc.aio.server()
    recommend_pb2_grpc.add_RecommendServiceServicer_to_server(ScriptedStub(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        sampler = RevisitSampler(namespace, spec.rate, 0.0, 1.0, spec.seed)
        return await run_point(f"127.0.0.1:{port}", sampler, spec)
    finally:
        await server.stop(0)


def test_abandoned_calls_neither_fail_a_point_nor_stop_it_early_and_slow_ranks_stop_it_at_once():
    spec = PointSpec(RATE, warmup=6, measured=90, timeout_s=2, slo_ms=50, max_error_fraction=0.01, seed=0)
    result = asyncio.run(drive("fast", spec))
    assert not result.aborted and result.meets_slo and result.measured == 90
    assert result.abandoned == 30 and result.violations == 0  # users 7 … 96: 30 multiples of 3
    slow = asyncio.run(drive("slow", spec))
    assert slow.aborted and not slow.meets_slo and slow.measured < 90


def test_a_later_seed_stops_early_once_the_pooled_sample_has_failed_for_certain():
    # Alone, 90 fast calls meet the SLO. After earlier seeds whose 200 ranked calls had 3 over it, the
    # pooled budget (at most 290 ranked calls, 260 once 30 are abandoned: 2 either way) is already spent.
    spec = PointSpec(RATE, warmup=6, measured=90, timeout_s=2, slo_ms=50, max_error_fraction=0.01, seed=0)
    assert not asyncio.run(drive("fast", spec)).aborted
    spent = dataclasses.replace(spec, before=Before(ranked=200, violations=3))
    pooled = asyncio.run(drive("fast", spent))
    assert pooled.aborted and not pooled.meets_slo and pooled.measured < 90
    # With 2 over the SLO before, the pooled budget holds them: this seed runs to its end.
    within = dataclasses.replace(spec, before=Before(ranked=200, violations=2))
    assert not asyncio.run(drive("fast", within)).aborted
    # With 300 more calls to come from the load's later seeds (up to its seed cap), the pooled budget is
    # that of 590 ranked calls, 5: the same 3 before no longer stop this seed; slow ranks still do.
    to_come = dataclasses.replace(spent, later=300)
    assert not asyncio.run(drive("fast", to_come)).aborted
    slow = asyncio.run(drive("slow", to_come))
    assert slow.aborted and slow.measured < 90


def test_each_seed_counts_the_calls_the_seeds_after_it_may_add_up_to_the_cap():
    bench = Bench(dataclasses.replace(BenchConfig(), profile="full"), log_dir=None, log=lambda line: None)
    plan = Plan(fleet=None, first=0, delay_ms=100.0)
    earlier = Before(ranked=1000, violations=12)
    # The full profile: 1000 calls a seed, up to 5 seeds a load.
    assert [bench.spec(plan, 40.0, k, FIRST_SEED).later for k in range(5)] == [4000, 3000, 2000, 1000, 0]
    second = bench.spec(plan, 40.0, 1, earlier)
    assert (second.before, second.seed, second.measured, second.warmup) == (earlier, 1, 1000, 200)
    # The gpu profile keeps one seed a load: its only seed stops at its own budget.
    gpu = Bench(dataclasses.replace(BenchConfig(), profile="gpu"), log_dir=None, log=lambda line: None)
    assert gpu.spec(plan, 40.0, 0, FIRST_SEED).later == 0
