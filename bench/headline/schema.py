"""results.json of the block experiment (`python -m bench headline`), as dataclasses that `bench.lib.codec`
writes and reads, and the analysis computed from it (`analyse`), which the report and the README render:
the settings and context, the calibration (u, L, the canary's reference), the design, every block and every
trial with its latencies, and the estimates over a set of blocks.

A run is analysed twice: over the blocks kept (the headline) and over every block. Only complete blocks
count (every arm ran in them), so every ratio pairs its two arms block by block. Where every block timed its
own u, each block's latencies are pooled in its u (shown as ms at the blocks' median u) and each Rank is
judged against its block's SLO, so a slower spell's blocks count at the same share of the host's speed.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.headline import stats
from bench.headline.config import ADMIT_ALL, BASELINE, RELAY, HeadlineConfig
from bench.lib import codec, envelope, orders
from bench.lib.fleets import FleetShape
from bench.lib.schema import Machine, Versions
from bench.lib.workload import Universe


@dataclasses.dataclass(frozen=True, kw_only=True)
class Calibration:
    """What the run fixed on the idle host before its first fleet started, and the canary's reference."""

    u_ms: float  # the host's unit: the median of `unit_timings_ms`
    unit_length: int  # the full pass's long-term length (the mix's cap)
    unit_timings_ms: list[float]
    load_per_u: float  # λ: L = λ / u
    rate: float  # L, Recommend/s
    slo_ms: float
    relay_window_ms: float
    canary_reference_ms: float  # the median of `canary_readings_ms`
    canary_readings_ms: list[float]  # with the fleets up, warm and drained, before the first block
    steal_share: float  # the hypervisor's share while u was timed


@dataclasses.dataclass(frozen=True, kw_only=True)
class Over:
    """One measured Rank over the SLO (or failed), with what its answer said about its prefix."""

    index: int  # its place among the trial's measured requests
    rank_ms: float | None  # None: the call failed
    source: str  # where its prefix came from (hbm, dram, extended, miss), or failed
    miss_reason: str
    admit_reason: str
    long_term: int  # its long-term history's length, events
    prefix_wait_ms: float  # how long the Rank waited for its prefix
    computed_events: int  # long-term events computed on the Rank's critical path


@dataclasses.dataclass(frozen=True, kw_only=True)
class Trial:
    """One arm run once in one block: its measured requests in send order."""

    block: int
    position: int  # its place in the block's order (0: first)
    arm: str
    mode: str
    multiple: float
    rate: float
    seed: int  # the block's arrival seed
    users: str  # the users' namespace (new for every block and load)
    warmup: int  # requests sent before the measured ones, at the same rate, not counted
    errors: int
    started_s: float  # seconds from the run's start
    wall_s: float
    send_lag_p99_ms: float
    foreign_cores: float  # cores other processes than its fleet and load generator took meanwhile
    steal_share: float
    canary_idle_ms: list[float]  # the canary on the drained host just before the trial
    canary_load_ms: list[float]  # the canary once a second during the trial
    sources: dict[str, int]  # measured Ranks by where their prefix came from
    rank_ms: list[float | None]  # the stub's Rank latency of each measured request; None: it failed
    over: list[Over]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Block:
    """One arrival seed with every arm once, in a Williams order."""

    index: int
    seed: int
    order: list[str]  # arm names in the order they ran
    topped_up_for: int | None = dataclasses.field(default=None, metadata=codec.OMIT_NONE)  # block it replaces
    started_s: float
    duration_s: float
    canary_ms: float  # the median of its trials' idle canary readings
    # The host's speed so far, which s compares it with (absent: the calibration's reference).
    canary_reference_ms: float | None = dataclasses.field(default=None, metadata=codec.OMIT_NONE)
    # u timed on the drained host just before the block, and the L and SLO it sets (absent: a run that
    # timed u once, before its fleets started, and held the calibration's).
    u_ms: float | None = dataclasses.field(default=None, metadata=codec.OMIT_NONE)
    unit_timings_ms: list[float] | None = dataclasses.field(default=None, metadata=codec.OMIT_NONE)
    rate: float | None = dataclasses.field(default=None, metadata=codec.OMIT_NONE)
    slo_ms: float | None = dataclasses.field(default=None, metadata=codec.OMIT_NONE)
    steal_share: float
    slowdown: float  # s: `bench.headline.stats.slowdown` of the two
    # The most cores other processes took during one of its trials (absent: runs before the rule).
    foreign_cores: float | None = dataclasses.field(default=None, metadata=codec.OMIT_NONE)
    kept: bool  # s within --drift-limit, foreign cores within --foreign-limit

    def unit(self, calibration: Calibration) -> tuple[float, float]:
        """The block's u and SLO, ms: its own, or the calibration's in a run that timed u once."""
        if self.u_ms is None or self.slo_ms is None:
            return calibration.u_ms, calibration.slo_ms
        return self.u_ms, self.slo_ms


@dataclasses.dataclass(frozen=True, kw_only=True)
class Estimate:
    """A ratio of pooled P99s over blocks, with its block-bootstrap and t intervals."""

    value: float | None  # None: infinite (a failed call set a P99)
    low: float | None
    high: float | None
    upper: float | None  # one-sided upper bound at the run's confidence
    t_low: float | None
    t_high: float | None
    t_upper: float | None
    blocks: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArmSummary:
    """One arm over the blocks an analysis pools."""

    arm: str
    mode: str
    multiple: float
    rate: float
    ranks: int
    over: int  # Ranks over the SLO, failures included
    p99_ms: float
    p99_u: float
    slo_p_value: float  # the binomial test of a share over the SLO of at least 1 %
    meets_slo: bool
    block_p99_ms: list[float]  # each pooled block's own P99
    sources: dict[str, int]
    over_sources: dict[str, int]  # the Ranks over the SLO by source and miss reason


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step:
    """One multiple of the fixed-sequence decision."""

    multiple: float
    ratio: Estimate  # r_k: RelayGR at kL over the baseline at L
    meets_slo: bool
    tested: bool
    passed: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Analysis:
    """The statistics over one set of blocks (the kept ones, or all of them)."""

    blocks: list[int]
    balanced: bool  # the blocks' orders are a balanced Williams set
    arms: list[ArmSummary]
    steps: list[Step]
    claimed: float | None  # the k claimed: RelayGR carries k times L at no worse P99
    against_admit_all: dict[str, Estimate]  # by multiple: RelayGR's P99 over admit-all's
    drift_p99_correlation: float | None  # Spearman's rho of blocks' slowdown and the baseline's P99


@dataclasses.dataclass(frozen=True, kw_only=True)
class HeadlineResults:
    started_at: str
    duration_s: float
    commit: str
    machine: Machine
    versions: Versions
    settings: HeadlineConfig
    fleet: FleetShape
    universe: Universe
    calibration: Calibration
    design: list[list[str]]  # the planned orders, one per block
    blocks: list[Block]
    trials: list[Trial]
    kept: Analysis | None = dataclasses.field(default=None, metadata=codec.OMIT_NONE)  # the headline's
    every: Analysis | None = dataclasses.field(default=None, metadata=codec.OMIT_NONE)  # every block

    def to_json(self) -> dict[str, Any]:
        return codec.to_json(self)

    def write(self, path: Path) -> None:
        envelope.write(path, "headline", self.to_json())

    @classmethod
    def read(cls, path: Path) -> HeadlineResults:
        return codec.from_json(cls, envelope.read(path, "headline"), str(path))


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


def analyse(
    blocks: Sequence[Block], trials: Sequence[Trial], calibration: Calibration, config: HeadlineConfig,
    kept_only: bool,
) -> Analysis | None:  # fmt: skip
    """The estimates over the complete blocks, those in which every arm ran (the kept ones only, with
    `kept_only`); None without one."""
    by = {(t.block, t.arm): t for t in trials}
    arms = config.arms()
    chosen = [b for b in blocks if all((b.index, a.name) in by for a in arms) and (b.kept or not kept_only)]
    if not chosen:
        return None
    indices = [b.index for b in chosen]
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
            arm=arm.name, mode=arm.mode, multiple=arm.multiple,
            rate=round(statistics.median(by[(index, arm.name)].rate for index in indices), 3),
            ranks=len(values), over=over, p99_ms=round(p99, 3), p99_u=round(p99 / u, 3),
            slo_p_value=float(f"{p_value:.4g}"), meets_slo=meets,
            block_p99_ms=[round(trial_p99(by[(index, arm.name)]), 3) for index in indices],
            sources=dict(sorted(sources.items())), over_sources=dict(over_sources.most_common()),
        )  # fmt: skip
    baseline = next(arm for arm in arms if arm.mode == BASELINE)
    base = pooled(baseline.name)
    relay = [arm for arm in arms if arm.mode == RELAY]
    ratios = {arm.multiple: estimate(pooled(arm.name), base, config) for arm in relay}
    claimed, decided = stats.fixed_sequence(
        [(k.multiple, ratios[k.multiple].upper or math.inf, summaries[k.name].meets_slo) for k in relay]
    )
    steps = [Step(multiple=d.multiple, ratio=ratios[d.multiple], meets_slo=d.meets_slo, tested=d.tested,
                  passed=d.passed) for d in decided]  # fmt: skip
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
