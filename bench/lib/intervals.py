"""Confidence intervals of a fixed-load A/B comparison (`bench.ab`; docs/benchmark.md says why each): pure
functions over latency samples by load seed, each seed's in send order, a failed request counting as an
infinitely slow one (over any bound; it may make a P99 infinite).

Shares over a bound: `wilson` (Wilson's score interval) and, for the difference of two, `newcombe`
(Newcombe's hybrid score method, method 10 of Newcombe 1998), both closed forms that behave at counts of
0. A seed's requests are a cluster (a burst delays many Ranks together), so `proportion` and
`proportion_difference` divide count and total by the seeds' `design_effect` (the Rao-Scott adjustment)
and take Student's t quantile for seeds - 1 degrees of freedom (`critical_value`): with 5 seeds clustered
at design effect 5, the normal quantile's "95 %" intervals covered 88-89 %, t's 96 %
(tests/bench/test_intervals.py). The modes' counts at one seed are positively correlated (shared users
and arrivals); the difference's interval ignores that, which only widens it.

P99s: `p99_interval` (the pooled P99) and `p99_difference` (two modes' difference) resample blocks of
`block` consecutive requests within each seed (a moving-block bootstrap stratified by seed, which keeps a
burst together, where resampling 5 whole seeds has only 126 distinct resamples and under-covers); `block`
1 is the per-request bootstrap. The difference resamples the same positions in both modes, so their shared
arrivals cancel; a resample where both P99s are infinite has no difference, and the interval is then NaN.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

import numpy as np

from bench.lib.stats import bootstrap_ci, bootstrap_percentiles, finite, interval_ends, percentile

Samples = Sequence[Sequence[float]]  # latencies by seed, each in send order; math.inf for a failed request


@dataclasses.dataclass(frozen=True, kw_only=True)
class Interval:
    """An estimate and its confidence interval; None where a value is infinite or undefined."""

    value: float | None
    low: float | None
    high: float | None

    @classmethod
    def of(cls, value: float, low: float, high: float, digits: int = 6) -> Interval:
        return cls(value=finite(value, digits), low=finite(low, digits), high=finite(high, digits))

    def excludes_zero(self) -> bool:
        """Whether the interval lies wholly above or below 0 (a missing bound is an infinite one, on its
        own side; with both missing, nothing is excluded)."""
        return (self.low is not None and self.low > 0) or (self.high is not None and self.high < 0)


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
        low, high = (middle, high) if _t_coverage(middle, df) < confidence else (low, middle)
    return (low + high) / 2


def critical_value(confidence: float, df: int | None = None) -> float:
    """The two-sided quantile an interval takes: Student's t with `df` degrees of freedom, the standard
    normal one when df is None (1.96 for 0.95: a variance not estimated from clusters)."""
    if df is not None:
        return t_value(confidence, df)
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    return statistics.NormalDist().inv_cdf((1 + confidence) / 2)


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


def _counts(samples: Samples, bound: float) -> tuple[int, int, float, int | None]:
    """The count of samples over `bound`, the sample count, the seeds' design effect, and the degrees of
    freedom it was estimated with: dividing both counts by the effect gives the effective ones."""
    counts, totals = [sum(1 for x in seed if x > bound) for seed in samples], [len(seed) for seed in samples]
    return sum(counts), sum(totals), design_effect(counts, totals), seeds_df(totals)


def proportion(samples: Samples, bound: float, confidence: float = 0.95) -> tuple[int, int, float, Interval]:
    """The count of samples over `bound`, the sample count, the design effect of the seeds, and the
    share over it with its Wilson interval on the effective counts, with t's quantile for seeds - 1
    degrees of freedom."""
    count, total, effect, df = _counts(samples, bound)
    low, high = wilson(count / effect, total / effect, confidence, df)
    return count, total, effect, Interval.of(count / total if total else math.nan, low, high)


def proportion_difference(a: Samples, b: Samples, bound: float, confidence: float = 0.95) -> Interval:
    """The share over `bound` of b less that of a, with Newcombe's interval on each mode's effective
    counts (`_counts`, each Wilson interval with its own degrees of freedom)."""
    (count_a, total_a, effect_a, df_a), (count_b, total_b, effect_b, df_b) = (
        _counts(a, bound),
        _counts(b, bound),
    )
    if not total_a or not total_b:
        return Interval.of(math.nan, math.nan, math.nan)
    low, high = newcombe(
        count_a / effect_a, total_a / effect_a, count_b / effect_b, total_b / effect_b, confidence, df_a, df_b
    )
    return Interval.of(count_b / total_b - count_a / total_a, low, high)


def pooled(samples: Samples) -> list[float]:
    return [x for seed in samples for x in seed]


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
        (estimates,) = bootstrap_percentiles([samples], 99, block, resamples, seed)
        low, high = interval_ends(estimates, confidence)
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
    estimates_a, estimates_b = bootstrap_percentiles([a, b], 99, block, resamples, seed)
    low, high = interval_ends(_difference(estimates_b, estimates_a), confidence)
    return Interval.of(value, low, high)
