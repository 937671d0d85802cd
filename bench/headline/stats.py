"""The headline's statistics, pure functions: the ratio of two arms' P99s with its intervals, the SLO test,
the decision over the multiples of the baseline's load, and the host's speed.

Every arm runs once in each block (one arrival seed, `bench.lib.orders.block_orders`); blocks are the unit
of replication. r_k is the pooled P99 of RelayGR at k·L over the baseline's at L (`pooled_p99`: nearest
rank over the blocks' latencies, a failed request infinitely slow). Requests cluster by block (an arrival
seed's bursts, a slow spell of the host), so `p99_ratio` resamples whole blocks, the same ones for both
arms (they are paired by seed), never single requests: the percentile interval of the resampled ratios is
the two-sided interval, their `confidence` quantile the one-sided upper bound the decision uses. On
lognormal latencies with a block effect of sd 0.25 in the log and request noise of sd 0.3, 16 blocks of
150 requests, the block bootstrap's 95 % interval held the true ratio in 0.90-0.92 of the replications, a
bootstrap of single requests (wrong on clustered data) in 0.42-0.49 (tests/bench/headline/test_stats.py).
Beside it, a cross-check that does not resample: the per-block log ratios' mean ± Student's t times their
standard error, back through exp (0.94-0.98 there).

`over_slo_test` is the exact one-sided binomial test that the P99 meets the SLO (fewer than `share` of the
Ranks over it). `fixed_sequence` tests the multiples in ascending order, each at the full level, and stops
at the first failure, so the chance of claiming any false multiple stays within 1 - confidence.
`slowdown` compares the host's canary with a reference, `kept_blocks` applies the limits, and `host_unit`
is the host's unit u.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

import numpy as np

from bench.lib.intervals import t_value
from bench.lib.stats import percentile

_Q = 99.0  # the percentile of the headline


def pooled_p99(blocks: Sequence[Sequence[float]]) -> float:
    """The nearest-rank P99 of the values of all `blocks` pooled (NaN when there are none)."""
    return percentile([value for block in blocks for value in block], _Q)


@dataclasses.dataclass(frozen=True)
class RatioEstimate:
    """The pooled P99 ratio of two arms with its block-bootstrap interval and bound and the t cross-check."""

    value: float  # the ratio of the pooled P99s
    low: float  # the two-sided percentile block-bootstrap interval at `confidence`
    high: float
    upper: float  # the one-sided upper bound at `confidence`: that quantile of the bootstrap ratios
    t_low: float | None  # exp(mean ± t·sd/√n) of the per-block log ratios; None with one block
    t_high: float | None
    t_upper: float | None  # exp(mean + t·sd/√n) with the one-sided quantile
    blocks: int


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator of positive P99s, an infinite one included: inf / inf is inf (the numerator
    failed, which counts against it) and a finite value over inf is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = numerator / denominator
    return np.where(np.isinf(denominator), np.where(np.isinf(numerator), math.inf, 0.0), ratio)


def _rank(count: np.ndarray | int) -> np.ndarray:
    """The 0-based index of the nearest-rank P99 among `count` sorted values, as `percentile` takes it."""
    return np.maximum(np.ceil(_Q / 100 * np.asarray(count, dtype=np.float64)).astype(np.int64) - 1, 0)


def _p99(values: np.ndarray) -> np.ndarray:
    """The nearest-rank P99 of a non-empty array (as `pooled_p99`)."""
    return np.partition(values, int(_rank(values.size)))[int(_rank(values.size))]


def _arms(
    numerator: Sequence[Sequence[float]], denominator: Sequence[Sequence[float]], confidence: float,
    resamples: int,
) -> tuple[list[np.ndarray], list[np.ndarray]]:  # fmt: skip
    """Both arms' blocks as arrays, checked: as many blocks in each, at least 1, none empty, every value
    positive (math.inf allowed); `confidence` in (0.5, 1); at least one resample. Else ValueError."""
    if not len(numerator) or len(numerator) != len(denominator):
        raise ValueError("numerator and denominator need the same number of blocks, at least 1")
    if not 0.5 < confidence < 1:
        raise ValueError("confidence must be in (0.5, 1)")
    if resamples < 1:
        raise ValueError("resamples must be at least 1")
    arms = []
    for name, arm in (("numerator", numerator), ("denominator", denominator)):
        arms.append([np.asarray(block, dtype=np.float64) for block in arm])
        if not all(array.size for array in arms[-1]):
            raise ValueError(f"{name} has an empty block")
        if not all(np.all(array > 0) for array in arms[-1]):  # NaN fails too
            raise ValueError(f"{name} has a latency that is not positive")
    return arms[0], arms[1]


def _resampled_p99(blocks: list[np.ndarray], counts: np.ndarray) -> np.ndarray:
    """The pooled nearest-rank P99 of each resample of whole blocks, `counts[r, b]` being how often resample
    r drew block b.

    Only the top of each block can be a resample's P99: with T values pooled, the P99 has m = T - 1 - rank
    values above it, so it and every value above it have at most m values above them in their own block,
    and each block's largest ceil(T_max/100) + 1 values suffice (T_max: the largest pool, one block drawn
    every time). Those tops are sorted together, descending; the P99 is the first of them where the values
    so far, each counted as often as its block was drawn, exceed m. That count is `counts @ within`,
    `within[b, i]` being how many of the first i + 1 are block b's, so a bisection over i finds it for all
    resamples at once."""
    draws = counts.shape[1]
    keep = math.ceil(draws * max(block.size for block in blocks) / 100) + 1
    tops = [np.sort(block)[::-1][:keep] for block in blocks]
    labels = np.concatenate([np.full(top.size, b) for b, top in enumerate(tops)])
    values = np.concatenate(tops)
    order = np.argsort(-values, kind="stable")
    values, labels = values[order], labels[order]
    within = np.cumsum(labels[None, :] == np.arange(len(blocks))[:, None], axis=1)
    pooled = counts @ np.array([block.size for block in blocks])
    above = pooled - 1 - _rank(pooled)  # m of each resample
    low = np.zeros(counts.shape[0], dtype=np.int64)
    high = np.full(counts.shape[0], values.size - 1)  # the whole of the tops always exceeds m
    while np.any(low < high):
        middle = (low + high) // 2
        exceeds = np.einsum("rb,br->r", counts, within[:, middle]) > above
        high, low = np.where(exceeds, middle, high), np.where(exceeds, low, middle + 1)
    return values[low]


def _quantile(sorted_values: np.ndarray, level: float) -> float:
    """The nearest-rank `level` quantile of sorted values."""
    return float(sorted_values[max(math.ceil(level * sorted_values.size) - 1, 0)])


def _interval(ratios: np.ndarray, confidence: float) -> tuple[float, float]:
    """The two-sided percentile interval of sorted resampled ratios."""
    tail = (1 - confidence) / 2
    return _quantile(ratios, tail), _quantile(ratios, 1 - tail)


def p99_ratio(
    numerator: Sequence[Sequence[float]],
    denominator: Sequence[Sequence[float]],
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> RatioEstimate:
    """The ratio of the pooled P99s of two arms, `numerator[b]` and `denominator[b]` being their latencies
    (ms, math.inf for a failed request) in block b, with its block-bootstrap interval and upper bound
    (`resamples` resamples of whole blocks, the same blocks for both arms) and the t cross-check of the
    per-block log ratios (from 0 to infinity where a block's ratio is 0 or infinite: it decides nothing)."""
    top, bottom = _arms(numerator, denominator, confidence, resamples)
    count = len(top)
    value = float(_ratio(_p99(np.concatenate(top)), _p99(np.concatenate(bottom))))
    drawn = np.random.default_rng(seed).integers(0, count, size=(resamples, count))
    counts = np.zeros((resamples, count), dtype=np.int64)
    np.add.at(counts, (np.arange(resamples)[:, None], drawn), 1)
    ratios = np.sort(_ratio(_resampled_p99(top, counts), _resampled_p99(bottom, counts)))
    t_low = t_high = t_upper = None
    if count >= 2:
        per_block = _ratio(
            np.array([_p99(block) for block in top]), np.array([_p99(block) for block in bottom])
        )
        if np.all(np.isfinite(per_block) & (per_block > 0)):
            logs = np.log(per_block)
            mean, error = float(logs.mean()), float(logs.std(ddof=1)) / math.sqrt(count)
            spread = t_value(confidence, count - 1) * error
            t_low, t_high = math.exp(mean - spread), math.exp(mean + spread)
            t_upper = math.exp(mean + t_value(2 * confidence - 1, count - 1) * error)
        else:  # a block's ratio is 0 or infinite: the cross-check holds every ratio and decides nothing
            t_low, t_high, t_upper = 0.0, math.inf, math.inf
    low, high = _interval(ratios, confidence)
    return RatioEstimate(value, low, high, _quantile(ratios, confidence), t_low, t_high, t_upper, count)


def over_slo_test(over: int, total: int, share: float = 0.01, confidence: float = 0.95) -> tuple[float, bool]:
    """The exact one-sided binomial test of "at least `share` of the Ranks are over the SLO" (the P99 misses
    it) against "fewer are": the p-value P(X <= over) for X ~ Binomial(total, share), summed in log space,
    and whether it is under 1 - confidence (the P99 meets the SLO)."""
    if total < 1:
        raise ValueError("total must be at least 1")
    if not 0 <= over <= total:
        raise ValueError("over must be in [0, total]")
    if not 0 < share < 1:
        raise ValueError("share must be in (0, 1)")
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    log_share, log_rest, log_all = math.log(share), math.log1p(-share), math.lgamma(total + 1)
    terms = [
        log_all - math.lgamma(k + 1) - math.lgamma(total - k + 1) + k * log_share + (total - k) * log_rest
        for k in range(over + 1)
    ]
    largest = max(terms)
    p_value = min(math.exp(largest) * math.fsum(math.exp(term - largest) for term in terms), 1.0)
    return p_value, p_value < 1 - confidence


@dataclasses.dataclass(frozen=True)
class Step:
    """One multiple of the fixed sequence: its upper bound of r_k, its SLO verdict, and whether it was
    tested and passed (a multiple after the first failure is not tested, so not passed)."""

    multiple: float
    upper: float
    meets_slo: bool
    passed: bool
    tested: bool


def fixed_sequence(steps: Sequence[tuple[float, float, bool]]) -> tuple[float | None, list[Step]]:
    """The decision over (multiple, upper bound of r_k, meets the SLO) triples: in ascending order, a
    multiple passes when its upper bound is at most 1 and it meets the SLO; the first failure stops the
    sequence. The largest multiple claimed (None when the smallest fails) and every step."""
    ordered = sorted(steps, key=lambda step: step[0])
    if len({multiple for multiple, _, _ in ordered}) != len(ordered):
        raise ValueError("multiples must be distinct")
    claimed: float | None = None
    result: list[Step] = []
    stopped = False
    for multiple, upper, meets in ordered:
        passed = not stopped and upper <= 1 and bool(meets)
        result.append(Step(multiple, upper, bool(meets), passed, tested=not stopped))
        if passed:
            claimed = multiple
        else:
            stopped = True
    return claimed, result


def slowdown(
    canary_ms: Sequence[float], reference_ms: float, steal_share: float, reference_steal_share: float
) -> float:
    """The host's slowdown against the reference: (median canary reading / reference) x (1 - reference's
    steal share) / (1 - steal share); a steal share is the share of wall time the hypervisor took."""
    if not canary_ms:
        raise ValueError("no canary readings")
    if not reference_ms > 0:
        raise ValueError("reference_ms must be positive")
    for name, share in (("steal_share", steal_share), ("reference_steal_share", reference_steal_share)):
        if not 0 <= share < 1:
            raise ValueError(f"{name} must be in [0, 1)")
    return statistics.median(canary_ms) / reference_ms * (1 - reference_steal_share) / (1 - steal_share)


def kept_blocks(
    slowdowns: Sequence[float],
    limit: float = 1.15,
    foreign: Sequence[float] = (),
    foreign_limit: float = math.inf,
) -> list[bool]:
    """The blocks kept: slowdown at most `limit`, other processes' cores (`foreign`: the most in one of each
    block's trials; empty: none recorded) at most `foreign_limit`. One value a block, else ValueError."""
    others = foreign or [0.0] * len(slowdowns)
    return [s <= limit and f <= foreign_limit for s, f in zip(slowdowns, others, strict=True)]


def host_unit(timings: Sequence[float]) -> float:
    """The host's unit u: the median of `timings` of one pass. Never a running minimum: that picks the
    luckiest reading, so it only falls as readings accumulate, and an SLO in u would tighten as a run goes
    on, against the arms measured later; the median stays at the host's typical speed."""
    if not timings:
        raise ValueError("no timings")
    return float(statistics.median(timings))
