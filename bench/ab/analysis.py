"""The statistics of a fixed-load A/B from its runs (`bench.lib.intervals` defines each interval): per mode
and load a `Cell`, per pair of modes and load a `Comparison` with its verdicts."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from bench.ab.config import AbConfig
from bench.ab.schema import AbRun, Cell, Comparison
from bench.lib import intervals
from bench.lib.intervals import Interval


def latencies(values: Sequence[float | None]) -> list[float]:
    """Recorded latencies with a failed request (None) as an infinitely slow one."""
    return [math.inf if value is None else value for value in values]


def by_seed(runs: Sequence[AbRun], mode: str, rate: float, field: str) -> list[list[float]]:
    """One mode's latencies (`rank_ms` or `recommend_ms`) at one load, one list per seed in seed order."""
    chosen = sorted((run for run in runs if run.mode == mode and run.rate == rate), key=lambda run: run.seed)
    return [latencies(getattr(run, field)) for run in chosen]


def cell(runs: Sequence[AbRun], mode: str, rate: float, config: AbConfig) -> Cell:
    ranks = by_seed(runs, mode, rate, "rank_ms")
    recommends = by_seed(runs, mode, rate, "recommend_ms")
    level = config.confidence
    ranks_over, count, rank_effect, rank_share = intervals.proportion(ranks, config.slo_ms, level)
    recommends_over, _, recommend_effect, recommend_share = intervals.proportion(
        recommends, config.recommend_bound_ms, level
    )
    block = config.block(rate)
    return Cell(
        mode=mode,
        rate=rate,
        ranks=count,
        errors=sum(run.errors for run in runs if run.mode == mode and run.rate == rate),
        ranks_over=ranks_over,
        ranks_over_share=rank_share,
        ranks_design_effect=round(rank_effect, 3),
        recommends_over=recommends_over,
        recommends_over_share=recommend_share,
        recommends_design_effect=round(recommend_effect, 3),
        rank_p99_ms=intervals.p99_interval(ranks, block, level, config.resamples, config.load_seed),
        block=block,
    )


def comparison(runs: Sequence[AbRun], a: str, b: str, rate: float, config: AbConfig) -> Comparison:
    level = config.confidence
    ranks_a, ranks_b = (by_seed(runs, mode, rate, "rank_ms") for mode in (a, b))
    recommends_a, recommends_b = (by_seed(runs, mode, rate, "recommend_ms") for mode in (a, b))
    ranks = intervals.proportion_difference(ranks_a, ranks_b, config.slo_ms, level)
    recommends = intervals.proportion_difference(recommends_a, recommends_b, config.recommend_bound_ms, level)
    p99 = intervals.p99_difference(
        ranks_a, ranks_b, config.block(rate), level, config.resamples, config.load_seed
    )
    verdicts = [
        share_verdict(a, b, rate, "Ranks over the SLO", ranks),
        share_verdict(a, b, rate, "Recommends over their bound", recommends),
        p99_verdict(a, b, rate, p99),
    ]
    return Comparison(
        a=a, b=b, rate=rate, ranks_over_share=ranks, recommends_over_share=recommends, rank_p99_ms=p99,
        verdicts=verdicts,
    )  # fmt: skip


def _bound(value: float | None, scale: float, digits: int) -> str:
    return "∞" if value is None else f"{value * scale:+.{digits}f}"


def share_verdict(a: str, b: str, rate: float, what: str, difference: Interval) -> str:
    """One line: whether b has fewer or more of `what` than a at `rate`, in percentage points."""
    span = f"{_bound(difference.value, 100, 2)} pp [{_bound(difference.low, 100, 2)}, "
    span += f"{_bound(difference.high, 100, 2)}]"
    if not difference.excludes_zero():
        return f"{what} at {rate:g}/s, {b} against {a}: no difference shown ({span})"
    more = "fewer" if difference.high is not None and difference.high < 0 else "more"
    return f"{b} has {more} {what} than {a} at {rate:g}/s: {span}"


def p99_verdict(a: str, b: str, rate: float, difference: Interval) -> str:
    """One line: whether b's Rank P99 is lower or higher than a's at `rate`."""
    if difference.value is None:
        return f"Rank P99 at {rate:g}/s, {b} against {a}: not comparable (a P99 falls on failed requests)"
    span = f"{_bound(difference.value, 1, 1)} ms [{_bound(difference.low, 1, 1)}, "
    span += f"{_bound(difference.high, 1, 1)}]"
    if not difference.excludes_zero():
        return f"Rank P99 at {rate:g}/s, {b} against {a}: no difference shown ({span})"
    lower = "lower" if difference.high is not None and difference.high < 0 else "higher"
    return f"{b} has a {lower} Rank P99 than {a} at {rate:g}/s: {span}"


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
