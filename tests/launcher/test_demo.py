"""The demo's live line and closing summary, from real RecommendResponse messages as the stub answers them:
every miss is split by why, and the summary's figures are the responses' own."""

from __future__ import annotations

import grpc
import pytest

from relaygr.v1 import common_pb2, ranker_pb2, recommend_pb2, trigger_pb2
from services.launcher.demo import MISS_LABELS, NOT_ADMITTED_LABELS, DemoProgress, RankCosts, miss_label
from services.loadgen.openloop import CallRecord

Source = common_pb2.CacheSource
Miss = common_pb2.MissReason
Admit = trigger_pb2.AdmitReason


def answered(response: recommend_pb2.RecommendResponse, index: int = 0) -> CallRecord:
    return CallRecord(index, 0.0, 0.0, 0.012, grpc.StatusCode.OK, "", response)


def failed(code: grpc.StatusCode) -> CallRecord:
    return CallRecord(0, 0.0, 0.0, 2.0, code, "deadline", None)


def hit(source: int, length: int = 100, computed: int = 0, rank_ms: float = 2.0):
    return recommend_pb2.RecommendResponse(
        cache_source=source, admitted=True, admit_reason=Admit.ADMIT_REASON_ADMITTED, long_term_length=length,
        computed_prefix_events=computed, rank_latency_ms=rank_ms,
    )  # fmt: skip


def miss(admit: int, why: int = Miss.MISS_REASON_UNSPECIFIED, length: int = 100, rank_ms: float = 9.0):
    """A miss as the stub reports it: admitted exactly when the trigger's reason is ADMITTED."""
    return recommend_pb2.RecommendResponse(
        cache_source=Source.CACHE_SOURCE_MISS, admitted=admit == Admit.ADMIT_REASON_ADMITTED,
        admit_reason=admit, miss_reason=why, long_term_length=length, computed_prefix_events=length,
        rank_latency_ms=rank_ms,
    )  # fmt: skip


# A cpu-small ranker's measured latency curve (one torch thread; bench/results/full's floor, the same
# measurement a ranker answers GetProfile with): (prefix length, full pass, pre-inference, cached rank) ms.
CPU_SMALL_CURVE = [
    (512, 6.10, 4.11, 1.78),
    (1024, 13.89, 10.97, 2.49),
    (1536, 22.80, 18.92, 3.00),
    (2048, 34.90, 30.92, 3.84),
    (4096, 108.74, 103.07, 7.49),
]
PROFILE = ranker_pb2.GetProfileResponse(
    preset="cpu-small",
    latency_curve=[
        ranker_pb2.LatencyPoint(prefix_length=n, full_ms=full, pre_infer_ms=pre, rank_ms=rank)
        for n, full, pre, rank in reversed(CPU_SMALL_CURVE)  # in any order
    ],
)


def progress_of(*records: CallRecord, costs: RankCosts | None = None) -> DemoProgress:
    progress = DemoProgress(window_s=10.0, clock=lambda: 5.0, costs=costs)
    for record in records:
        progress.add(record)
    return progress


def test_the_live_line_splits_the_misses_by_why_not_admitted_first():
    admitted = Admit.ADMIT_REASON_ADMITTED
    progress = progress_of(
        *[answered(hit(Source.CACHE_SOURCE_HBM)) for _ in range(3)],
        answered(hit(Source.CACHE_SOURCE_DRAM)),
        answered(miss(Admit.ADMIT_REASON_NO_GAIN, Miss.MISS_REASON_NEVER_PRE_INFERRED)),
        answered(miss(Admit.ADMIT_REASON_NO_GAIN, Miss.MISS_REASON_NEVER_PRE_INFERRED)),
        # Not admitted: that is why it missed, whatever the ranker then found.
        answered(miss(Admit.ADMIT_REASON_SHED_SHORT, Miss.MISS_REASON_COLD)),
        answered(miss(Admit.ADMIT_REASON_UNSPECIFIED, Miss.MISS_REASON_NEVER_PRE_INFERRED)),
        answered(miss(admitted, Miss.MISS_REASON_COLD)),
        answered(miss(admitted, Miss.MISS_REASON_COLD)),
        answered(miss(admitted, Miss.MISS_REASON_ROUTED_ELSEWHERE)),
        answered(recommend_pb2.RecommendResponse(abandoned=True, admitted=False)),
        failed(grpc.StatusCode.DEADLINE_EXCEEDED),
    )
    line = progress.line()
    assert (
        "| hbm 3 dram 1 extended 0 miss 7 (not admitted: no-gain 2 no-admit 1 shed 1; cold 2 elsewhere 1) | "
        "admitted 7 | errors 1 (DEADLINE_EXCEEDED)"
    ) in line, line
    assert progress.miss_text() == "not admitted: no-gain 2 no-admit 1 shed 1; cold 2 elsewhere 1"


def test_a_run_without_misses_shows_no_reasons_and_one_of_admitted_misses_only_no_group():
    line = progress_of(answered(hit(Source.CACHE_SOURCE_EXTENDED))).line()
    assert "| hbm 0 dram 0 extended 1 miss 0 | admitted 1 | errors 0" in line, line
    progress = progress_of(answered(miss(Admit.ADMIT_REASON_ADMITTED, Miss.MISS_REASON_EVICTED_DRAM)))
    assert progress.miss_text() == "dram-evicted 1"
    assert "miss 1 (dram-evicted 1) |" in progress.line()


def test_every_admit_and_miss_reason_has_its_own_short_label():
    for reason in Admit.values():
        if reason != Admit.ADMIT_REASON_ADMITTED:
            assert miss_label(miss(reason)) == (False, NOT_ADMITTED_LABELS[reason]), Admit.Name(reason)
    for reason in Miss.values():
        assert miss_label(miss(Admit.ADMIT_REASON_ADMITTED, reason)) == (True, MISS_LABELS[reason])
    assert set(NOT_ADMITTED_LABELS) == set(Admit.values()) - {Admit.ADMIT_REASON_ADMITTED}
    assert set(MISS_LABELS) == set(Miss.values())
    labels = [*NOT_ADMITTED_LABELS.values(), *MISS_LABELS.values()]
    assert len(set(labels)) == len(labels)
    assert all(" " not in label and len(label) <= 12 for label in labels)


def test_the_summary_says_what_the_relay_saved_from_the_responses():
    progress = progress_of(
        answered(hit(Source.CACHE_SOURCE_HBM, length=100, computed=0, rank_ms=2.0)),
        answered(hit(Source.CACHE_SOURCE_EXTENDED, length=120, computed=20, rank_ms=4.0)),
        answered(miss(Admit.ADMIT_REASON_NO_GAIN, length=80, rank_ms=9.0)),
        answered(miss(Admit.ADMIT_REASON_ADMITTED, Miss.MISS_REASON_COLD, length=50, rank_ms=7.0)),
        # Neither an abandoned request (no Rank) nor a failed one counts.
        answered(recommend_pb2.RecommendResponse(abandoned=True, long_term_length=999)),
        failed(grpc.StatusCode.UNAVAILABLE),
    )
    # Without the rankers' curve, the sentence says what the responses say, and compares no latencies.
    assert progress.summary() == (
        "relay: 2 of 4 Ranks (50%) reused a cached prefix, 200 of 350 long-term events (57%) not recomputed "
        "on the critical path. The 2 misses ranked histories of 65 long-term events on average, against 110 "
        "for the cached Ranks (why each missed: the line above)."
    )


def test_a_cached_rank_is_compared_with_its_own_history_ranked_without_the_cache_not_with_the_misses():
    """The demo's run on cpu-small: cached Ranks of long histories took longer through the service (9.3 ms)
    than the short histories the trigger refused as no-gain (7.5 ms). That compares different histories;
    the summary compares each cached Rank with its own length's full pass on the rankers' curve."""
    costs = RankCosts.of(PROFILE)
    assert costs is not None and costs.lengths == (512, 1024, 1536, 2048, 4096)
    # From HBM at 2048 events: the full pass less the cached rank, as measured at that length.
    assert costs.saved_ms(2048, 0) == pytest.approx(34.90 - 3.84)
    # Extended at 1536, 20 events appended on the critical path: their pre-inference is not saved.
    appended = 18.92 - (10.97 + (1516 - 1024) / 512 * (18.92 - 10.97))
    assert costs.saved_ms(1536, 20) == pytest.approx(22.80 - 3.00 - appended)
    # Between profiled lengths linear; below them down to nothing at no history; beyond, the longest's.
    assert costs.saved_ms(768, 0) == pytest.approx((6.10 - 1.78 + 13.89 - 2.49) / 2)
    assert costs.saved_ms(256, 0) == pytest.approx((6.10 - 1.78) / 2)
    assert costs.saved_ms(6000, 0) == costs.saved_ms(4096, 0)
    # A Rank that computed its whole prefix saved what the full pass costs beyond the two others.
    assert costs.saved_ms(2048, 2048) == pytest.approx(34.90 - 3.84 - 30.92)

    progress = progress_of(
        answered(hit(Source.CACHE_SOURCE_HBM, length=2048, computed=0, rank_ms=9.3)),
        answered(hit(Source.CACHE_SOURCE_DRAM, length=2048, computed=0, rank_ms=9.5)),
        answered(hit(Source.CACHE_SOURCE_EXTENDED, length=1536, computed=20, rank_ms=9.1)),
        answered(
            miss(Admit.ADMIT_REASON_NO_GAIN, Miss.MISS_REASON_NEVER_PRE_INFERRED, length=300, rank_ms=7.5)
        ),
        costs=costs,
    )
    saved = 2 * costs.saved_ms(2048, 0) + costs.saved_ms(1536, 20)
    assert saved == pytest.approx(81.61, abs=0.01)
    assert progress.summary() == (
        "relay: 3 of 4 Ranks (75%) reused a cached prefix, 5,612 of 5,932 long-term events (95%) not "
        "recomputed on the critical path; a cached Rank took 9.3 ms on average, and computing its own "
        "history without the cache would have added 27.2 ms (the rankers' measured curve at its length): "
        "relay took 0.1 s off the critical path in all. The 1 miss ranked histories of 300 long-term "
        "events on average, against 1,877 for the cached Ranks (why each missed: the line above)."
    )


def test_a_profile_without_a_curve_gives_no_costs():
    assert RankCosts.of(ranker_pb2.GetProfileResponse(preset="cpu-small")) is None


def test_the_summary_of_a_baseline_run_or_of_no_answer_compares_nothing_it_did_not_measure():
    baseline = progress_of(
        answered(miss(Admit.ADMIT_REASON_UNSPECIFIED, Miss.MISS_REASON_NEVER_PRE_INFERRED, length=64)),
        answered(miss(Admit.ADMIT_REASON_UNSPECIFIED, Miss.MISS_REASON_NEVER_PRE_INFERRED, length=36)),
    )
    assert baseline.summary() == (
        "relay: 0 of 2 Ranks (0%) reused a cached prefix, 0 of 100 long-term events (0%) not recomputed on "
        "the critical path."
    )
    assert progress_of(failed(grpc.StatusCode.UNAVAILABLE)).summary() == (
        "relay: no Rank was answered, nothing to compare."
    )
