"""Pure statistics of the benchmark (docs/benchmark.md, "A load's verdict"): nearest-rank percentiles over
every measured request, a failed one counting as infinitely slow; their percentile-bootstrap intervals
(`bootstrap_ci`; `bootstrap_percentiles` resamples blocks within seeds for `bench.lib.intervals`); a
point's SLO verdict (`meets_slo`, `violation_budget`, `error_budget`); one look of a load's sequential
verdict (`slo_decision`, each look at `look_confidence`, the Bonferroni share of 5 % over the seed cap's
looks); and the grid search. `largest_passing` gallops from a first guess until the
verdict flips and bisects the rest, never measuring a value twice; `largest_passing_value` runs it over
grid values and refines between the best and the failure above it. Both are coroutines, so that
`interleave` can run several searches one measurement each in turn, and a shared machine's drifting load
falls on every mode alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np


def nearest_rank(share: float, count: int) -> int:
    """The index, among `count` ordered values, of the nearest-rank quantile of `share` (0 < share <= 1)."""
    return max(math.ceil(share * count) - 1, 0)


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank q-th percentile (0 < q <= 100); NaN when there are no samples."""
    if not 0 < q <= 100:
        raise ValueError("q must be in (0, 100]")
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[nearest_rank(q / 100, len(ordered))]


def interval_ends(estimates: np.ndarray, confidence: float) -> tuple[float, float]:
    """The nearest-rank (1 - confidence)/2 and (1 + confidence)/2 quantiles of bootstrap `estimates`; NaN
    if any estimate is."""
    if np.isnan(estimates).any():
        return math.nan, math.nan
    ordered = np.sort(estimates)
    tail = (1 - confidence) / 2
    low, high = ordered[nearest_rank(tail, len(ordered))], ordered[nearest_rank(1 - tail, len(ordered))]
    return float(low), float(high)


def block_positions(sizes: Sequence[int], block: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Positions into the seeds' concatenated samples, one row per resample: each seed's own count of
    positions, drawn as blocks of `block` consecutive ones (shorter when the seed has fewer) that start
    anywhere they fit, the last block cut to length."""
    rows = []
    offset = 0
    for size in sizes:
        length = min(block, size)
        starts = rng.integers(0, size - length + 1, size=(resamples, math.ceil(size / length)))
        rows.append((starts[:, :, None] + np.arange(length)).reshape(resamples, -1)[:, :size] + offset)
        offset += size
    return np.concatenate(rows, axis=1)


def bootstrap_percentiles(
    samples: Sequence[Sequence[Sequence[float]]], q: float, block: int, resamples: int, seed: int
) -> list[np.ndarray]:
    """The nearest-rank q-th percentile of each of several sample sets (each by seed, with equal per-seed
    counts) over the same `resamples` block resamples (`block_positions`)."""
    sizes = [len(seed_samples) for seed_samples in samples[0]]
    if any([len(s) for s in other] != sizes for other in samples):
        raise ValueError("paired samples need the same count per seed")
    values = [np.asarray([x for seed_samples in s for x in seed_samples], dtype=np.float64) for s in samples]
    rank = nearest_rank(q / 100, sum(sizes))
    rng = np.random.default_rng(seed)
    estimates: list[list[np.ndarray]] = [[] for _ in samples]
    chunk = max(1, 2_000_000 // max(sum(sizes), 1))  # bounds the positions array to about 16 MB
    for start in range(0, resamples, chunk):
        positions = block_positions(sizes, block, min(chunk, resamples - start), rng)
        for number, value in enumerate(values):
            estimates[number].append(np.partition(value[positions], rank, axis=1)[:, rank])
    return [np.concatenate(parts) for parts in estimates]


def bootstrap_ci(
    samples: Sequence[float], q: float = 99.0, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap interval (low, high) of the nearest-rank q-th percentile of `samples` over
    `resamples` resamples with replacement (`bootstrap_percentiles` with blocks of one, `interval_ends`);
    (NaN, NaN) without samples. Infinite samples (failed requests) may make a bound infinite. A P99 rests
    on the few slowest requests: on exponential latencies its 95 % interval holds the true P99 about 93 %
    of the time with 1000 samples, 84 % with 200."""
    if not 0 < q <= 100:
        raise ValueError("q must be in (0, 100]")
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    if resamples < 1:
        raise ValueError("resamples must be at least 1")
    if not len(samples):
        return math.nan, math.nan
    (estimates,) = bootstrap_percentiles(
        [[np.sort(np.asarray(samples, dtype=np.float64))]], q, 1, resamples, seed
    )
    return interval_ends(estimates, confidence)


def finite(value: float, digits: int = 3) -> float | None:
    """`value` rounded for results.json; None where it is infinite or NaN."""
    return None if math.isinf(value) or math.isnan(value) else round(float(value), digits)


def violation_budget(count: int, q: float = 99.0) -> int:
    """Most of `count` samples that may exceed a bound while the nearest-rank q-th percentile meets it."""
    return count - math.ceil(q / 100 * count)


def error_budget(count: int, max_error_fraction: float) -> int:
    """The fewest failed requests among `count` that fail a point or a load: an error share at the bound."""
    return max(math.ceil(max_error_fraction * count), 1)


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


def slo_decision(
    samples: Sequence[float],
    slo_ms: float,
    max_error_fraction: float,
    seed: int = 0,
    most_ranked: int = 0,
    confidence: float = VERDICT_CONFIDENCE,
) -> tuple[bool | None, float, tuple[float, float]]:
    """The decision on pooled ranking latencies (a failed request as an infinite one), with the P99 and its
    bootstrap `confidence` interval: True when both are within `slo_ms` and the error share is under the
    bound; False when both are above it, the errors reach the error budget of `most_ranked` requests (the
    most the verdict can pool; at least the sample's own count), or there is no sample; None otherwise."""
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
    """The search over grid indices 0..size-1: yields the index to measure next, is sent its verdict, and
    returns the largest passing index (None when none passes). Probes `first`, gallops away from it (1,
    2, 4, ... steps) until the verdict flips, then bisects between the last pass and the first fail."""
    if size < 1:
        raise ValueError("empty grid")
    start = min(max(first, 0), size - 1)
    verdict = bool((yield start))
    # Index `low` passed (or none did yet), `high` failed (or is past the end).
    low, high, step = (start, size, 1) if verdict else (-1, start, 1)
    while low < (probe := low + step if verdict else high - step) < high:
        passed = bool((yield probe))
        low, high = (probe, high) if passed else (low, probe)
        if passed != verdict:
            break
        step *= 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if (yield middle) else (low, middle)
    return low if low >= 0 else None


def largest_passing_value(
    grid: Sequence[float], first: int, refine_steps: int = 0, resolution: float = 0.1
) -> Generator[float, bool, float | None]:
    """`largest_passing` over the values of the increasing `grid`, then up to `refine_steps` bisections
    between the best value and the next grid value, which failed: each measures the geometric midpoint
    rounded to a multiple of `resolution`, stopping when rounding leaves no value strictly between. Returns
    the largest passing value measured (None when none passed)."""
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
        low, high = (middle, high) if (yield middle) else (low, middle)
    return low


Search = tuple[Generator[Any, bool, Any], Callable[[Any], bool]]


def interleave(searches: Sequence[Search], done: Callable[[int, Any], None] | None = None) -> list[Any]:
    """Runs searches (each a coroutine and the measurement of what it yields) one measurement of each in
    turn; their results in order. `done(number, result)` hears of each as it finishes, so that a caller
    whose measurement raises keeps the results of those that finished (`bench.lib.sweep.run_sweeps`)."""
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
