"""One load point: open-loop Recommend traffic against a retrieval stub, and what it measured.

A point sends `warmup + measured` Recommend calls at Poisson arrivals (`services.loadgen.run_open_loop`,
latency from each call's intended send time). The first `warmup` calls fill caches and queues and are
not counted. Of the measured ones, the ranking latency is the stub's own `rank_latency_ms` (Rank through
the router, as the stub saw it) and the end-to-end latency is the Recommend's; a failed call counts as an
infinitely slow one in both. The P99 comes with its bootstrap confidence interval (`rank_p99_ci_ms`).

A call the stub abandoned (filtered after retrieval, `RecommendResponse.abandoned`) had no Rank: it is
counted (`abandoned`, and `abandoned_admitted` for those whose Admit fired a pre-inference) and left out
of the latency samples and the verdict, which are over the Ranks that happened. As soon as more measured
calls have missed the SLO than a passing P99 allows (or have failed more often than the error bound
allows) among as many ranked calls as the point can still have (its plan less the calls abandoned so
far), the point has failed for certain and sending stops: an overloaded fleet is not driven further into
overload for nothing, and the result says so (`aborted`). A load's verdict pools up to its seed cap's
seeds (`bench.lib.sweep.pooled_verdict`), so a seed's early stop counts what the load's earlier seeds measured
(`PointSpec.before`) and the calls its later seeds may still rank (`PointSpec.later`): it stops only when
the pooled sample at the cap has failed for certain. (Stopped at its own budget, a first seed near the
edge decided its load alone: the first headline run stopped RelayGR's 2048 events after 884 calls with
a P99 interval of [75, 134] ms around a 100 ms SLO.) A point may also be given a time to stop at
(`stop_at`, a run's time budget): stopped then, it is `cut`, and its verdict says nothing.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import math
import time

import grpc

from bench.lib.schema import Cost, Percentiles, PointResult, Verdict
from bench.lib.schema_context import OverSlo
from bench.lib.stats import bootstrap_ci, meets_slo, percentile, violation_budget
from bench.lib.workload import RevisitSampler
from relaygr.v1 import common_pb2, recommend_pb2, recommend_pb2_grpc, trigger_pb2
from services.common.contract import cache_source_label
from services.loadgen.openloop import CallRecord, run_open_loop

TOP_K = 10
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


def over_slo(ranked: list[CallRecord], slo_ms: float, burst_gap_s: float = BURST_GAP_S) -> OverSlo:
    """What the ranked calls over the SLO were (failures included): see `bench.lib.schema_context.OverSlo`."""
    over = [r for r in ranked if not r.ok or r.response.rank_latency_ms > slo_ms]
    answered = [r.response for r in over if r.ok]
    sources = collections.Counter(cache_source_label(a.cache_source) for a in answered)
    misses = collections.Counter(
        miss_label(a.miss_reason) for a in answered if a.cache_source == common_pb2.CACHE_SOURCE_MISS
    )
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
        cache_sources=dict(sources),
        miss_reasons=dict(misses),
        admit_reasons=dict(collections.Counter(admit_label(a.admit_reason) for a in answered)),
        prefix_wait_ms=round(sum(a.prefix_wait_ms for a in answered), 3),
        long_term_events=sum(a.long_term_length for a in answered),
        computed_prefix_events=sum(a.computed_prefix_events for a in answered),
        bursts=len(bursts),
        largest_burst=max(bursts, default=0),
        burst_gap_s=burst_gap_s,
    )


def _finite_or_none(value: float) -> float | None:
    return None if math.isinf(value) or math.isnan(value) else round(value, 3)


def _percentiles(samples: list[float]) -> Percentiles:
    return Percentiles(**{f"p{q}": _finite_or_none(percentile(samples, q)) for q in PERCENTILES})


def summarize(
    records: list[CallRecord], spec: PointSpec, aborted: bool, wall_s: float, cut: bool = False
) -> PointResult:
    """The result of a point from its call records (warm-up calls included; they are skipped here)."""
    measured = [record for record in records if record.index >= spec.warmup]
    dropped = [record for record in measured if record.ok and record.response.abandoned]
    ranked = [record for record in measured if not (record.ok and record.response.abandoned)]
    rank_ms, e2e_ms, hbm_ms, lengths = [], [], [], []
    sources: collections.Counter[str] = collections.Counter()
    misses: collections.Counter[str] = collections.Counter()
    admits: collections.Counter[str] = collections.Counter()
    codes: collections.Counter[str] = collections.Counter()
    for record in ranked:
        if not record.ok:
            codes[record.code.name] += 1
            rank_ms.append(math.inf)
            e2e_ms.append(math.inf)
            continue
        response: recommend_pb2.RecommendResponse = record.response
        rank_ms.append(response.rank_latency_ms)
        e2e_ms.append(record.latency_s * 1000)
        source = cache_source_label(response.cache_source)
        sources[source] += 1
        if source == "hbm":
            hbm_ms.append(response.rank_latency_ms)
        if response.cache_source == common_pb2.CACHE_SOURCE_MISS:
            misses[miss_label(response.miss_reason)] += 1
        admits[admit_label(response.admit_reason)] += 1
        lengths.append(response.long_term_length)
    errors = sum(codes.values())
    p = _percentiles(rank_ms)
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
        rank_ms=p,
        rank_p99_ci_ms=[_finite_or_none(bound) for bound in bootstrap_ci(rank_ms, 99, seed=spec.seed)],
        e2e_ms=_percentiles(e2e_ms),
        hbm_hit_rank_p50_ms=_finite_or_none(percentile(hbm_ms, 50)),
        cache_sources=dict(sources),
        miss_reasons=dict(misses),
        admit_reasons=dict(admits),
        mean_long_term=round(sum(lengths) / len(lengths), 1) if lengths else 0.0,
        send_lag_p99_ms=round(percentile([r.send_lag_s * 1000 for r in records], 99), 3) if records else 0.0,
        wall_s=round(wall_s, 2),
        meets_slo=not (aborted or cut)
        and meets_slo(p99, errors, len(ranked), spec.slo_ms, spec.max_error_fraction),
        over_slo=over_slo(ranked, spec.slo_ms),
        rank_samples_ms=tuple(rank_ms),
        latencies_ms=[_finite_or_none(ms) for ms in rank_ms],
    )


def failed_for_certain(violations: int, errors: int, most_ranked: int, max_error_fraction: float) -> bool:
    """Whether a point has failed whatever its remaining calls do, when at most `most_ranked` of its
    measured calls can end up ranked: the budgets only grow with the ranked count, so this bounds them."""
    error_budget = max(math.ceil(max_error_fraction * most_ranked), 1)  # this many errors fail the point
    return violations > violation_budget(most_ranked) or errors >= error_budget


async def run_point(
    address: str, sampler: RevisitSampler, spec: PointSpec, stop_at: float | None = None
) -> PointResult:
    """Drives one point against the retrieval stub at `address` and summarizes it; sending stops at
    `stop_at` (a `time.monotonic()` time) if the point is still running then."""
    stop = asyncio.Event()
    violations = errors = abandoned = 0
    cut = failed = False  # stopped at `stop_at`; failed for certain
    ranked_ms: list[float] = []

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
            ranked_ms.append(record.response.rank_latency_ms if record.ok else math.inf)
        before = spec.before
        most_ranked = spec.measured - abandoned + before.ranked + spec.later
        if failed_for_certain(
            violations + before.violations, errors + before.errors, most_ranked, spec.max_error_fraction
        ):
            failed = True
            stop.set()

    def request(index: int) -> recommend_pb2.RecommendRequest:
        return recommend_pb2.RecommendRequest(user_id=sampler.user(index), top_k=TOP_K)

    timer = None
    if stop_at is not None:
        timer = asyncio.get_running_loop().call_later(max(stop_at - time.monotonic(), 0.0), cut_now)
    started = time.perf_counter()
    async with grpc.aio.insecure_channel(address) as channel:
        records = await run_open_loop(
            recommend_pb2_grpc.RecommendServiceStub(channel).Recommend,
            request,
            rate=spec.rate,
            total=spec.warmup + spec.measured,
            timeout_s=spec.timeout_s,
            seed=spec.seed,
            stop=stop,
            on_record=watch,
        )
    if timer is not None:
        timer.cancel()
    return summarize(records, spec, failed, time.perf_counter() - started, cut and not failed)


def describe(result: PointResult) -> str:
    """A point's result in one log line: latencies, requests, cache sources, verdict."""
    rank, e2e = result.rank_ms, result.e2e_ms
    total = sum(result.cache_sources.values()) or 1
    sources = " ".join(f"{k} {v / total:.0%}" for k, v in sorted(result.cache_sources.items()))
    verdict = "meets SLO" if result.meets_slo else ("FAILS (stopped early)" if result.aborted else "FAILS")
    if result.passed_early:
        verdict += " (passed clearly: stopped early)"
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
