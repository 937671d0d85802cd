"""From a run's blocks and trials to its estimates (`analyse`): every arm pooled over a set of blocks, the
ratios r_k with their block-bootstrap and t intervals, the fixed-sequence decision, RelayGR against
admit-all, and how the blocks' slowdown tracked the baseline's own P99.

A run is analysed twice: over the blocks kept (slowdown within `--drift-limit`: the headline) and over
every complete block (the report shows both). Only complete blocks count (every arm ran in them), so every
ratio pairs its two arms block by block. Where every block timed its own u, each block's latencies are
pooled in its u (shown as ms at the blocks' median u) and each Rank is judged against its block's SLO, so a
slower spell's blocks count at the same share of the host's speed as the others.
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Sequence

import numpy as np

from bench.headline import stats
from bench.headline.config import ADMIT_ALL, BASELINE, RELAY, HeadlineConfig
from bench.headline.schema import Analysis, ArmSummary, Block, Calibration, Estimate, Over, Step, Trial
from bench.lib import orders

SLO_SHARE = 0.01  # a P99 meets the SLO when fewer than 1 % of the Ranks are over it


def latencies(trial: Trial) -> list[float]:
    """A trial's measured Rank latencies, a failed call as an infinitely slow one."""
    return [math.inf if ms is None else ms for ms in trial.rank_ms]


def trial_p99(trial: Trial) -> float:
    """A trial's own P99 (nearest rank, failures as infinitely slow)."""
    return stats.pooled_p99([latencies(trial)])


def estimate(numerator: Sequence[Sequence[float]], denominator: Sequence[Sequence[float]],
             config: HeadlineConfig) -> Estimate:  # fmt: skip
    r = stats.p99_ratio(numerator, denominator, config.confidence, config.resamples, seed=0)

    def clean(x: float | None) -> float | None:
        return None if x is None or not math.isfinite(x) else round(float(x), 4)

    return Estimate(
        value=clean(r.value), low=clean(r.low), high=clean(r.high), upper=clean(r.upper),
        t_low=clean(r.t_low), t_high=clean(r.t_high), t_upper=clean(r.t_upper), blocks=r.blocks,
    )  # fmt: skip


def why(over: Over) -> str:
    """A Rank over the SLO in a word or two: its prefix's source, and the miss's reason where it missed."""
    reason = over.miss_reason
    return over.source if reason in ("", "unspecified") else f"{over.source}/{reason}"


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (ties take their mean rank); None with fewer than three pairs or a
    constant series."""
    if len(x) < 3:
        return None

    def ranks(values: Sequence[float]) -> np.ndarray:
        array = np.asarray(values, dtype=float)
        order = array.argsort(kind="stable")
        out = np.empty(len(array))
        out[order] = np.arange(len(array), dtype=float)
        for value in np.unique(array):  # ties: their mean rank
            tied = array == value
            out[tied] = out[tied].mean()
        return out

    a, b = ranks(x), ranks(y)
    if a.std() == 0 or b.std() == 0:
        return None
    return round(float(np.corrcoef(a, b)[0, 1]), 3)


def complete(blocks: Sequence[Block], trials: Sequence[Trial], config: HeadlineConfig) -> list[int]:
    """The blocks in which every arm ran."""
    ran = collections.defaultdict(set)
    for trial in trials:
        ran[trial.block].add(trial.arm)
    names = {arm.name for arm in config.arms()}
    return [block.index for block in blocks if names <= ran[block.index]]


def analyse(
    blocks: Sequence[Block],
    trials: Sequence[Trial],
    calibration: Calibration,
    config: HeadlineConfig,
    kept_only: bool,
) -> Analysis | None:
    """The estimates over the complete blocks (the kept ones only, with `kept_only`); None without one."""
    whole = set(complete(blocks, trials, config))
    chosen = [b for b in blocks if b.index in whole and (b.kept or not kept_only)]
    if not chosen:
        return None
    indices = [b.index for b in chosen]
    by = {(t.block, t.arm): t for t in trials}
    arms = config.arms()
    units = {b.index: b.unit(calibration) for b in chosen}
    u = statistics.median(unit for unit, _ in units.values())

    def pooled(arm_name: str) -> list[list[float]]:
        """The arm's latencies block by block, each block's in its own u, as ms at the blocks' median u."""
        return [[ms * (u / units[index][0]) for ms in latencies(by[(index, arm_name)])] for index in indices]

    summaries = {}
    for arm in arms:
        blocks_of = pooled(arm.name)
        values = [ms for block in blocks_of for ms in block]
        over = sum(ms > units[index][1] for index in indices for ms in latencies(by[(index, arm.name)]))
        p_value, meets = stats.over_slo_test(over, len(values), SLO_SHARE, config.confidence)
        p99 = stats.pooled_p99(blocks_of)
        sources: collections.Counter[str] = collections.Counter()
        over_sources: collections.Counter[str] = collections.Counter()
        for index in indices:
            trial = by[(index, arm.name)]
            sources.update(trial.sources)
            over_sources.update(why(o) for o in trial.over)
        summaries[arm.name] = ArmSummary(
            arm=arm.name,
            mode=arm.mode,
            multiple=arm.multiple,
            rate=round(statistics.median(by[(index, arm.name)].rate for index in indices), 3),
            ranks=len(values),
            over=over,
            p99_ms=round(p99, 3),
            p99_u=round(p99 / u, 3),
            slo_p_value=float(f"{p_value:.4g}"),
            meets_slo=meets,
            block_p99_ms=[round(trial_p99(by[(index, arm.name)]), 3) for index in indices],
            sources=dict(sorted(sources.items())),
            over_sources=dict(over_sources.most_common()),
        )
    baseline = next(arm for arm in arms if arm.mode == BASELINE)
    base = pooled(baseline.name)
    relay = [arm for arm in arms if arm.mode == RELAY]
    ratios = {arm.multiple: estimate(pooled(arm.name), base, config) for arm in relay}
    claimed, decided = stats.fixed_sequence(
        [
            (arm.multiple, ratios[arm.multiple].upper or math.inf, summaries[arm.name].meets_slo)
            for arm in relay
        ]
    )
    steps = [
        Step(
            multiple=d.multiple,
            ratio=ratios[d.multiple],
            meets_slo=d.meets_slo,
            tested=d.tested,
            passed=d.passed,
        )
        for d in decided
    ]
    relay_at = {arm.multiple: arm.name for arm in relay}
    against = {
        f"{arm.multiple:g}": estimate(pooled(relay_at[arm.multiple]), pooled(arm.name), config)
        for arm in arms
        if arm.mode == ADMIT_ALL and arm.multiple in relay_at
    }
    return Analysis(
        blocks=indices,
        balanced=orders.is_balanced([b.order for b in chosen]),
        arms=[summaries[arm.name] for arm in arms],
        steps=steps,
        claimed=claimed,
        against_admit_all=against,
        drift_p99_correlation=spearman([b.slowdown for b in chosen], summaries[baseline.name].block_p99_ms),
    )
