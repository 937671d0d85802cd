"""Sweeps, written once for every entry point: each finds the largest grid value that meets the SLO.

`run_sweeps` runs one sweep per first guess over the same grid (`bench.lib.stats.largest_passing_value`,
refined between grid values), one load seed of each in turn (`bench.lib.stats.interleave`), so that sweeps
share the machine's drifting load. A measurement may stop them all (`SweepStopped`: the gpu profile's time
budget): each sweep then keeps what it saw (`BudgetedSweep`'s bounds) and is marked cut short. A finished
sweep records its bracket: its best and the lowest failing value above it (`Sweep.first_failure`).

A load's verdict is sequential (`pooled_verdict`): its first load seed, then, while the P99's interval over
the requests pooled so far holds the SLO, one more seed, up to a cap (`Profile.seed_cap`), each look's
interval at the level that keeps the whole verdict's at 95 % (`bench.lib.stats.look_confidence`). The search
takes the pooled verdict (`Point.passes`) as it took one point's before. A verdict is a coroutine that
yields each seed's measurement and is sent its point, so that sweeps take turns by seed, not by verdict:
a mode whose verdict near its edge takes five seeds does not measure them in one spell of the machine's
load while the other mode waits (`pooled_point` measures one verdict at once).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Generator, Sequence

import numpy as np

from bench.lib.points import FIRST_SEED, Before
from bench.lib.schema import Point, Sweep, Verdict
from bench.lib.schema_gpu import BudgetedSweep
from bench.lib.stats import interleave, largest_passing_value, look_confidence, slo_decision


class SweepStopped(Exception):
    """A measurement ended every sweep running with it; the message says why."""


Seed = Callable[[], Point]  # one load seed's measurement, run when its sweep's turn comes
VerdictSteps = Generator[Seed, Point, Point]  # a load's verdict: yields seeds, is sent their points


def run_sweeps(
    grid: Sequence[float],
    firsts: Sequence[int],
    verdict: Callable[[int, float], VerdictSteps],
    refine_steps: int,
    new_sweep: Callable[[], Sweep] = Sweep,
) -> tuple[list[Sweep], str | None]:
    """One sweep per index of `firsts` (the grid index it measures first), `verdict(number, value)`
    giving sweep `number`'s verdict at `value` (`pooled_verdict`), one seed of each sweep in turn; the
    sweeps and why they were stopped (None: every one finished). A point stopped at its end time (`cut`)
    stops them all."""
    sweeps = [new_sweep() for _ in firsts]
    verdicts: list[list[tuple[float, bool]]] = [[] for _ in firsts]

    def search(number: int, first: int) -> Generator[Seed, Point, float | None]:
        sweep, seen = sweeps[number], verdicts[number]
        values = largest_passing_value(grid, first, refine_steps)
        try:
            value = next(values)
            while True:
                point = yield from verdict(number, value)
                sweep.points.append(point)
                if value not in grid:
                    sweep.refined.append(value)
                if any(seed_point.cut for seed_point in seed_points(point)):
                    raise SweepStopped(f"the budget's end stopped the point at {value:g}")
                seen.append((value, point.passes))
                value = values.send(point.passes)
        except StopIteration as done:
            return done.value

    searches = [(search(number, first), measure_seed) for number, first in enumerate(firsts)]
    results, finished, reason = interleave_until_stopped(searches)
    for sweep, seen, done, best in zip(sweeps, verdicts, finished, results, strict=True):
        close_sweep(sweep, seen, grid, done, best, reason)
    return sweeps, reason


def measure_seed(seed: Seed) -> Point:
    return seed()


def interleave_until_stopped(searches: Sequence) -> tuple[list, list[bool], str | None]:
    """`bench.lib.stats.interleave` until a measurement raises `SweepStopped`: each search's result, whether
    it finished, and the reason it was stopped (None when every search finished)."""
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
        above = [value for value, ok in verdicts if not ok and (best is None or value > best)]
        sweep.first_failure = min(above, default=None)


def last_within(values: Sequence[float], bound: float) -> int:
    """Index of the last of the increasing `values` that is at most `bound` (0 when none is)."""
    return max(int(np.searchsorted(values, bound, side="right")) - 1, 0)


def seed_points(point: Point) -> list[Point]:
    """Every seed's point of a load: the first seed's (`point`) and those its verdict pooled."""
    return [point] if point.verdict is None else [point, *point.verdict.points]


def _finite(value: float) -> float | None:
    return None if math.isinf(value) or math.isnan(value) else round(value, 3)


def pooled_point(measure: Callable[[int, Before], Point], seed_cap: int, slo_ms: float,
                 max_error_fraction: float) -> Point:  # fmt: skip
    """`pooled_verdict`'s point, its seeds measured one after another (one load alone)."""
    steps = pooled_verdict(measure, seed_cap, slo_ms, max_error_fraction)
    try:
        seed = next(steps)
        while True:
            seed = steps.send(seed())
    except StopIteration as done:
        return done.value


def pooled_verdict(measure: Callable[[int, Before], Point], seed_cap: int, slo_ms: float,
                   max_error_fraction: float) -> VerdictSteps:  # fmt: skip
    """A load's sequential verdict: yields `measure(k, before)` for load seed index k (its own users and
    arrivals; `before`: what the earlier seeds measured, since its early stop is the pooled sample's at
    the cap) as a measurement to run, and is sent its point. After each seed, the ranked requests of
    every seed so far are pooled and `bench.lib.stats.slo_decision` decides, its interval at
    `look_confidence(seed_cap)` and its errors judged against the sample at the cap (the seeds so far and
    the later seeds' planned calls, as the early stop judges them); while its interval holds the SLO, one
    more seed, up to `seed_cap` seeds, where the pooled P99 decides alone (`Verdict.decided` False). A seed
    stopped early (`aborted`: the pooled sample at the cap failed for certain) fails the load, with its
    sample truncated (`Verdict.stopped_early`, not decided). A seed cut by a time budget ends the verdict
    undecided and failing (the sweep stops on it). Returns the first seed's point with the `Verdict`
    attached (the others inside it); the first point alone when it was cut."""
    if seed_cap < 1:
        raise ValueError("seed_cap must be at least 1")
    level = look_confidence(seed_cap)
    first = yield functools.partial(measure, 0, FIRST_SEED)
    if first.cut:
        return first
    points = [first]
    while True:
        samples = [ms for point in points for ms in point.rank_samples_ms]
        most_ranked = len(samples) + (seed_cap - len(points)) * first.planned
        decision, p99, (low, high) = slo_decision(
            samples, slo_ms, max_error_fraction, first.seed, most_ranked, level
        )
        stopped = any(point.aborted for point in points)
        if stopped:
            decision = False
        if decision is not None or len(points) >= seed_cap:
            break
        before = Before(
            ranked=len(samples),
            violations=sum(1 for ms in samples if ms > slo_ms),
            errors=sum(1 for ms in samples if math.isinf(ms)),
        )
        points.append((yield functools.partial(measure, len(points), before)))
        if points[-1].cut:
            decision, p99 = False, math.nan
            break
    verdict = Verdict(
        seeds=[point.seed for point in points],
        requests=len(samples),
        rank_p99_ms=_finite(p99),
        rank_p99_ci_ms=[_finite(low), _finite(high)],
        meets_slo=decision if decision is not None else p99 <= slo_ms,
        decided=decision is not None and not stopped and not points[-1].cut,
        points=points[1:],
        stopped_early=stopped,
        confidence=level,
    )
    return dataclasses.replace(first, verdict=verdict)
