"""results.json's schema: what a run measured, as dataclasses (`bench.lib.codec` writes and reads them).

A `Run` (`python -m bench run`) or a `GpuRun` (`--profile gpu`, `bench.lib.schema_gpu`) is the headline
ratios, the run's context (`bench.lib.schema_context`: machine, versions; configuration, profile) and what
it measured, written into the same object. A sweep is its `Point`s and its answer; a load's verdict pooled
over its seeds is its first seed's point's `Verdict`; a sweep's bracket is its `best` and `first_failure`.
Fields with a default are the ones a record may lack: reading one, the default applies. Every committed
results file is in this schema (`tests/bench/test_results.py`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypeVar

from bench.lib import codec, envelope, schema_context
from bench.lib.codec import FLAT, OMIT_NONE, TRANSIENT, optional, schema, usually
from bench.lib.config import BenchConfig, Profile
from bench.lib.fleets import FleetShape, Mode
from bench.lib.schema_context import CachedRankPoint, FloorPoint, Machine, RunChecks, Versions
from bench.lib.workload import Universe

R = TypeVar("R", bound="Run")
P = TypeVar("P", bound="Point")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Percentiles:
    """Latency percentiles, ms; None where one falls on a failed request."""

    p50: float | None
    p90: float | None
    p99: float | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PointResult:
    """What one point measured (`bench.lib.points.summarize`). The length sweep's points say at which
    long-term length and relay window (`long_term`, `delay_ms`; absent from other points)."""

    long_term: int | None = optional()
    delay_ms: float | None = optional()
    rate: float
    measured: int  # measured requests sent (fewer than planned when aborted), abandoned ones included
    planned: int
    aborted: bool
    cut: bool = False  # stopped at its `stop_at` before it had failed: neither a pass nor a failure
    abandoned: int  # measured requests the stub abandoned after retrieval: no Rank, not in the verdict
    abandoned_admitted: int  # of those, the ones whose Admit fired a pre-inference no Rank will consume
    errors: int
    error_codes: dict[str, int]
    violations: int
    rank_ms: Percentiles  # the ranking latency
    rank_p99_ci_ms: list[float | None]  # bootstrap 95% interval of the P99 (None: an infinite bound)
    e2e_ms: Percentiles  # the Recommend latency
    hbm_hit_rank_p50_ms: float | None  # median ranking latency of the Ranks served from HBM
    cache_sources: dict[str, int]  # hbm, dram, extended, miss
    miss_reasons: dict[str, int]
    admit_reasons: dict[str, int]
    mean_long_term: float
    send_lag_p99_ms: float
    wall_s: float
    meets_slo: bool  # this measurement's own verdict (a load's pooled one: `Point.verdict`)
    # Each ranked call's ranking latency in send order (None: it failed), for replaying verdict rules.
    latencies_ms: list[float | None] | None = dataclasses.field(default=None, metadata=OMIT_NONE)
    over_slo: schema_context.OverSlo | None = dataclasses.field(default=None, metadata=OMIT_NONE)
    # The ranking latencies the percentiles are of, in memory only: a load's verdict pools its seeds'.
    rank_samples_ms: tuple[float, ...] = dataclasses.field(default=(), repr=False, compare=False,
                                                           metadata=TRANSIENT)  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cost:
    """What a point cost the fleet, warm-up included (`bench.lib.probes.difference`): CPU seconds by process,
    the change of the rankers' counters (by metric: productions, pre_infer, joins, device_s, …), the
    wall seconds, and the cores other users of the machine took."""

    cpu_s: dict[str, float]
    rankers: dict[str, Any]
    wall_s: float
    foreign_cores: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class Point(PointResult):
    """A measured point as a run records it: its load seed and its cost beside what it measured."""

    seed: int
    cost: Cost
    # The load's verdict over its seeds (absent: this point's own, as in runs before it).
    verdict: Verdict | None = dataclasses.field(default=None, metadata=OMIT_NONE)

    @property
    def passes(self) -> bool:
        """Whether the load met the SLO: its pooled verdict, or this point's own where it has none."""
        return self.meets_slo if self.verdict is None else self.verdict.meets_slo


@schema
class Verdict:
    """A load's sequential verdict (`bench.lib.sweep.pooled_verdict`): its load seeds, the ranked requests
    pooled over them, their P99 with its bootstrap interval at the per-look `confidence`, and whether the
    load met the SLO; `outcome` says how it ended."""

    seeds: list[int]
    requests: int
    rank_p99_ms: float | None  # None: it falls on a failed request
    rank_p99_ci_ms: list[float | None]
    meets_slo: bool
    decided: bool
    points: list[Point]  # the other seeds' points, the first seed's being the one that holds this
    stopped_early: bool = usually(False)
    confidence: float  # the confidence of each look's interval

    @property
    def outcome(self) -> str:
        """How the verdict ended: decided (the interval excluded the SLO, or the errors failed the sample at
        the seed cap), stopped early (a seed had failed for certain: the load fails), or undecided (at the
        seed cap, where the pooled P99 decided alone, or a seed cut by a time budget)."""
        if self.decided:
            return "decided"
        if self.stopped_early:
            return "stopped early"
        if any(point.cut for point in self.points):
            return "undecided (a seed was cut)"
        return "undecided at the seed cap (the pooled P99 decided)"


def recorded(cls: type[P], result: PointResult, **more: Any) -> P:
    """A point as a run records it (`cls`: `Point`, `GpuPoint`), from what it measured and `more`."""
    measured = {field.name: getattr(result, field.name) for field in dataclasses.fields(PointResult)}
    return cls(**measured, **more)


@schema
class Repeat:
    """A verdict point measured again with other load seeds, the sweep's own measurement first."""

    role: str  # best, first_failure
    rate: float
    seeds: list[int]
    rank_p99_ms: list[float | None]
    rank_p99_ci_ms: list[list[float | None]]
    meets_slo: list[bool]
    agree: bool
    points: list[Point]  # the other seeds' points


@schema
class Sweep:
    """One mode's sweep: every point measured, and the largest value that met the SLO."""

    points: list[Point] = dataclasses.field(default_factory=list)
    best: float | None = None
    at_grid_top: bool = False  # the best is the grid's last value: the true limit may be higher
    # The lowest value above the best whose load failed: the edge lies in [best, first_failure) (absent
    # when nothing above the best failed).
    first_failure: float | None = optional()
    refined: list[float] = dataclasses.field(default_factory=list)  # values measured between grid values
    # The verdict points (the best, the first failure above it) measured again with other load seeds.
    repeats: list[Repeat] = dataclasses.field(default_factory=list)
    seeds_agree: bool | None = None  # every seed gave every repeated point its verdict (None: no repeats)


@schema
class Waste:
    """RelayGR's rankers' wasted pre-inference over a pair of sweeps: device seconds of prefixes no Rank
    consumed, their device-thread seconds, the wasted share of them (None without device time), and
    pre-inferred tokens by fate."""

    wasted_pre_infer_s: float
    device_s: float
    wasted_share: float | None
    pre_infer_tokens: dict[str, float]


@schema
class LengthSweep:
    """Experiment 1: both modes' length sweeps at one offered load."""

    rate: float
    baseline: Sweep
    relay: Sweep


@schema
class Mix:
    """Experiment 2 on one length mix: both modes' load sweeps, their ratio and the waste over them."""

    universe: str
    max_long_term: int
    baseline: Sweep
    relay: Sweep
    ratio: float | None
    ratio_interval: list[float | None] | None = optional()  # `ratio_interval` of the two brackets
    waste: Waste = dataclasses.field(metadata=FLAT)
    # The same load sweeps judged at the other SLO multiples of u, by `f"{multiple:g}"` (the first mix
    # only; absent from runs before them).
    capacity: dict[str, Capacity] | None = optional()


@schema
class ModePair:
    baseline: Sweep
    relay: Sweep


@schema
class Capacity:
    """Both modes' load sweeps on the first mix judged at another SLO, a multiple of the host's unit u:
    each mode's capacity there with its bracket, and their ratio (`bench.run.experiments.Bench.capacity`)."""

    multiple: float
    slo_ms: float
    baseline: Sweep
    relay: Sweep
    ratio: float | None
    ratio_interval: list[float | None]


@schema
class Fraction:
    """Both modes' load sweeps on the first mix at one share of abandoned requests (share 0: the first
    mix's throughput sweeps, `sweeps` None)."""

    fraction: float
    sweeps: ModePair | None
    baseline_best: float | None
    relay_best: float | None
    ratio: float | None
    ratio_interval: list[float | None] | None = optional()  # `ratio_interval` of the two brackets
    waste: Waste = dataclasses.field(metadata=FLAT)


@schema
class Abandonment:
    universe: str
    fractions: dict[str, Fraction]  # by share, as `f"{share:g}"`


@schema
class Ablations:
    universe: str
    rate: float  # the grid load at or below RelayGR's best, where every ablation's sweep starts
    sweeps: dict[str, Sweep]  # by mode
    # By mode, for each ablation on a fleet of its own: RelayGR's load sweep measured one load seed of each
    # in turn with it, on the same users, so that both see the same minutes of the machine.
    relay_beside: dict[str, Sweep] = usually({})

    def relay_for(self, mode: str, first_mix_relay: Sweep) -> Sweep:
        """RelayGR's sweep that the ablation `mode` is compared with: the one measured beside it, else (a
        mode on RelayGR's own fleet, or a run before it) the first mix's."""
        return self.relay_beside.get(mode, first_mix_relay)


@schema
class Measurements:
    """What `Bench.run` measured (see `bench.run.experiments`)."""

    floor: list[FloorPoint]  # timed before any fleet starts
    cached_rank: list[CachedRankPoint]
    length_sweep: LengthSweep
    throughput_sweeps: dict[str, Mix]  # by mix label, the first mix first
    abandonment: Abandonment
    window_sensitivity: dict[str, Sweep]  # RelayGR's length sweep by relay window, as `f"{ms:g}"`
    ablations: Ablations
    modes: dict[str, Mode]
    fleet: FleetShape
    mix_universes: list[Universe]
    floor_end: list[FloorPoint] | None = optional()  # timed again after the last fleet stopped
    host_unit: schema_context.HostUnit | None = optional()  # absent: the run's bounds were absolute


@schema
class Run:
    """A run's results.json: the headline ratios first, then the run's context, then what it measured."""

    name: str
    throughput_ratio: float | None  # the first mix's
    throughput_ratios: dict[str, float | None]  # every mix's
    length_ratio: float | None
    length_ratio_interval: list[float | None] | None = optional()
    checks: RunChecks | None = optional()  # what the retired run checks recorded (absent: none)
    started_at: str
    duration_s: float
    machine: Machine
    versions: Versions
    configuration: BenchConfig
    profile: Profile
    measured: Measurements = dataclasses.field(metadata=FLAT)

    def to_json(self) -> dict[str, Any]:
        return codec.to_json(self)

    @classmethod
    def from_json(cls: type[R], data: Any) -> R:
        """The run a results dictionary holds; ValueError naming the first thing it lacks."""
        run = codec.from_json(cls, data)
        if isinstance(run.measured, Measurements) and not run.measured.throughput_sweeps:
            raise ValueError("results: throughput_sweeps has no mix")
        return run

    @classmethod
    def load(cls: type[R], path: Path) -> R:
        return cls.from_json(envelope.read(path, "run"))

    def write(self, path: Path) -> None:
        envelope.write(path, "run", self.to_json(), commit=self.versions.git_commit)

    @property
    def first_mix(self) -> tuple[str, Mix]:
        """The first mix's label and throughput sweeps."""
        return next(iter(self.measured.throughput_sweeps.items()))


def ratio(relay: float | None, baseline: float | None) -> float | None:
    """RelayGR's best over the baseline's; None when the baseline met the SLO nowhere (or has no answer)."""
    if relay is None or not baseline:
        return None
    return round(relay / baseline, 3)


def ratio_interval(relay: Sweep, baseline: Sweep) -> list[float | None]:
    """The bracket of RelayGR's edge over the baseline's (not a confidence interval): with each edge in
    [best, first_failure), their ratio lies in [best_R / fail_B, fail_R / best_B]. A missing best is a
    bound of 0 (nothing passed), a missing failure none at all (None: unbounded)."""
    if relay.best is None or baseline.first_failure is None:
        low = 0.0
    else:
        low = round(relay.best / baseline.first_failure, 3)
    if relay.first_failure is None or not baseline.best:
        return [low, None]
    return [low, round(relay.first_failure / baseline.best, 3)]
