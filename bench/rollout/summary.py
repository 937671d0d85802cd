"""A rollout run's summary (`summarize_run`) and the figures across runs (`figures`), handoff off against
on, paired by seed (each seed's runs had the same arrivals and users): (1) `drained`, the drained rankers'
resident users whose next call hit, with a Wilson interval on the seeds' effective counts and the on-off
difference with Newcombe's; (2) `failed` calls over the measured phases; (3) `rollout_p99`, the rolling
restart's Recommend P99 with its block-bootstrap interval and on less off with the paired one
(`bench.lib.intervals.p99_difference`); (4) `scale_out`, the spare's returning users' first-call hit
share, against the steady phase's returning calls'.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from bench.lib.intervals import Interval, p99_difference, p99_interval, proportion, proportion_difference
from bench.lib.stats import percentile
from bench.rollout import analysis
from bench.rollout.analysis import Bucket, DrainOutcome, PhaseStats, ScaleOut
from bench.rollout.config import MEASURED_PHASES, ROLLOUT, SCALE_IN, START, STEADY, Plan, RolloutConfig
from bench.rollout.run import Change, RunRecord


@dataclasses.dataclass(frozen=True)
class RunSummary:
    mode: str
    seed: int
    order: int
    wall_s: float
    machine_busy_cores: float
    send_lag_p99_ms: float
    latest_change_s: float  # how much later than planned the latest fleet change was made
    changes: list[Change]
    phases: list[PhaseStats]
    drains: list[DrainOutcome]
    scale_out: ScaleOut | None
    timeline: list[Bucket]
    rollout_recommend_ms: list[float]  # the rolling restart's calls in send order (failed: inf)


def summarize_run(record: RunRecord, plan: Plan, config: RolloutConfig) -> RunSummary:
    calls, samples, ttl_s, r = record.calls, record.samples, config.dram_ttl_s, record
    back = analysis.returning(calls, ttl_s)
    started = next((c for c in r.changes if c.action == START and c.ready_s is not None), None)
    end_s = plan.phase(SCALE_IN).start_s
    spare = (
        None if started is None else analysis.scale_out(calls, started.ranker, started.ready_s, end_s, back)
    )
    rollout = plan.phase(ROLLOUT)
    return RunSummary(
        r.mode, r.seed, r.order, r.wall_s, r.machine_busy_cores,
        round(percentile([c.send_lag_ms for c in calls], 99), 3) if calls else 0.0,
        round(max((c.began_s - c.planned_s for c in r.changes), default=0.0), 3),
        r.changes, [analysis.phase_stats(calls, phase, samples, back) for phase in plan.phases],
        [analysis.drain_outcome(calls, c, samples, ttl_s) for c in r.changes if c.signalled_s is not None],
        spare, analysis.timeline(calls, samples, config.bucket_s, plan.duration_s),
        [c.recommend_ms for c in sorted(calls, key=lambda c: c.index) if rollout.holds(c.intended_s)],
    )  # fmt: skip


def phase(run: RunSummary, name: str) -> PhaseStats:
    return next(stats for stats in run.phases if stats.phase == name)


def _share(samples: list[list[float]], confidence: float) -> dict:
    count, total, effect, share = proportion(samples, 0.5, confidence)
    return {"hits": count, "of": total, "design_effect": round(effect, 3), "share": share}


def _hits(hits: int, total: int) -> list[float]:
    return [1.0] * hits + [0.0] * (total - hits)


@dataclasses.dataclass(frozen=True)
class ModeFigures:
    mode: str
    seeds: list[int]
    drained: dict  # hits, of, design effect, share (an Interval)
    drained_draining: list[int]  # [hits, of] of the next calls the draining ranker answered itself
    drained_moved: list[int]  # [hits, of] of the next calls that went to another ranker
    drained_back: list[int]  # [hits, of] of those that came back to the restarted ranker
    failed: int  # measured phases'
    failed_by_phase: dict[str, int]
    rollout_p99_ms: Interval
    scale_out_first: dict  # hits, of, design effect, share: the spare's returning users' first calls
    scale_out_calls: list[int]  # [hits, of]: every returning call the spare answered
    steady_returning: dict  # hits, of, design effect, share
    recompute_s: dict[str, float]  # by phase, mean over the seeds
    resident_bytes: float  # mean per drain: what a drained ranker held (HBM + DRAM) just before its SIGTERM
    received_bytes: float  # mean per drain: what its peers received meanwhile


def drained_samples(run: RunSummary) -> list[float]:
    return [1.0 if hit else 0.0 for drain in run.drains for hit in drain.next_hit.values()]


def mode_figures(runs: Sequence[RunSummary], confidence: float, block: int) -> ModeFigures:
    spares = [run.scale_out for run in runs if run.scale_out is not None]
    first = [_hits(s.first_hits, s.first_visits) for s in spares]
    steady = [phase(run, STEADY) for run in runs]
    drains = [drain for run in runs for drain in run.drains]

    def count(kind: str) -> list[int]:
        return [sum(getattr(d, f"{kind}_hits") for d in drains), sum(getattr(d, kind) for d in drains)]

    return ModeFigures(
        mode=runs[0].mode, seeds=[run.seed for run in runs],
        drained=_share([drained_samples(run) for run in runs], confidence),
        drained_draining=count("draining"), drained_moved=count("moved"), drained_back=count("back"),
        failed=sum(phase(run, name).failed for run in runs for name in MEASURED_PHASES),
        failed_by_phase={name: sum(phase(run, name).failed for run in runs) for name in MEASURED_PHASES},
        rollout_p99_ms=p99_interval([run.rollout_recommend_ms for run in runs], block, confidence),
        scale_out_first=_share(first, confidence) if any(first) else {},
        scale_out_calls=[sum(s.hits for s in spares), sum(s.calls for s in spares)],
        steady_returning=_share([_hits(s.returning_hits, s.returning) for s in steady], confidence),
        recompute_s={
            name: round(sum(phase(run, name).recompute_s for run in runs) / len(runs), 3)
            for name in MEASURED_PHASES
        },
        resident_bytes=_mean([sum(d.resident_bytes.values()) for d in drains]),
        received_bytes=_mean([d.received_bytes for d in drains]),
    )  # fmt: skip


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 1) if values else 0.0


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Handoff on against off, paired by seed."""

    seeds: list[int]
    drained_difference: Interval  # on's share less off's
    rollout_p99_difference_ms: Interval | None  # on's P99 less off's (None: the seeds' calls differ)
    rollout_p99_ratio: float | None  # on's pooled P99 over off's
    per_seed: list[dict]


def compare(off: Sequence[RunSummary], on: Sequence[RunSummary], confidence: float, block: int) -> Comparison:
    """`off` and `on` are the same seeds' runs in the same order."""
    a = [run.rollout_recommend_ms for run in off]
    b = [run.rollout_recommend_ms for run in on]
    paired = [len(x) for x in a] == [len(y) for y in b] and all(map(len, a))
    p99 = lambda samples: percentile([x for seed in samples for x in seed], 99)  # noqa: E731
    per_seed = []
    for x, y in zip(off, on, strict=True):
        x_p99, y_p99 = percentile(x.rollout_recommend_ms, 99), percentile(y.rollout_recommend_ms, 99)
        per_seed.append({
            "seed": x.seed, "off_p99_ms": _finite(x_p99), "on_p99_ms": _finite(y_p99),
            "ratio": _ratio(y_p99, x_p99), "off_drained_hit": _rate(drained_samples(x)),
            "on_drained_hit": _rate(drained_samples(y)),
        })  # fmt: skip
    return Comparison(
        seeds=[run.seed for run in off],
        drained_difference=proportion_difference(
            [drained_samples(run) for run in off], [drained_samples(run) for run in on], 0.5, confidence
        ),
        rollout_p99_difference_ms=p99_difference(a, b, block, confidence) if paired else None,
        rollout_p99_ratio=_ratio(p99(b), p99(a)) if paired else None,
        per_seed=per_seed,
    )


def _finite(value: float) -> float | None:
    return None if math.isinf(value) or math.isnan(value) else round(value, 3)


def _ratio(b: float, a: float) -> float | None:
    return round(b / a, 3) if a and math.isfinite(a) and math.isfinite(b) else None


def _rate(samples: list[float]) -> float | None:
    return round(sum(samples) / len(samples), 4) if samples else None


@dataclasses.dataclass(frozen=True)
class Figures:
    modes: list[ModeFigures]
    comparison: Comparison | None  # with both modes run


def figures(runs: Sequence[RunSummary], config: RolloutConfig) -> Figures:
    by_mode = {
        mode: sorted((r for r in runs if r.mode == mode), key=lambda r: r.seed)
        for mode in config.mode_names()
    }
    level, block = config.confidence, config.block(config.rate)
    modes = [mode_figures(group, level, block) for group in by_mode.values() if group]
    off, on = by_mode.get("off", []), by_mode.get("on", [])
    paired = bool(off) and [r.seed for r in off] == [r.seed for r in on]
    return Figures(modes, compare(off, on, level, block) if paired else None)
