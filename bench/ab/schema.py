"""results.json of a fixed-load A/B (`python -m bench ab`), as dataclasses that `bench.lib.codec` writes and
reads: the settings and context, every run's latencies (so the statistics can be computed again), and
the summary per mode and load (`Cell`) and per pair of modes and load (`Comparison`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from bench.ab.config import AbConfig
from bench.lib import codec
from bench.lib.fleets import FleetShape, Mode
from bench.lib.intervals import Interval
from bench.lib.schema import Machine, Versions
from bench.lib.workload import Universe


@dataclasses.dataclass(frozen=True, kw_only=True)
class AbRun:
    """One mode driven at one load with one load seed: its measured requests in send order."""

    order: int  # its place in the run's sequence (0: driven first)
    mode: str
    rate: float
    seed: int  # the load seed (arrivals and user draws)
    users: str  # the users' namespace: the same for every mode at this load and seed
    warmup: int  # requests sent before the measured ones, not counted
    errors: int
    wall_s: float
    send_lag_p99_ms: float
    # Cores that processes other than this run's fleet and load generator took while it ran (the other
    # fleets' leftover work, other users of the machine); absent from runs before it was recorded.
    foreign_cores: float | None = dataclasses.field(default=None, metadata=codec.OMIT_NONE)
    rank_ms: list[float | None]  # the stub's Rank latency of each measured request; None: it failed
    recommend_ms: list[float | None]  # the Recommend's, from its intended send time; None: it failed


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cell:
    """One mode at one load, every seed pooled."""

    mode: str
    rate: float
    ranks: int  # measured requests (a failed one counts as a Rank over the SLO)
    errors: int
    ranks_over: int  # Ranks over --slo-ms
    ranks_over_share: Interval  # their share, Wilson interval on the effective counts
    ranks_design_effect: float
    recommends_over: int  # Recommends over the Recommend bound
    recommends_over_share: Interval
    recommends_design_effect: float
    rank_p99_ms: Interval  # pooled P99, block-bootstrap interval
    block: int  # requests per bootstrap block


@dataclasses.dataclass(frozen=True, kw_only=True)
class Comparison:
    """Mode `b` against mode `a` at one load: each difference is b's value less a's."""

    a: str
    b: str
    rate: float
    ranks_over_share: Interval  # Newcombe's interval on the effective counts
    recommends_over_share: Interval
    rank_p99_ms: Interval  # paired block-bootstrap interval
    verdicts: list[str]


@dataclasses.dataclass(frozen=True, kw_only=True)
class AbResults:
    started_at: str
    duration_s: float
    machine: Machine
    versions: Versions
    settings: AbConfig
    recommend_bound_ms: float
    modes: list[Mode]
    fleet: FleetShape
    universe: Universe
    cells: list[Cell]
    comparisons: list[Comparison]
    runs: list[AbRun]
    # Each fleet's unmeasured warm-up run (`--fleet-warmup-s`), in the order driven; counted nowhere.
    warmups: list[AbRun] = dataclasses.field(default_factory=list, metadata=codec.omitted_while([]))

    @property
    def name(self) -> str:
        """How a message names this A/B: its --name, else when it started."""
        return f"the A/B {self.settings.name or self.started_at}"

    def to_json(self) -> dict[str, Any]:
        return codec.to_json(self)

    @classmethod
    def from_json(cls, data: Any) -> AbResults:
        return codec.from_json(cls, data)

    @classmethod
    def load(cls, path: Path) -> AbResults:
        return cls.from_json(json.loads(path.read_text()))

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
