"""A rollout run's summary (`summarize_run`) and the figures across runs (`figures`), handoff off against
on, paired by seed: each seed's runs had the same arrivals and the same users.

The done-when figures:
1. `drained`: of the drained rankers' resident users (`bench.rollout.analysis.drain_outcome`, every
   drain of a run: the rolling restart's and the scale-in's), the share whose next call hit, per mode,
   with a Wilson interval on the seeds' effective counts and the on-off difference with Newcombe's
   (`bench.lib.intervals.proportion` and `proportion_difference`: a hit is a sample of 1, a miss of 0).
2. `failed`: failed calls, every measured phase's, per mode (0 expected).
3. `rollout_p99`: the Recommend P99 over the calls sent during the rolling restart, per mode with its
   block-bootstrap interval, and on less off with the paired interval (`bench.lib.intervals.p99_difference`:
   the same resampled positions in both modes, so the shared arrivals cancel), with each seed's ratio.
4. `scale_out`: the spare's returning users' hit share on their first call to it, against the steady
   phase's returning calls' hit share.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from bench.lib.intervals import Interval, p99_difference, p99_interval, proportion, proportion_difference
from bench.lib.stats import percentile
from bench.rollout.analysis import (
    Bucket,
    DrainOutcome,
    PhaseStats,
    ScaleOut,
    drain_outcome,
    phase_stats,
    returning,
    scale_out,
    timeline,
)
from bench.rollout.config import RolloutConfig
from bench.rollout.plan import MEASURED_PHASES, ROLLOUT, SCALE_IN, START, STEADY, Plan
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
    calls, samples, ttl_s = record.calls, record.samples, config.dram_ttl_s
    back = returning(calls, ttl_s)
    started = next((c for c in record.changes if c.action == START and c.ready_s is not None), None)
    spare = None
    if started is not None:
        spare = scale_out(calls, started.ranker, started.ready_s, plan.phase(SCALE_IN).start_s, back)
    rollout = plan.phase(ROLLOUT)
    return RunSummary(
        mode=record.mode,
        seed=record.seed,
        order=record.order,
        wall_s=record.wall_s,
        machine_busy_cores=record.machine_busy_cores,
        send_lag_p99_ms=round(percentile([c.send_lag_ms for c in calls], 99), 3) if calls else 0.0,
        latest_change_s=round(max((c.began_s - c.planned_s for c in record.changes), default=0.0), 3),
        changes=record.changes,
        phases=[phase_stats(calls, phase, samples, back) for phase in plan.phases],
        drains=[drain_outcome(calls, c, samples, ttl_s) for c in record.changes if c.signalled_s is not None],
        scale_out=spare,
        timeline=timeline(calls, samples, config.bucket_s, plan.duration_s),
        rollout_recommend_ms=[
            c.recommend_ms for c in sorted(calls, key=lambda c: c.index) if rollout.holds(c.intended_s)
        ],
    )


def phase(run: RunSummary, name: str) -> PhaseStats:
    return next(stats for stats in run.phases if stats.phase == name)


def _share(samples: list[list[float]], confidence: float) -> dict:
    count, total, effect, share = proportion(samples, 0.5, confidence)
    return {"hits": count, "of": total, "design_effect": round(effect, 3), "share": share}


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
    first = [[1.0] * s.first_hits + [0.0] * (s.first_visits - s.first_hits) for s in _spares(runs)]
    steady = [phase(run, STEADY) for run in runs]
    drains = [drain for run in runs for drain in run.drains]
    return ModeFigures(
        mode=runs[0].mode,
        seeds=[run.seed for run in runs],
        drained=_share([drained_samples(run) for run in runs], confidence),
        drained_draining=[sum(d.draining_hits for d in drains), sum(d.draining for d in drains)],
        drained_moved=[sum(d.moved_hits for d in drains), sum(d.moved for d in drains)],
        drained_back=[sum(d.back_hits for d in drains), sum(d.back for d in drains)],
        failed=sum(phase(run, name).failed for run in runs for name in MEASURED_PHASES),
        failed_by_phase={name: sum(phase(run, name).failed for run in runs) for name in MEASURED_PHASES},
        rollout_p99_ms=p99_interval([run.rollout_recommend_ms for run in runs], block, confidence),
        scale_out_first=_share(first, confidence) if any(first) else {},
        scale_out_calls=[sum(s.hits for s in _spares(runs)), sum(s.calls for s in _spares(runs))],
        steady_returning=_share(
            [[1.0] * s.returning_hits + [0.0] * (s.returning - s.returning_hits) for s in steady], confidence
        ),
        recompute_s={
            name: round(sum(phase(run, name).recompute_s for run in runs) / len(runs), 3)
            for name in MEASURED_PHASES
        },
        resident_bytes=_mean([sum(d.resident_bytes.values()) for d in drains]),
        received_bytes=_mean([d.received_bytes for d in drains]),
    )


def _spares(runs: Sequence[RunSummary]) -> list[ScaleOut]:
    return [run.scale_out for run in runs if run.scale_out is not None]


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
    per_seed = [
        {
            "seed": x.seed,
            "off_p99_ms": _finite(percentile(x.rollout_recommend_ms, 99)),
            "on_p99_ms": _finite(percentile(y.rollout_recommend_ms, 99)),
            "ratio": _ratio(percentile(y.rollout_recommend_ms, 99), percentile(x.rollout_recommend_ms, 99)),
            "off_drained_hit": _rate(drained_samples(x)),
            "on_drained_hit": _rate(drained_samples(y)),
        }
        for x, y in zip(off, on, strict=True)
    ]
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
    modes = [mode_figures(group, config.confidence, config.block()) for group in by_mode.values() if group]
    off, on = by_mode.get("off", []), by_mode.get("on", [])
    paired = bool(off) and [r.seed for r in off] == [r.seed for r in on]
    return Figures(modes, compare(off, on, config.confidence, config.block()) if paired else None)
