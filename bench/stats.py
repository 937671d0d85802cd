"""Pure statistics of the benchmark: percentiles with failures counted, the SLO verdict, the grid search.

Percentiles are nearest-rank (the value below which at least q% of the samples lie, ghz's definition),
over every measured request: a failed request counts as an infinitely slow one, so errors are SLO
violations. A point meets the SLO when its ranking-latency P99 is within the SLO and fewer than
`max_error_fraction` of its requests failed. `violation_budget(n)` is how many of n requests may miss
the SLO with the P99 still met, which lets a run stop a point as soon as it has failed for certain.

`largest_passing` finds the largest grid value that passes a monotone test (passes up to some value,
fails above) from a starting guess: it gallops away from the guess until the verdict flips and bisects
the rest. With a right guess it needs two measurements, with a wrong one a few more (logarithmically
many); it never measures a value twice. It is a coroutine so that `interleave` can run the baseline's
and RelayGR's searches one measurement each in turn: on a shared machine whose background load drifts,
both modes then see the same conditions. `search_largest` runs one search on its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank q-th percentile (0 < q <= 100); NaN when there are no samples."""
    if not 0 < q <= 100:
        raise ValueError("q must be in (0, 100]")
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)]


def violation_budget(count: int, q: float = 99.0) -> int:
    """Most of `count` samples that may exceed a bound while the nearest-rank q-th percentile meets it."""
    return count - math.ceil(q / 100 * count)


def meets_slo(rank_p99_ms: float, errors: int, count: int, slo_ms: float, max_error_fraction: float) -> bool:
    """The verdict of one point: P99 within the SLO and an error fraction under the bound."""
    return count > 0 and rank_p99_ms <= slo_ms and errors / count < max_error_fraction


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


Search = tuple[Generator[int, bool, int | None], Callable[[int], bool]]


def interleave(searches: Sequence[Search]) -> list[int | None]:
    """Runs searches (each a `largest_passing` coroutine and the measurement of a grid index) one
    measurement of each in turn, so that they share the machine's changing load; their results in order."""
    results: list[int | None] = [None] * len(searches)
    pending = {number: search.send(None) for number, (search, _) in enumerate(searches)}
    while pending:
        for number in list(pending):
            search, measure = searches[number]
            try:
                pending[number] = search.send(measure(pending[number]))
            except StopIteration as done:
                results[number] = done.value
                del pending[number]
    return results
