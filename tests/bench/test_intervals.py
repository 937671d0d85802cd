"""The A/B's intervals (`bench.lib.intervals`): published values, coverage by simulation, clustering, pairing
and failed requests."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.lib import intervals, stats
from bench.lib.intervals import Interval
from bench.lib.stats import bootstrap_ci, percentile

INF = math.inf


def test_wilson_matches_published_values():
    # Newcombe (1998), Statistics in Medicine 17:857, table I: 81/263 gives 0.2553 to 0.3662.
    assert intervals.wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=5e-5)
    # 10 of 1000: 0.0054 to 0.0183 (Wilson's score interval, as any reference computes it).
    assert intervals.wilson(10, 1000) == pytest.approx((0.00544, 0.01831), abs=5e-6)
    # Nothing observed: the interval starts at 0 and is not a point (the Wald interval's failure).
    low, high = intervals.wilson(0, 1000)
    assert low == 0 and high == pytest.approx(0.00383, abs=5e-6)
    assert intervals.wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        intervals.wilson(5, 4)


def test_newcombe_matches_published_values():
    # Newcombe (1998b), Statistics in Medicine 17:873, table II, method 10: 56/70 - 48/80 is 0.0524 to
    # 0.3339; 5/56 - 0/29 is -0.0381 to 0.1926 (here b - a, so 0/29 - 5/56 is the mirror image).
    assert intervals.newcombe(48, 80, 56, 70) == pytest.approx((0.0524, 0.3339), abs=5e-5)
    assert intervals.newcombe(5, 56, 0, 29) == pytest.approx((-0.1926, 0.0381), abs=5e-5)


@pytest.mark.parametrize("share", [0.01, 0.05])
def test_a_95_percent_wilson_interval_covers_the_true_share_about_95_percent_of_the_time(share: float):
    rng = np.random.default_rng(7)
    counts = rng.binomial(1000, share, size=4000)
    covered = [low <= share <= high for low, high in (intervals.wilson(int(k), 1000) for k in counts)]
    assert 0.93 <= np.mean(covered) <= 0.97


def test_newcombe_covers_the_true_difference_about_95_percent_of_the_time():
    rng = np.random.default_rng(11)
    a, b = rng.binomial(2000, 0.02, size=3000), rng.binomial(2000, 0.03, size=3000)
    covered = [
        low <= 0.01 <= high
        for low, high in (intervals.newcombe(int(x), 2000, int(y), 2000) for x, y in zip(a, b, strict=True))
    ]
    assert 0.93 <= np.mean(covered) <= 0.97


@pytest.mark.parametrize(
    ("confidence", "df", "quantile"),
    # Student's t table (Abramowitz and Stegun 26.10): the 0.975 and 0.995 quantiles.
    [(0.95, 1, 12.7062), (0.95, 2, 4.3027), (0.95, 3, 3.1824), (0.95, 4, 2.7764), (0.95, 30, 2.0423),
     (0.99, 4, 4.6041), (0.90, 9, 1.8331)],
)  # fmt: skip
def test_the_t_quantile_matches_published_values(confidence: float, df: int, quantile: float):
    assert intervals.t_value(confidence, df) == pytest.approx(quantile, abs=5e-5)


def test_the_t_quantile_tends_to_the_normal_one_and_no_df_is_the_normal_one():
    z = intervals.critical_value(0.95)
    assert z == pytest.approx(1.95996, abs=1e-5)
    assert z < intervals.t_value(0.95, 2000) < z + 2e-3  # 1.9612
    assert intervals.seeds_df([600] * 5) == 4 and intervals.seeds_df([600, 0]) is None
    with pytest.raises(ValueError):
        intervals.t_value(0.95, 0)


def beta_binomial_seeds(rng: np.random.Generator, share: float, effect: float, seeds: int, size: int):
    """Per-seed counts of `size` requests whose share over the bound is drawn, per seed, from the beta
    distribution of mean `share` whose beta-binomial has design effect `effect` (1 + (size - 1) rho)."""
    rho = (effect - 1) / (size - 1)
    shares = rng.beta(share * (1 - rho) / rho, (1 - share) * (1 - rho) / rho, size=seeds)
    return rng.binomial(size, shares)


def test_95_percent_share_intervals_cover_the_true_share_about_95_percent_of_the_time_when_seeds_cluster():
    """Beta-binomial seeds as the committed A/Bs measured them (5 seeds of 600 requests, design effects
    1-12.6): each seed's share over the SLO is drawn around 0.8 % with a design effect of 5. The normal
    quantile on the effective counts covered 88 % (share) and 89 % (difference of two such modes); t with
    4 degrees of freedom covers 96 % of both."""
    rng = np.random.default_rng(17)
    share, trials, covered, differences = 0.008, 2000, 0, 0
    for _ in range(trials):
        a = seeds_over(list(beta_binomial_seeds(rng, share, 5.0, 5, 600)), size=600)
        b = seeds_over(list(beta_binomial_seeds(rng, 2 * share, 5.0, 5, 600)), size=600)
        interval = intervals.proportion(a, 100.0)[3]
        covered += interval.low <= share <= interval.high
        difference = intervals.proportion_difference(a, b, 100.0)
        differences += difference.low <= share <= difference.high
    assert 0.93 <= covered / trials <= 0.98
    assert 0.93 <= differences / trials <= 0.98


def test_the_design_effect_is_one_for_binomial_seeds_and_large_for_clustered_ones():
    assert intervals.design_effect([10, 12, 9, 11, 8], [1000] * 5) == 1.0  # less dispersed than binomial
    assert intervals.design_effect([0, 0, 0, 0], [1000] * 4) == 1.0
    assert intervals.design_effect([7], [1000]) == 1.0  # one seed: nothing to measure it by
    # Every violation in one seed's burst: 50 of 5000 pooled, all in seed 4.
    clustered = intervals.design_effect([0, 0, 0, 0, 50], [1000] * 5)
    expected = sum((k - 10) ** 2 / (1000 * 0.01 * 0.99) for k in (0, 0, 0, 0, 50)) / 4
    assert clustered == pytest.approx(expected) and clustered > 40


def seeds_over(counts: list[int], size: int = 1000, slow: float = 150.0, fast: float = 50.0) -> list:
    """Latencies by seed, `counts[s]` of seed s over a 100 ms bound."""
    return [[slow] * k + [fast] * (size - k) for k in counts]


def test_a_clustered_share_gets_a_wider_interval_from_the_same_pooled_count():
    spread = intervals.proportion(seeds_over([10, 10, 10, 10, 10]), 100.0)
    burst = intervals.proportion(seeds_over([0, 0, 0, 0, 50]), 100.0)
    assert spread[:3] == (50, 5000, 1.0) and burst[:2] == (50, 5000)
    assert spread[3].value == burst[3].value == 0.01
    assert spread[3].low == pytest.approx(intervals.wilson(50, 5000, df=4)[0], abs=1e-6)
    assert burst[3].high - burst[3].low > 5 * (spread[3].high - spread[3].low)


def test_the_difference_of_shares_contains_zero_for_identical_modes_and_excludes_it_for_different_ones():
    same = intervals.proportion_difference(seeds_over([10] * 5), seeds_over([10] * 5), 100.0)
    assert same.value == 0 and same.low < 0 < same.high and not same.excludes_zero()
    fewer = intervals.proportion_difference(seeds_over([50] * 5), seeds_over([10] * 5), 100.0)
    assert fewer.value == pytest.approx(-0.04) and fewer.high < 0 and fewer.excludes_zero()
    # The same pooled counts, all of b's in one seed: no longer shown different.
    clustered = intervals.proportion_difference(seeds_over([12] * 5), seeds_over([0, 0, 0, 0, 40]), 100.0)
    assert clustered.value == pytest.approx(-0.004) and not clustered.excludes_zero()


def test_failed_requests_are_over_every_bound_and_may_make_a_p99_infinite():
    failed = [[INF] * 20 + [10.0] * 980]  # 2 % failed: the P99 is a failure
    assert intervals.proportion(failed, 1e9, 0.95)[0] == 20
    p99 = intervals.p99_interval(failed, block=10, resamples=200)
    assert p99.value is None and p99.high is None
    healthy = [[10.0 + i % 7 for i in range(1000)]]
    one_side = intervals.p99_difference(healthy, failed, block=10, resamples=200)
    assert one_side.value is None  # an infinite difference: no number to report
    both = intervals.p99_difference(failed, failed, block=10, resamples=200)
    assert (both.value, both.low, both.high) == (None, None, None)  # inf - inf: undefined
    # A few failures, below 1 %: the P99 stays finite, but resamples may put it on a failure.
    some = [[INF] * 5 + [10.0 + i % 50 for i in range(995)]]
    interval = intervals.p99_interval(some, resamples=500)
    assert interval.value == percentile(some[0], 99) and interval.low is not None


def test_with_blocks_of_one_request_the_p99_interval_is_bench_stats_bootstrap():
    rng = np.random.default_rng(3)
    seeds = [list(rng.exponential(20.0, 400)) for _ in range(3)]
    pooled = [x for seed in seeds for x in seed]
    got = intervals.p99_interval(seeds, block=1, resamples=1000, seed=5)
    low, high = bootstrap_ci(pooled, 99, 0.95, 1000, 5)
    assert (got.value, got.low, got.high) == pytest.approx((percentile(pooled, 99), low, high), abs=1e-6)


def test_block_resampling_keeps_each_seeds_count_and_range():
    positions = stats.block_positions([10, 3, 7], 4, 50, np.random.default_rng(0))
    assert positions.shape == (50, 20)
    assert positions[:, :10].min() >= 0 and positions[:, :10].max() <= 9
    assert positions[:, 10:13].min() >= 10 and positions[:, 10:13].max() <= 12
    assert positions[:, 13:].min() >= 13 and positions[:, 13:].max() <= 19
    # Within a block the positions are consecutive.
    assert (np.diff(positions[:, :4], axis=1) == 1).all()


def test_bursts_widen_the_block_bootstrap_interval_of_the_p99():
    """Slow requests in bursts of 40 consecutive ones: resampled one by one, the bursts are spread out and
    the interval is too narrow; blocks keep them together."""
    rng = np.random.default_rng(5)
    seeds = []
    for _ in range(5):
        values = rng.exponential(10.0, 2000)
        start = int(rng.integers(0, 1900))
        values[start : start + int(rng.integers(10, 40))] += 200.0
        seeds.append(list(values))
    single = intervals.p99_interval(seeds, block=1, resamples=1000)
    blocks = intervals.p99_interval(seeds, block=50, resamples=1000)
    assert single.value == blocks.value
    assert blocks.high - blocks.low > 1.5 * (single.high - single.low)


def test_the_p99_difference_is_paired_by_request():
    rng = np.random.default_rng(9)
    a = [list(rng.exponential(20.0, 1000)) for _ in range(5)]
    shifted = [[x + 5.0 for x in seed] for seed in a]
    difference = intervals.p99_difference(a, shifted, block=20, resamples=500)
    # The same positions in both modes: every resample's difference is exactly the shift.
    assert (difference.value, difference.low, difference.high) == pytest.approx((5.0, 5.0, 5.0))
    assert difference.excludes_zero()
    same = intervals.p99_difference(a, a, block=20, resamples=500)
    assert (same.value, same.low, same.high) == (0.0, 0.0, 0.0) and not same.excludes_zero()
    other = [list(rng.exponential(20.0, 1000)) for _ in range(5)]  # another draw of the same distribution
    noise = intervals.p99_difference(a, other, block=20, resamples=500)
    assert noise.low < 0 < noise.high
    with pytest.raises(ValueError):
        intervals.p99_difference(a, [seed[:-1] for seed in a])


def test_an_interval_excludes_zero_only_when_wholly_on_one_side():
    assert Interval(value=1.0, low=0.5, high=None).excludes_zero()  # up to infinity
    assert Interval(value=-1.0, low=None, high=-0.5).excludes_zero()
    assert not Interval(value=None, low=None, high=None).excludes_zero()
    assert not Interval(value=0.1, low=-0.1, high=0.3).excludes_zero()
    assert Interval.of(INF, 1.0, math.nan) == Interval(value=None, low=1.0, high=None)
