"""Sweeps, written once for every entry point: each finds the largest grid value that meets the SLO.

`run_sweeps` runs one sweep per first guess over the same grid (`bench.stats.largest_passing_value`,
refined between grid values), one point of each in turn (`bench.stats.interleave`), so that sweeps share
the machine's drifting load. A measurement may stop them all (`SweepStopped`: the gpu profile's time
budget): each sweep then keeps what it saw (`BudgetedSweep`'s bounds) and is marked cut short.

A sweep's verdict points (its best, the first failure above it) may be measured again with other load
seeds (`verdict_points`, `repeat_record`, `add_seed`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from bench.schema import BudgetedSweep, Point, Repeat, Sweep
from bench.stats import interleave, largest_passing_value


class SweepStopped(Exception):
    """A measurement ended every sweep running with it; the message says why."""


def run_sweeps(
    grid: Sequence[float],
    firsts: Sequence[int],
    measure: Callable[[int, float], Point],
    refine_steps: int,
    new_sweep: Callable[[], Sweep] = Sweep,
) -> tuple[list[Sweep], str | None]:
    """One sweep per index of `firsts` (the grid index it measures first), `measure(number, value)` giving
    sweep `number`'s point at `value`; the sweeps and why they were stopped (None: every one finished). A
    point stopped at its end time (`cut`) stops them all."""
    sweeps = [new_sweep() for _ in firsts]
    verdicts: list[list[tuple[float, bool]]] = [[] for _ in firsts]

    def passes_for(number: int) -> Callable[[float], bool]:
        sweep, seen = sweeps[number], verdicts[number]

        def passes(value: float) -> bool:
            point = measure(number, value)
            sweep.points.append(point)
            if value not in grid:
                sweep.refined.append(value)
            if point.cut:
                raise SweepStopped(f"the budget's end stopped the point at {value:g}")
            seen.append((value, point.meets_slo))
            return point.meets_slo

        return passes

    searches = [
        (largest_passing_value(grid, first, refine_steps), passes_for(number))
        for number, first in enumerate(firsts)
    ]
    results, finished, reason = interleave_until_stopped(searches)
    for sweep, seen, done, best in zip(sweeps, verdicts, finished, results, strict=True):
        close_sweep(sweep, seen, grid, done, best, reason)
    return sweeps, reason


def interleave_until_stopped(searches: Sequence) -> tuple[list, list[bool], str | None]:
    """`bench.stats.interleave` until a measurement raises `SweepStopped`: each search's result, whether it
    finished, and the reason it was stopped (None when every search finished)."""
    results: list = [None] * len(searches)
    finished = [False] * len(searches)

    def done(number: int, result: object) -> None:
        results[number], finished[number] = result, True

    try:
        interleave(searches, done)
    except SweepStopped as exc:
        return results, finished, str(exc)
    return results, finished, None


def close_sweep(sweep: Sweep, verdicts: list[tuple[float, bool]], grid: Sequence[float], finished: bool,
                best: float | None, reason: str | None) -> None:  # fmt: skip
    """Fills in a sweep's answer from its search (`finished`, `best`) and, for a `BudgetedSweep`, the
    bounds its points' `verdicts` set."""
    if isinstance(sweep, BudgetedSweep):
        passed = [value for value, ok in verdicts if ok]
        sweep.passed_up_to = max(passed, default=None)
        above = [v for v, ok in verdicts if not ok and (sweep.passed_up_to is None or v > sweep.passed_up_to)]
        sweep.failed_from = min(above, default=None)
        if not finished:
            sweep.cut_short, sweep.cut_reason = True, reason
    if finished:
        sweep.best = best
        sweep.at_grid_top = best == grid[-1]


def last_within(values: Sequence[float], bound: float) -> int:
    """Index of the last of the increasing `values` that is at most `bound` (0 when none is)."""
    return max(int(np.searchsorted(values, bound, side="right")) - 1, 0)


def verdict_points(sweep: Sweep) -> list[tuple[str, Point]]:
    """The points that decided a load sweep: its best (when one passed) and the lowest failure above it."""
    chosen = []
    if sweep.best is not None:
        chosen.append(("best", next(p for p in sweep.points if p.rate == sweep.best)))
    above = [p for p in sweep.points if not p.meets_slo and (sweep.best is None or p.rate > sweep.best)]
    if above:
        chosen.append(("first_failure", min(above, key=lambda p: p.rate)))
    return chosen


def repeat_record(point: Point, role: str) -> Repeat:
    """The per-seed record of a verdict point, starting with the sweep's own measurement."""
    record = Repeat(role=role, rate=point.rate, seeds=[], rank_p99_ms=[], rank_p99_ci_ms=[], meets_slo=[],
                    agree=True, points=[])  # fmt: skip
    add_seed(record, point, keep=False)
    return record


def add_seed(record: Repeat, point: Point, keep: bool = True) -> None:
    """Adds one seed's measurement of the record's load (`keep`: store the whole point with it)."""
    record.seeds.append(point.seed)
    record.rank_p99_ms.append(point.rank_ms.p99)
    record.rank_p99_ci_ms.append(point.rank_p99_ci_ms)
    record.meets_slo.append(point.meets_slo)
    record.agree = len(set(record.meets_slo)) == 1
    if keep:
        record.points.append(point)
