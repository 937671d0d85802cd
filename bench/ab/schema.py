"""results.json of a fixed-load A/B (`python -m bench ab`), as dataclasses that `bench.lib.codec` writes and
reads, and its statistics (`analyse`, each interval from `bench.lib.intervals`): the settings and context,
every run's latencies (so the statistics can be computed again), per mode and load a `Cell`, per pair of
modes and load a `Comparison` with its verdicts."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.ab.config import AbConfig
from bench.lib import codec, envelope, intervals
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

    def to_json(self) -> dict[str, Any]:
        return codec.to_json(self)

    @classmethod
    def load(cls, path: Path) -> AbResults:
        return codec.from_json(cls, envelope.read(path, "ab"), str(path))

    def write(self, path: Path) -> None:
        envelope.write(path, "ab", self.to_json(), commit=self.versions.git_commit)


def latencies(values: Sequence[float | None]) -> list[float]:
    """Recorded latencies with a failed request (None) as an infinitely slow one."""
    return [math.inf if value is None else value for value in values]


def by_seed(runs: Sequence[AbRun], mode: str, rate: float, field: str) -> list[list[float]]:
    """One mode's latencies (`rank_ms` or `recommend_ms`) at one load, one list per seed in seed order."""
    chosen = sorted((run for run in runs if run.mode == mode and run.rate == rate), key=lambda run: run.seed)
    return [latencies(getattr(run, field)) for run in chosen]


def cell(runs: Sequence[AbRun], mode: str, rate: float, config: AbConfig) -> Cell:
    ranks = by_seed(runs, mode, rate, "rank_ms")
    level, block = config.confidence, config.block(rate)
    ranks_over, count, rank_effect, rank_share = intervals.proportion(ranks, config.slo_ms, level)
    recommends_over, _, recommend_effect, recommend_share = intervals.proportion(
        by_seed(runs, mode, rate, "recommend_ms"), config.recommend_bound_ms, level
    )
    return Cell(
        mode=mode, rate=rate, ranks=count,
        errors=sum(run.errors for run in runs if run.mode == mode and run.rate == rate),
        ranks_over=ranks_over, ranks_over_share=rank_share, ranks_design_effect=round(rank_effect, 3),
        recommends_over=recommends_over, recommends_over_share=recommend_share,
        recommends_design_effect=round(recommend_effect, 3),
        rank_p99_ms=intervals.p99_interval(ranks, block, level, config.resamples, config.load_seed),
        block=block,
    )  # fmt: skip


def comparison(runs: Sequence[AbRun], a: str, b: str, rate: float, config: AbConfig) -> Comparison:
    level = config.confidence
    ranks_a, ranks_b = (by_seed(runs, mode, rate, "rank_ms") for mode in (a, b))
    recommends_a, recommends_b = (by_seed(runs, mode, rate, "recommend_ms") for mode in (a, b))
    ranks = intervals.proportion_difference(ranks_a, ranks_b, config.slo_ms, level)
    recommends = intervals.proportion_difference(recommends_a, recommends_b, config.recommend_bound_ms, level)
    p99 = intervals.p99_difference(
        ranks_a, ranks_b, config.block(rate), level, config.resamples, config.load_seed
    )
    shares = ("pp", 100, 2, ("fewer", "more"))
    verdicts = [
        verdict(a, b, rate, "Ranks over the SLO", ranks, *shares),
        verdict(a, b, rate, "Recommends over their bound", recommends, *shares),
        f"Rank P99 at {rate:g}/s, {b} against {a}: not comparable (a P99 falls on failed requests)"
        if p99.value is None
        else verdict(a, b, rate, "Rank P99", p99, "ms", 1, 1, ("a lower", "a higher")),
    ]
    return Comparison(
        a=a, b=b, rate=rate, ranks_over_share=ranks, recommends_over_share=recommends, rank_p99_ms=p99,
        verdicts=verdicts,
    )  # fmt: skip


def number(value: float | None, scale: float = 1.0, digits: int = 1, signed: bool = False) -> str:
    """`value` times `scale` with `digits` decimals (and its sign, with `signed`); None: ∞."""
    if value is None:
        return "∞"
    return f"{value * scale:+.{digits}f}" if signed else f"{value * scale:.{digits}f}"


def verdict(
    a: str, b: str, rate: float, what: str, difference: Interval, unit: str, scale: float, digits: int,
    words: tuple[str, str],
) -> str:  # fmt: skip
    """One line: whether b has less (`words[0]`) or more of `what` than a at `rate`, in `unit`."""
    bounds = (number(bound, scale, digits, signed=True) for bound in (difference.low, difference.high))
    span = f"{number(difference.value, scale, digits, signed=True)} {unit} [{', '.join(bounds)}]"
    if not difference.excludes_zero():
        return f"{what} at {rate:g}/s, {b} against {a}: no difference shown ({span})"
    less = difference.high is not None and difference.high < 0
    return f"{b} has {words[0] if less else words[1]} {what} than {a} at {rate:g}/s: {span}"


def analyse(runs: Sequence[AbRun], config: AbConfig) -> tuple[list[Cell], list[Comparison]]:
    """Every mode's cell at every load, and every pair of modes (in the order --modes names them)."""
    modes, rates = config.mode_names(), config.rate_list()
    cells = [cell(runs, mode, rate, config) for rate in rates for mode in modes]
    pairs = [
        comparison(runs, a, b, rate, config) for rate in rates for a, b in itertools.combinations(modes, 2)
    ]
    return cells, pairs


def disturbed(run: AbRun, config: AbConfig) -> list[str]:
    """Why a run's figures may be the machine's rather than its mode's: its arrivals were late (send lag
    P99 over `--send-lag-limit-ms`) or other processes took cores (over `--foreign-cores-limit`); empty:
    neither. A run recorded before foreign cores were is judged on its send lag alone."""
    flags = []
    if run.send_lag_p99_ms > config.send_lag_limit_ms:
        flags.append(f"send lag P99 {run.send_lag_p99_ms:g} ms > {config.send_lag_limit_ms:g}")
    if run.foreign_cores is not None and run.foreign_cores > config.foreign_cores_limit:
        flags.append(f"foreign cores {run.foreign_cores:g} > {config.foreign_cores_limit:g}")
    return flags
