"""Pure statistics of the benchmark: percentiles with failures counted, their bootstrap confidence
intervals, the SLO verdict, the grid search and its refinement.

Percentiles are nearest-rank (the value below which at least q% of the samples lie, ghz's definition),
over every measured request: a failed request counts as an infinitely slow one, so errors are SLO
violations. A point meets the SLO when its ranking-latency P99 is within the SLO and fewer than
`max_error_fraction` of its requests failed. `violation_budget(n)` is how many of n requests may miss
the SLO with the P99 still met, which lets a run stop a point as soon as it has failed for certain.

`bootstrap_ci` says how far a point's P99 could move with other requests of the same load: the
percentile bootstrap, 2000 resamples by default (on 1000 exponential samples the ends then move by
about 1 % of the interval's width from one bootstrap seed to another), vectorised with numpy (2000
resamples of 1000 samples take under 0.1 s). A P99 rests on the few slowest requests, so the interval
is honest only with enough of them: on exponential latencies its 95 % interval holds the true P99
about 93 % of the time with 1000 samples (the full profile), 84 % with 200 (the quick profile).

`largest_passing` finds the largest grid value that passes a monotone test (passes up to some value,
fails above) from a starting guess: it gallops away from the guess until the verdict flips and bisects
the rest. With a right guess it needs two verdicts, with a wrong one a few more (logarithmically
many); it never measures a value twice. It is a coroutine so that `interleave` can run the baseline's
and RelayGR's searches one measurement each in turn: on a shared machine whose background load drifts,
both modes then see the same conditions. `largest_passing_value` runs the same search over grid values
and then refines its answer: between the best value and the failing one above it, it measures up to
`refine_steps` geometric midpoints (rounded to `resolution`), keeping the largest that passes, so a
coarse grid (steps of about 1.4x) still gives a close limit.

`slo_decision` is one look of a load's sequential verdict (`bench.lib.sweep.pooled_verdict`): over the
requests of every load seed measured so far, pooled, it passes the load when the P99's bootstrap interval lies
wholly within the SLO (and the error share is under its bound), fails it when the interval lies wholly above
it or the errors already fail the sample the verdict can still reach at its seed cap (the error budget,
`error_budget`, of that sample: the bound the seeds' early stop, `bench.lib.points.failed_for_certain`,
applies), and otherwise says that more seeds are needed (None). A load far from the edge is thus decided by
one seed; one whose interval holds the SLO gets more requests, up to a seed cap. A verdict looks once per
seed, so each look's interval is at `look_confidence`: the Bonferroni share of 5 % over the seed cap's looks
(99 % for 5), which bounds the chance that a load whose true P99 is the SLO is decided either way by 5 % over
all its looks, where 95 % at each look decided about 14 % of them at 1000 calls a seed
(tests/bench/test_stats.py measures it). The bound needs a pooled sample large enough for its bootstrap: a
resample's P99 never exceeds the sample's largest value, which falls below the true P99 with probability
0.99^n (13 % for n = 200), so at 200 calls a seed such a load was still decided in 18 % of 200 verdicts (21 %
at 95 % a look), most of them passed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank q-th percentile (0 < q <= 100); NaN when there are no samples."""
    if not 0 < q <= 100:
        raise ValueError("q must be in (0, 100]")
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)]


def bootstrap_ci(
    samples: Sequence[float],
    q: float = 99.0,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap interval (low, high) of the nearest-rank q-th percentile of `samples`: the
    (1 - confidence)/2 and (1 + confidence)/2 quantiles, nearest-rank, of the percentile of `resamples`
    resamples with replacement. Infinite samples (failed requests) may make a bound infinite; (NaN, NaN)
    when there are no samples."""
    if not 0 < q <= 100:
        raise ValueError("q must be in (0, 100]")
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    if resamples < 1:
        raise ValueError("resamples must be at least 1")
    if not len(samples):
        return math.nan, math.nan
    ordered = np.sort(np.asarray(samples, dtype=np.float64))
    count = len(ordered)
    rank = max(math.ceil(q / 100 * count) - 1, 0)
    # Resample positions in the sorted samples: the rank-th smallest position is the rank-th smallest value.
    positions = np.random.default_rng(seed).integers(0, count, size=(resamples, count))
    estimates = np.sort(ordered[np.partition(positions, rank, axis=1)[:, rank]])
    tail = (1 - confidence) / 2
    low = estimates[max(math.ceil(tail * resamples) - 1, 0)]
    high = estimates[max(math.ceil((1 - tail) * resamples) - 1, 0)]
    return float(low), float(high)


def violation_budget(count: int, q: float = 99.0) -> int:
    """Most of `count` samples that may exceed a bound while the nearest-rank q-th percentile meets it."""
    return count - math.ceil(q / 100 * count)


def meets_slo(rank_p99_ms: float, errors: int, count: int, slo_ms: float, max_error_fraction: float) -> bool:
    """The verdict of one point: P99 within the SLO and an error fraction under the bound."""
    return count > 0 and rank_p99_ms <= slo_ms and errors / count < max_error_fraction


VERDICT_CONFIDENCE = 0.95  # of a load's whole sequential verdict, over all its looks


def look_confidence(looks: int, confidence: float = VERDICT_CONFIDENCE) -> float:
    """The confidence of each of `looks` looks' intervals that keeps the chance of a wrong decision over
    all of them within 1 - `confidence` (Bonferroni: 0.99 for 5 looks at 0.95)."""
    if looks < 1:
        raise ValueError("looks must be at least 1")
    return 1 - (1 - confidence) / looks


def error_budget(count: int, max_error_fraction: float) -> int:
    """The fewest failed requests among `count` that fail a point or a load: an error share at the bound."""
    return max(math.ceil(max_error_fraction * count), 1)


def slo_decision(
    samples: Sequence[float],
    slo_ms: float,
    max_error_fraction: float,
    seed: int = 0,
    most_ranked: int = 0,
    confidence: float = VERDICT_CONFIDENCE,
) -> tuple[bool | None, float, tuple[float, float]]:
    """The decision on pooled ranking latencies (a failed request as an infinite one): True when the
    P99 and its bootstrap `confidence` interval are within `slo_ms` and the error share is under the
    bound, False when the P99 and the whole interval are above it or the errors reach the error budget of
    `most_ranked` requests (the most the verdict can pool, at its seed cap; at least the sample's own
    count) (or there is no sample), None otherwise; with the P99 and the interval."""
    count = len(samples)
    if not count:
        return False, math.nan, (math.nan, math.nan)
    p99 = percentile(samples, 99)
    low, high = bootstrap_ci(samples, 99, confidence, seed=seed)
    errors = sum(1 for value in samples if math.isinf(value))
    if errors >= error_budget(max(most_ranked, count), max_error_fraction) or (low > slo_ms and p99 > slo_ms):
        return False, p99, (low, high)
    if high <= slo_ms and p99 <= slo_ms and errors / count < max_error_fraction:
        return True, p99, (low, high)
    return None, p99, (low, high)


def largest_passing(size: int, first: int) -> Generator[int, bool, int | None]:
    """The search over grid indices 0..size-1 as a coroutine: yields the index to measure next, takes its
    verdict (`send`), and returns the largest passing index (None when none passes).

    Probes `first`, gallops away from it (1, 2, 4, ... steps) until the verdict flips, then bisects
    between the last pass and the first fail."""
    if size < 1:
        raise ValueError("empty grid")
    start = min(max(first, 0), size - 1)
    low, high, step = -1, size, 1  # index `low` passed (or none yet), `high` failed (or is past the end)
    if (yield start):
        low = start
        while low + step < high:
            if not (yield low + step):
                high = low + step
                break
            low, step = low + step, step * 2
    else:
        high = start
        while high - step > low:
            if (yield high - step):
                low = high - step
                break
            high, step = high - step, step * 2
    while high - low > 1:
        middle = (low + high) // 2
        if (yield middle):
            low = middle
        else:
            high = middle
    return low if low >= 0 else None


def largest_passing_value(
    grid: Sequence[float], first: int, refine_steps: int = 0, resolution: float = 0.1
) -> Generator[float, bool, float | None]:
    """`largest_passing` over the values of the increasing `grid` (yields values, not indices), then up
    to `refine_steps` bisections between the best value and the next grid value, which failed: each
    measures the geometric midpoint rounded to a multiple of `resolution`, and stops early when rounding
    leaves no value strictly between. Returns the largest passing value measured (None when none passed)."""
    if refine_steps < 0:
        raise ValueError("refine_steps must not be negative")
    search = largest_passing(len(grid), first)
    index = next(search)
    try:
        while True:
            index = search.send((yield grid[index]))
    except StopIteration as done:
        best: int | None = done.value
    if best is None:
        return None
    low = grid[best]
    if best + 1 == len(grid):
        return low
    high = grid[best + 1]  # failed: the search ends between a pass and a fail
    for _ in range(refine_steps):
        middle = round(round(math.sqrt(low * high) / resolution) * resolution, 10)
        if not low < middle < high:
            break
        if (yield middle):
            low = middle
        else:
            high = middle
    return low


Search = tuple[Generator[Any, bool, Any], Callable[[Any], bool]]


def interleave(searches: Sequence[Search], done: Callable[[int, Any], None] | None = None) -> list[Any]:
    """Runs searches (each a coroutine such as `largest_passing` and the measurement of what it yields)
    one measurement of each in turn, so that they share the machine's changing load; their results in
    order. `done(number, result)` hears of each search as it finishes, so that a caller whose measurement
    raises still has the results of the searches that finished before (`bench.lib.sweep.run_sweeps`)."""
    results: list[Any] = [None] * len(searches)
    pending = {number: search.send(None) for number, (search, _) in enumerate(searches)}
    while pending:
        for number in list(pending):
            search, measure = searches[number]
            try:
                pending[number] = search.send(measure(pending[number]))
            except StopIteration as finished:
                results[number] = finished.value
                del pending[number]
                if done is not None:
                    done(number, finished.value)
    return results
