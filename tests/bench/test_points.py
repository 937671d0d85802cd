"""A point's summary: warm-up excluded, failures counted as violations, prefix sources and reasons."""

from __future__ import annotations

import grpc

from bench.points import PointSpec, summarize
from relaygr.v1 import common_pb2, recommend_pb2, trigger_pb2
from services.loadgen.openloop import CallRecord

SPEC = PointSpec(rate=10, warmup=5, measured=100, timeout_s=2, slo_ms=50, max_error_fraction=0.001, seed=0)


def ok(index: int, rank_ms: float, source: int = common_pb2.CACHE_SOURCE_HBM, **fields) -> CallRecord:
    response = recommend_pb2.RecommendResponse(
        rank_latency_ms=rank_ms, cache_source=source, long_term_length=1000, **fields
    )
    return CallRecord(index, index / 10, index / 10, (rank_ms + 40) / 1000, grpc.StatusCode.OK, "", response)


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
    assert result.rank_ms["p99"] == 19.8 and result.e2e_ms["p99"] == 59.8
    assert result.cache_sources == {"hbm": 100} and result.hbm_hit_rank_p50_ms == 14.9


def test_one_slow_call_in_a_hundred_is_tolerated_two_are_not():
    assert summarize(records(slow=1), SPEC, aborted=False, wall_s=11.0).meets_slo
    two = summarize(records(slow=2), SPEC, aborted=False, wall_s=11.0)
    assert not two.meets_slo and two.violations == 2 and two.rank_ms["p99"] == 80.0


def test_a_failed_call_is_a_violation_and_an_error_beyond_the_error_bound():
    result = summarize(records(errors=1), SPEC, aborted=False, wall_s=11.0)
    assert result.errors == 1 and result.error_codes == {"DEADLINE_EXCEEDED": 1} and result.violations == 1
    assert result.rank_ms["p99"] is not None and not result.meets_slo  # P99 fine, but 1% errors ≥ 0.1%
    assert summarize(records(errors=2), SPEC, aborted=False, wall_s=11.0).rank_ms["p99"] is None


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
