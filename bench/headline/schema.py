"""results.json of the block experiment (`python -m bench headline`), as dataclasses that `bench.lib.codec`
writes and reads: the settings and context, the calibration (u, L, the canary's reference), the design, every
block and every trial with its latencies, and the analysis computed from them (`bench.headline.analysis`),
which the report and the README render."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from bench.headline.config import HeadlineConfig
from bench.lib import codec
from bench.lib.fleets import FleetShape
from bench.lib.schema import Machine, Versions
from bench.lib.workload import Universe


@dataclasses.dataclass(frozen=True, kw_only=True)
class Calibration:
    """What the run fixed before its first fleet started, on the idle host."""

    u_ms: float  # the host's unit: the median of `unit_timings_ms`
    unit_length: int  # the full pass's long-term length (the mix's cap)
    unit_timings_ms: list[float]
    load_per_u: float  # λ: L = λ / u
    rate: float  # L, Recommend/s
    slo_ms: float
    relay_window_ms: float
    canary_reference_ms: float  # the median of `canary_readings_ms`
    canary_readings_ms: list[float]  # with the fleets up, warm and drained, before the first block
    steal_share: float  # the hypervisor's share while the calibration ran


@dataclasses.dataclass(frozen=True, kw_only=True)
class Over:
    """One measured Rank over the SLO (or failed), with what its answer said about its prefix."""

    index: int  # its place among the trial's measured requests
    rank_ms: float | None  # None: the call failed
    source: str  # where its prefix came from (hbm, dram, extended, miss; '' for a failed call)
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
    # The host's speed so far, which s compares it with (absent: the calibration's reference, as the first
    # runs compared every block with it).
    canary_reference_ms: float | None = dataclasses.field(default=None, metadata=codec.OMIT_NONE)
    # The host's unit timed on the drained host just before the block, and the L and the SLO it sets there
    # (absent: a run that timed u once, before its fleets started, and held the calibration's throughout).
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
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def read(cls, path: Path) -> HeadlineResults:
        return codec.from_json(cls, json.loads(path.read_text()), str(path))
