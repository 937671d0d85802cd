"""Confidence intervals of a fixed-load A/B comparison (`bench.ab`): pure functions over latency samples.

A mode measured at one load with several load seeds gives, per seed, the latencies of its measured
requests in send order; a failed request counts as an infinitely slow one (as in `bench.lib.stats`), so it is
over any SLO and may make a P99 infinite.

Counts over the SLO. `wilson` is the Wilson score interval of a proportion k/n, which keeps its coverage
near the nominal level for the rare events an SLO count is (1 % of 1000) where the normal (Wald) interval
collapses to a point or goes below 0. `newcombe` is the interval of the difference of two proportions,
Newcombe's hybrid score method (method 10 of Newcombe 1998): it combines the two Wilson intervals, so it
needs no resampling, behaves at counts of 0, and is the method Newcombe found closest to nominal coverage
among the closed forms; a bootstrap of rare counts is degenerate when a mode has none (every resample
has none).

Seeds are clusters. The requests of one seed are not independent: a burst of arrivals or a slow spell
of the machine delays many consecutive Ranks together, so counts vary between seeds more than a binomial
allows, and an interval that takes every request as independent is too narrow. `design_effect` measures
that from the seeds themselves (the Pearson dispersion of the per-seed counts around the pooled share,
floored at 1: Williams' and Rao and Scott's estimate), and `proportion` and `proportion_difference`
divide both count and total by it before the Wilson and Newcombe intervals (the Rao-Scott adjustment: the
effective number of independent requests). That effect is itself estimated from a few seeds, so the
intervals take Student's t quantile with seeds - 1 degrees of freedom in place of the normal one
(`critical_value`), as a variance estimated from that many clusters calls for: with 5 seeds of 600
requests and beta-binomial clustering of design effect 5 around a share of 0.8 % (the committed A/Bs
measured effects of 1 to 12.6), the normal quantile's "95 %" interval held the true share in 88 % of 2000
draws and the difference's in 89 %, t's in 96 % of both (tests/bench/test_intervals.py). Without
clustering t makes them conservative (99 %). With one seed the dispersion cannot be measured: the effect
is 1 and the quantile the normal one. The modes at one (seed, load) share users and arrival times, so
their counts are positively correlated; the difference's interval ignores that pairing, which only makes
it wider (conservative).

P99s. `p99_interval` is the pooled nearest-rank P99 over every seed with a bootstrap interval, and
`p99_difference` the difference of two modes' P99s with one. Resampling the seeds themselves (a cluster
bootstrap) would respect their dependence, but with 5 seeds it has 126 distinct resamples and its
percentile interval under-covers badly; resampling single requests ignores the bursts. Both functions
therefore resample blocks of `block` consecutive requests within each seed (the moving-block bootstrap,
stratified by seed: each resample keeps every seed's request count), which keeps a burst inside a block
together; `block` 1 is the plain per-request bootstrap, and the one-mode interval is then
`bench.lib.stats.bootstrap_ci` over the pooled requests. The difference resamples the same positions in
both modes (their request i of a seed had the same arrival time and user), so the shared arrivals cancel
out of it. A resample where both modes' P99 is infinite has no difference: the interval is then NaN.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

import numpy as np

from bench.lib.stats import bootstrap_ci, percentile

Samples = Sequence[Sequence[float]]  # latencies by seed, each in send order; math.inf for a failed request


@dataclasses.dataclass(frozen=True, kw_only=True)
class Interval:
    """An estimate and its confidence interval; None where a value is infinite or undefined."""

    value: float | None
    low: float | None
    high: float | None

    @classmethod
    def of(cls, value: float, low: float, high: float, digits: int = 6) -> Interval:
        def clean(x: float) -> float | None:
            return None if math.isinf(x) or math.isnan(x) else round(float(x), digits)

        return cls(value=clean(value), low=clean(low), high=clean(high))

    def excludes_zero(self) -> bool:
        """Whether the interval lies wholly above or below 0 (a missing bound is an infinite one, on its
        own side; with both missing, nothing is excluded)."""
        return (self.low is not None and self.low > 0) or (self.high is not None and self.high < 0)


def z_value(confidence: float) -> float:
    """The two-sided standard normal quantile of `confidence` (1.96 for 0.95)."""
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    return statistics.NormalDist().inv_cdf((1 + confidence) / 2)


def _t_coverage(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with `df` degrees of freedom, in closed form for an integer df
    (Abramowitz and Stegun 26.7.3 and 26.7.4)."""
    theta = math.atan(t / math.sqrt(df))
    cos2 = math.cos(theta) ** 2
    term = total = 1.0
    for k in range(2 + df % 2, df - 1, 2):  # (k-1)/k: 1/2, 3/4, ... (even df) or 2/3, 4/5, ... (odd df)
        term *= cos2 * (k - 1) / k
        total += term
    if df % 2 == 0:
        return math.sin(theta) * total
    if df == 1:
        return 2 * theta / math.pi
    return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)


def t_value(confidence: float, df: int) -> float:
    """The two-sided quantile of Student's t with `df` degrees of freedom (2.776 for 0.95 and 4): the t
    with P(|T| <= t) = confidence, by bisection to double precision."""
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    if df < 1:
        raise ValueError("df must be at least 1")
    low, high = 0.0, 1.0
    while _t_coverage(high, df) < confidence:
        low, high = high, high * 2
    while high - low > 1e-12 * high:
        middle = (low + high) / 2
        if _t_coverage(middle, df) < confidence:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def critical_value(confidence: float, df: int | None = None) -> float:
    """The two-sided quantile an interval takes: Student's t with `df` degrees of freedom, the normal one
    when df is None (a variance known, or not estimated from clusters)."""
    return z_value(confidence) if df is None else t_value(confidence, df)


def seeds_df(totals: Sequence[int]) -> int | None:
    """The degrees of freedom of a design effect estimated from seeds of these sizes: seeds with a
    request, less one (None with fewer than two: no effect was estimated)."""
    used = sum(1 for total in totals if total > 0)
    return used - 1 if used > 1 else None


def wilson(
    count: float, total: float, confidence: float = 0.95, df: int | None = None
) -> tuple[float, float]:
    """The Wilson score interval (low, high) of the proportion count/total (count and total may be
    fractional: effective counts), with `critical_value(confidence, df)` for the normal quantile; (0, 1)
    when total is 0."""
    if total < 0 or not 0 <= count <= total:
        raise ValueError("need 0 <= count <= total")
    if total == 0:
        return 0.0, 1.0
    z = critical_value(confidence, df)
    share = count / total
    denominator = 1 + z * z / total
    centre = (share + z * z / (2 * total)) / denominator
    half = z / denominator * math.sqrt(share * (1 - share) / total + z * z / (4 * total * total))
    # At count 0 (or total) the bound is exactly 0 (or 1); the formula leaves rounding error there.
    low = 0.0 if count == 0 else max(centre - half, 0.0)
    return low, 1.0 if count == total else min(centre + half, 1.0)


def newcombe(
    count_a: float, total_a: float, count_b: float, total_b: float, confidence: float = 0.95,
    df_a: int | None = None, df_b: int | None = None,
) -> tuple[float, float]:  # fmt: skip
    """Newcombe's hybrid score interval (low, high) of the difference of proportions b - a, each Wilson
    interval with its own degrees of freedom (`wilson`)."""
    share_a = count_a / total_a if total_a else 0.0
    share_b = count_b / total_b if total_b else 0.0
    low_a, high_a = wilson(count_a, total_a, confidence, df_a)
    low_b, high_b = wilson(count_b, total_b, confidence, df_b)
    difference = share_b - share_a
    low = difference - math.sqrt((share_b - low_b) ** 2 + (high_a - share_a) ** 2)
    high = difference + math.sqrt((high_b - share_b) ** 2 + (share_a - low_a) ** 2)
    return low, high


def design_effect(counts: Sequence[int], totals: Sequence[int]) -> float:
    """How much more the per-seed counts vary than binomial counts would: the Pearson dispersion
    sum((k_s - n_s p)^2 / (n_s p (1 - p))) / (seeds - 1) around the pooled share p, at least 1 (1 with
    fewer than two seeds, or when p is 0 or 1)."""
    if len(counts) != len(totals):
        raise ValueError("one count per total")
    used = [(k, n) for k, n in zip(counts, totals, strict=True) if n > 0]
    count, total = sum(k for k, _ in used), sum(n for _, n in used)
    if len(used) < 2 or count in (0, total):
        return 1.0
    share = count / total
    dispersion = sum((k - n * share) ** 2 / (n * share * (1 - share)) for k, n in used)
    return max(dispersion / (len(used) - 1), 1.0)


def over(samples: Samples, bound: float) -> tuple[list[int], list[int]]:
    """Per seed, how many samples exceed `bound` (failures included), and how many there are."""
    return [sum(1 for x in seed if x > bound) for seed in samples], [len(seed) for seed in samples]


def proportion(samples: Samples, bound: float, confidence: float = 0.95) -> tuple[int, int, float, Interval]:
    """The count of samples over `bound`, the sample count, the design effect of the seeds, and the
    share over it with its Wilson interval on the effective counts (count and total / design effect),
    with t's quantile for seeds - 1 degrees of freedom."""
    counts, totals = over(samples, bound)
    count, total = sum(counts), sum(totals)
    effect = design_effect(counts, totals)
    low, high = wilson(count / effect, total / effect, confidence, seeds_df(totals))
    return count, total, effect, Interval.of(count / total if total else math.nan, low, high)


def proportion_difference(a: Samples, b: Samples, bound: float, confidence: float = 0.95) -> Interval:
    """The share over `bound` of b less that of a, with Newcombe's interval on each mode's effective
    counts (each divided by its own design effect, its Wilson interval with t's quantile for its seeds
    - 1 degrees of freedom)."""
    effective = []
    for samples in (a, b):
        counts, totals = over(samples, bound)
        effect = design_effect(counts, totals)
        effective.append((sum(counts) / effect, sum(totals) / effect, seeds_df(totals)))
    (count_a, total_a, df_a), (count_b, total_b, df_b) = effective
    if not total_a or not total_b:
        return Interval.of(math.nan, math.nan, math.nan)
    low, high = newcombe(count_a, total_a, count_b, total_b, confidence, df_a, df_b)
    return Interval.of(count_b / total_b - count_a / total_a, low, high)


def pooled(samples: Samples) -> list[float]:
    return [x for seed in samples for x in seed]


def _block_positions(
    sizes: Sequence[int], block: int, resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """Positions into the seeds' concatenated samples, one row per resample: each seed's own count of
    positions, drawn as blocks of `block` consecutive ones (shorter when the seed has fewer) that start
    anywhere they fit, the last block cut to length."""
    rows = []
    offset = 0
    for size in sizes:
        length = min(block, size)
        blocks = math.ceil(size / length)
        starts = rng.integers(0, size - length + 1, size=(resamples, blocks))
        positions = (starts[:, :, None] + np.arange(length)).reshape(resamples, -1)[:, :size]
        rows.append(positions + offset)
        offset += size
    return np.concatenate(rows, axis=1)


def _bootstrap_percentiles(
    samples: Sequence[Samples], q: float, block: int, resamples: int, seed: int
) -> list[np.ndarray]:
    """The nearest-rank q-th percentile of each sample set in `samples` over the same `resamples`
    block resamples (the sets must have equal per-seed counts)."""
    sizes = [len(seed_samples) for seed_samples in samples[0]]
    if any([len(s) for s in other] != sizes for other in samples):
        raise ValueError("paired samples need the same count per seed")
    values = [np.asarray(pooled(s), dtype=np.float64) for s in samples]
    rank = max(math.ceil(q / 100 * sum(sizes)) - 1, 0)
    rng = np.random.default_rng(seed)
    estimates: list[list[np.ndarray]] = [[] for _ in samples]
    chunk = max(1, 2_000_000 // max(sum(sizes), 1))  # bounds the positions array to about 16 MB
    for start in range(0, resamples, chunk):
        positions = _block_positions(sizes, block, min(chunk, resamples - start), rng)
        for number, value in enumerate(values):
            estimates[number].append(np.partition(value[positions], rank, axis=1)[:, rank])
    return [np.concatenate(parts) for parts in estimates]


def _quantiles(estimates: np.ndarray, confidence: float) -> tuple[float, float]:
    """The nearest-rank (1 - confidence)/2 and (1 + confidence)/2 quantiles; NaN if any estimate is."""
    if np.isnan(estimates).any():
        return math.nan, math.nan
    ordered = np.sort(estimates)
    tail = (1 - confidence) / 2
    count = len(ordered)
    low = ordered[max(math.ceil(tail * count) - 1, 0)]
    high = ordered[max(math.ceil((1 - tail) * count) - 1, 0)]
    return float(low), float(high)


def _check(samples: Samples, block: int, resamples: int) -> None:
    if block < 1 or resamples < 1:
        raise ValueError("block and resamples must be at least 1")
    if not any(len(seed) for seed in samples):
        raise ValueError("no samples")


def p99_interval(
    samples: Samples, block: int = 1, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> Interval:
    """The P99 of every seed's samples pooled, with its bootstrap interval: blocks of `block` consecutive
    requests resampled within each seed (block 1: `bench.lib.stats.bootstrap_ci` over the pooled samples)."""
    _check(samples, block, resamples)
    value = percentile(pooled(samples), 99)
    if block == 1:
        low, high = bootstrap_ci(pooled(samples), 99, confidence, resamples, seed)
    else:
        (estimates,) = _bootstrap_percentiles([samples], 99, block, resamples, seed)
        low, high = _quantiles(estimates, confidence)
    return Interval.of(value, low, high)


def _difference(b: np.ndarray | float, a: np.ndarray | float) -> np.ndarray:
    """b - a, NaN where both are infinite (no difference is defined there)."""
    with np.errstate(invalid="ignore"):
        return np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)


def p99_difference(
    a: Samples, b: Samples, block: int = 1, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> Interval:
    """b's pooled P99 less a's, with a paired block-bootstrap interval: the same resampled positions in
    both modes. NaN (None in the Interval) where both P99s, or both in some resample, are infinite."""
    _check(a, block, resamples)
    value = float(_difference(percentile(pooled(b), 99), percentile(pooled(a), 99)))
    estimates_a, estimates_b = _bootstrap_percentiles([a, b], 99, block, resamples, seed)
    low, high = _quantiles(_difference(estimates_b, estimates_a), confidence)
    return Interval.of(value, low, high)
