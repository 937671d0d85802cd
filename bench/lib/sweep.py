"""Sweeps, written once for every entry point: each finds the largest grid value that meets the SLO
(docs/benchmark.md, "A load's verdict").

`run_sweeps` runs one sweep per first guess over the same grid, one load seed of each in turn, so that
sweeps share the machine's drifting load; a point cut at a time budget's end stops them all
(`SweepStopped`), each keeping what it saw (`BudgetedSweep`'s bounds). A finished sweep records its
bracket: its best and the lowest failing value above it (`Sweep.first_failure`). A load's verdict
(`pooled_verdict`) pools load seeds sequentially; it is a coroutine that yields each seed's measurement
and is sent its point, so that sweeps take turns by seed, not by verdict.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections.abc import Callable, Generator, Sequence

import numpy as np

from bench.lib.points import FIRST_SEED, Before
from bench.lib.schema import Point, Sweep, Verdict
from bench.lib.schema_gpu import BudgetedSweep
from bench.lib.stats import finite, interleave, largest_passing_value, look_confidence, slo_decision


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
    sweeps and why they were stopped (None: every one finished)."""
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
                if point.cut or (point.verdict is not None and any(p.cut for p in point.verdict.points)):
                    raise SweepStopped(f"the budget's end stopped the point at {value:g}")
                seen.append((value, point.passes))
                value = values.send(point.passes)
        except StopIteration as done:
            return done.value

    searches = [(search(number, first), operator.call) for number, first in enumerate(firsts)]
    results, finished, reason = interleave_until_stopped(searches)
    for sweep, seen, done, best in zip(sweeps, verdicts, finished, results, strict=True):
        close_sweep(sweep, seen, grid, done, best, reason)
    return sweeps, reason


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
    """Fills in a sweep's answer from its search (`finished`, `best`) and the bounds its points' `verdicts`
    set: the largest value that passed and the smallest above it that failed (a finished search's best is
    the largest that passed, so that failure is its `first_failure`)."""
    passed = max((value for value, ok in verdicts if ok), default=None)
    failed = min(
        (value for value, ok in verdicts if not ok and (passed is None or value > passed)), default=None
    )
    if isinstance(sweep, BudgetedSweep):
        sweep.passed_up_to, sweep.failed_from = passed, failed
        if not finished:
            sweep.cut_short, sweep.cut_reason = True, reason
    if finished:
        sweep.best, sweep.at_grid_top, sweep.first_failure = best, best == grid[-1], failed


def last_within(values: Sequence[float], bound: float) -> int:
    """Index of the last of the increasing `values` that is at most `bound` (0 when none is)."""
    return max(int(np.searchsorted(values, bound, side="right")) - 1, 0)


def pooled_verdict(measure: Callable[[int, Before], Point], seed_cap: int, slo_ms: float,
                   max_error_fraction: float) -> VerdictSteps:  # fmt: skip
    """A load's sequential verdict: yields `measure(k, before)` for load seed index k (its own users and
    arrivals; `before`: what the earlier seeds measured, for its early stop) as a measurement to run, and
    is sent its point. After each seed, `bench.lib.stats.slo_decision` decides on the ranked requests of
    every seed so far, pooled, its interval at `look_confidence(seed_cap)` and its errors judged against
    the sample at the cap (the seeds so far and the later seeds' planned calls); while its interval holds
    the SLO, one more seed, up to `seed_cap`, where the pooled P99 decides alone (`Verdict.decided` False).
    A seed stopped early (`aborted`) fails the load (`Verdict.stopped_early`, not decided); a seed cut by
    a time budget ends the verdict undecided and failing. Returns the first seed's point with the
    `Verdict` attached (the others inside it); the first point alone when it was cut."""
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
        rank_p99_ms=finite(p99),
        rank_p99_ci_ms=[finite(low), finite(high)],
        meets_slo=decision if decision is not None else p99 <= slo_ms,
        decided=decision is not None and not stopped and not points[-1].cut,
        points=points[1:],
        stopped_early=stopped,
        confidence=level,
    )
    return dataclasses.replace(first, verdict=verdict)
