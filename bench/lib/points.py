"""One load point: open-loop Recommend traffic against a retrieval stub, and what it measured
(docs/benchmark.md, "One point").

A point sends `warmup + measured` Recommend calls at Poisson arrivals (`services.loadgen.run_open_loop`,
latency from each call's intended send time), the warm-up not counted. The ranking latency is the stub's
`rank_latency_ms`, the end-to-end one the Recommend's; a failed call is an infinitely slow one in both. A
call the stub abandoned after retrieval had no Rank: it is counted and left out of the latencies and the
verdict. Once the point has failed for certain (`failed_for_certain`, counting the load's earlier seeds,
`PointSpec.before`, and the calls its later seeds may add, `PointSpec.later`), sending stops (`aborted`);
stopped at a time budget's end (`stop_at`) it is `cut`, and its verdict says nothing.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import math
import time

from bench.lib.recommends import Load, open_loop
from bench.lib.schema import Cost, Percentiles, PointResult, Verdict
from bench.lib.schema_context import OverSlo
from bench.lib.stats import bootstrap_ci, error_budget, finite, meets_slo, percentile, violation_budget
from bench.lib.workload import RevisitSampler
from relaygr.v1 import common_pb2, recommend_pb2, trigger_pb2
from services.common.contract import cache_source_label
from services.loadgen.openloop import CallRecord

PERCENTILES = (50, 90, 99)
BURST_GAP_S = 0.25  # Ranks over the SLO sent this close one after another are one burst (`OverSlo`)


@dataclasses.dataclass(frozen=True)
class Before:
    """What the load seeds measured before this one at the same load: ranked calls, those over the SLO
    (failures included), failures."""

    ranked: int = 0
    violations: int = 0
    errors: int = 0


FIRST_SEED = Before()  # nothing measured before: the load's first seed


@dataclasses.dataclass(frozen=True)
class PointSpec:
    """What one point offers: which users, at which rate, for how many requests."""

    rate: float
    warmup: int
    measured: int
    timeout_s: float
    slo_ms: float
    max_error_fraction: float
    seed: int
    before: Before = FIRST_SEED  # the load's earlier seeds, pooled with this one's early stop
    later: int = 0  # measured calls the load's later seeds may still add (up to the seed cap)


def admit_label(reason: int) -> str:
    """The trigger's reason, or `no_answer` when no Admit answered (the baseline, or a failed Admit)."""
    if reason == trigger_pb2.ADMIT_REASON_UNSPECIFIED:
        return "no_answer"
    return trigger_pb2.AdmitReason.Name(reason).removeprefix("ADMIT_REASON_").lower()


def miss_label(reason: int) -> str:
    """A miss reason as results.json names it: `evicted_hbm`, `never_pre_inferred`, …"""
    return common_pb2.MissReason.Name(reason).removeprefix("MISS_REASON_").lower()


def _labels(answered: list[recommend_pb2.RecommendResponse]) -> dict[str, dict[str, int]]:
    """Where the answered Ranks' prefixes came from, why the misses missed, and what the trigger answered."""
    miss = common_pb2.CACHE_SOURCE_MISS
    return {
        "cache_sources": dict(collections.Counter(cache_source_label(a.cache_source) for a in answered)),
        "miss_reasons": dict(
            collections.Counter(miss_label(a.miss_reason) for a in answered if a.cache_source == miss)
        ),
        "admit_reasons": dict(collections.Counter(admit_label(a.admit_reason) for a in answered)),
    }


def over_slo(ranked: list[CallRecord], slo_ms: float, burst_gap_s: float = BURST_GAP_S) -> OverSlo:
    """What the ranked calls over the SLO were (failures included): see `bench.lib.schema_context.OverSlo`."""
    over = [r for r in ranked if not r.ok or r.response.rank_latency_ms > slo_ms]
    answered = [r.response for r in over if r.ok]
    bursts: list[int] = []
    last_s = -math.inf
    for record in sorted(over, key=lambda r: r.intended_s):
        if record.intended_s - last_s <= burst_gap_s:
            bursts[-1] += 1
        else:
            bursts.append(1)
        last_s = record.intended_s
    return OverSlo(
        requests=len(over),
        failed=len(over) - len(answered),
        **_labels(answered),
        prefix_wait_ms=round(sum(a.prefix_wait_ms for a in answered), 3),
        long_term_events=sum(a.long_term_length for a in answered),
        computed_prefix_events=sum(a.computed_prefix_events for a in answered),
        bursts=len(bursts),
        largest_burst=max(bursts, default=0),
        burst_gap_s=burst_gap_s,
    )


def _percentiles(samples: list[float]) -> Percentiles:
    return Percentiles(**{f"p{q}": finite(percentile(samples, q)) for q in PERCENTILES})


def summarize(
    records: list[CallRecord], spec: PointSpec, aborted: bool, wall_s: float, cut: bool = False
) -> PointResult:
    """The result of a point from its call records (warm-up calls included; they are skipped here)."""
    measured = [record for record in records if record.index >= spec.warmup]
    dropped = [record for record in measured if record.ok and record.response.abandoned]
    ranked = [record for record in measured if not (record.ok and record.response.abandoned)]
    answered = [record.response for record in ranked if record.ok]
    rank_ms = [record.response.rank_latency_ms if record.ok else math.inf for record in ranked]
    hbm_ms = [a.rank_latency_ms for a in answered if cache_source_label(a.cache_source) == "hbm"]
    codes = collections.Counter(record.code.name for record in ranked if not record.ok)
    errors = sum(codes.values())
    p99 = percentile(rank_ms, 99) if rank_ms else math.inf
    return PointResult(
        rate=spec.rate,
        measured=len(measured),
        planned=spec.measured,
        aborted=aborted,
        cut=cut,
        abandoned=len(dropped),
        abandoned_admitted=sum(1 for record in dropped if record.response.admitted),
        errors=errors,
        error_codes=dict(codes),
        violations=sum(1 for ms in rank_ms if ms > spec.slo_ms),
        rank_ms=_percentiles(rank_ms),
        rank_p99_ci_ms=[finite(bound) for bound in bootstrap_ci(rank_ms, 99, seed=spec.seed)],
        e2e_ms=_percentiles([record.latency_s * 1000 if record.ok else math.inf for record in ranked]),
        hbm_hit_rank_p50_ms=finite(percentile(hbm_ms, 50)),
        **_labels(answered),
        mean_long_term=round(sum(a.long_term_length for a in answered) / len(answered), 1)
        if answered
        else 0.0,
        send_lag_p99_ms=round(percentile([r.send_lag_s * 1000 for r in records], 99), 3) if records else 0.0,
        wall_s=round(wall_s, 2),
        meets_slo=not (aborted or cut)
        and meets_slo(p99, errors, len(ranked), spec.slo_ms, spec.max_error_fraction),
        over_slo=over_slo(ranked, spec.slo_ms),
        rank_samples_ms=tuple(rank_ms),
        latencies_ms=[finite(ms) for ms in rank_ms],
    )


def failed_for_certain(violations: int, errors: int, most_ranked: int, max_error_fraction: float) -> bool:
    """Whether a point has failed whatever its remaining calls do, when at most `most_ranked` of its
    measured calls can end up ranked: the budgets only grow with the ranked count, so this bounds them."""
    return violations > violation_budget(most_ranked) or errors >= error_budget(
        most_ranked, max_error_fraction
    )


async def run_point(
    address: str, sampler: RevisitSampler, spec: PointSpec, stop_at: float | None = None
) -> PointResult:
    """Drives one point against the retrieval stub at `address` and summarizes it; sending stops at
    `stop_at` (a `time.monotonic()` time) if the point is still running then."""
    stop = asyncio.Event()
    violations = errors = abandoned = 0
    cut = failed = False  # stopped at `stop_at`; failed for certain

    def cut_now() -> None:
        nonlocal cut
        if not stop.is_set():
            cut = True
            stop.set()

    def watch(record: CallRecord) -> None:
        nonlocal violations, errors, abandoned, failed
        if record.index < spec.warmup or stop.is_set():
            return
        if record.ok and record.response.abandoned:
            abandoned += 1
        else:
            errors += not record.ok
            violations += not record.ok or record.response.rank_latency_ms > spec.slo_ms
        before = spec.before
        most_ranked = spec.measured - abandoned + before.ranked + spec.later
        if failed_for_certain(
            violations + before.violations, errors + before.errors, most_ranked, spec.max_error_fraction
        ):
            failed = True
            stop.set()

    timer = None
    if stop_at is not None:
        timer = asyncio.get_running_loop().call_later(max(stop_at - time.monotonic(), 0.0), cut_now)
    started = time.perf_counter()
    load = Load(spec.rate, spec.warmup, spec.warmup + spec.measured, spec.timeout_s, spec.seed)
    records = await open_loop(address, sampler, load, stop=stop, on_record=watch)
    if timer is not None:
        timer.cancel()
    return summarize(records, spec, failed, time.perf_counter() - started, cut and not failed)


def describe(result: PointResult) -> str:
    """A point's result in one log line: latencies, requests, cache sources, verdict."""
    rank, e2e = result.rank_ms, result.e2e_ms
    total = sum(result.cache_sources.values()) or 1
    sources = " ".join(f"{k} {v / total:.0%}" for k, v in sorted(result.cache_sources.items()))
    verdict = "meets SLO" if result.meets_slo else ("FAILS (stopped early)" if result.aborted else "FAILS")
    low, high = result.rank_p99_ci_ms
    dropped = f", {result.abandoned} abandoned" if result.abandoned else ""
    return (
        f"rank P50 {rank.p50} P99 {rank.p99} [{low}, {high}] ms | e2e P99 {e2e.p99} ms | "
        f"{result.measured} req{dropped}, {result.errors} err | {sources} | {verdict}"
    )


def describe_cost(cost: Cost) -> str:
    """What a point cost the fleet in one log line: cores by process, the rankers' work."""
    wall = cost.wall_s or 1.0
    cores = " ".join(f"{name} {seconds / wall:.2f}" for name, seconds in sorted(cost.cpu_s.items()))
    rankers = cost.rankers
    return (
        f"cores used: {cores}, not ours {cost.foreign_cores:.2f} | "
        f"productions {rankers.get('productions', {})} | pre_infer {rankers.get('pre_infer', {})} | "
        f"joins {rankers.get('joins', 0):g} | wasted pre-infer {rankers.get('pre_infer_wasted_s', 0):g} s"
    )


def describe_verdict(verdict: Verdict) -> str:
    """A load's pooled verdict in one log line: seeds, requests, the pooled P99 and its interval."""
    low, high = verdict.rank_p99_ci_ms
    outcome = "meets SLO" if verdict.meets_slo else "FAILS"
    undecided = "" if verdict.decided else f" ({verdict.outcome})"
    return (
        f"verdict over seeds {verdict.seeds}: {verdict.requests} req, pooled rank P99 {verdict.rank_p99_ms} "
        f"[{low}, {high}] ms | {outcome}{undecided}"
    )
