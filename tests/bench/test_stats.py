"""The benchmark's statistics: nearest-rank percentiles and their bootstrap intervals, the SLO verdict,
the grid search and its refinement."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.stats import (
    bootstrap_ci,
    interleave,
    largest_passing,
    largest_passing_value,
    meets_slo,
    percentile,
    violation_budget,
)


def test_percentiles_are_nearest_rank_and_count_failures_as_infinitely_slow():
    samples = list(range(1, 101))  # 1 … 100 ms
    assert percentile(samples, 50) == 50
    assert percentile(samples, 99) == 99
    assert percentile(samples, 100) == 100
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 99))
    with_failures = [*range(1, 99), math.inf, math.inf]  # two failed requests out of 100
    assert percentile(with_failures, 99) == math.inf
    assert percentile([*range(1, 100), math.inf], 99) == 99  # one failure fits within the 1%
    with pytest.raises(ValueError):
        percentile(samples, 0)


@pytest.mark.parametrize("count, budget", [(100, 1), (200, 2), (150, 1), (1000, 10), (99, 0), (1, 0)])
def test_the_violation_budget_is_exactly_what_a_passing_p99_tolerates(count, budget):
    assert violation_budget(count) == budget
    slo = 10.0
    at_budget = [1.0] * (count - budget) + [20.0] * budget
    over_budget = [1.0] * (count - budget - 1) + [20.0] * (budget + 1)
    assert percentile(at_budget, 99) <= slo < percentile(over_budget, 99)


def test_a_point_meets_the_slo_with_its_p99_within_it_and_few_enough_errors():
    assert meets_slo(99.9, errors=0, count=200, slo_ms=100, max_error_fraction=0.001)
    assert not meets_slo(100.1, errors=0, count=200, slo_ms=100, max_error_fraction=0.001)
    assert not meets_slo(50.0, errors=1, count=200, slo_ms=100, max_error_fraction=0.001)  # 0.5% errors
    assert meets_slo(50.0, errors=1, count=2000, slo_ms=100, max_error_fraction=0.001)  # 0.05% errors
    assert not meets_slo(50.0, errors=0, count=0, slo_ms=100, max_error_fraction=0.001)


def search_largest(grid: list[int], first: int, passes: Callable[[int], bool]) -> tuple[int | None, dict]:
    """One search on its own: the largest passing grid value and every verdict by grid index."""
    verdicts: dict[int, bool] = {}

    def measure(index: int) -> bool:
        verdicts[index] = passes(grid[index])
        return verdicts[index]

    (best,) = interleave([(largest_passing(len(grid), first), measure)])
    return (None if best is None else grid[best]), verdicts


@pytest.mark.parametrize("size", [1, 2, 5, 9, 13])
def test_the_search_finds_the_largest_passing_value_from_any_guess_without_repeating(size):
    grid = [2**i for i in range(size)]
    for limit in [0, *grid]:  # 0: nothing passes
        for first in range(-1, size + 1):  # guesses may fall off the grid
            probed: list[int] = []

            def passes(value: int, probed: list[int] = probed, limit: int = limit) -> bool:
                probed.append(value)
                return value <= limit

            best, verdicts = search_largest(grid, first, passes)
            assert best == (limit or None)
            assert len(probed) == len(set(probed)) == len(verdicts)
            assert all(verdicts[grid.index(v)] == (v <= limit) for v in probed)


def test_a_right_guess_costs_two_measurements_and_a_wrong_one_logarithmically_many():
    grid = list(range(100))
    probed: list[int] = []

    def passes(value: int) -> bool:
        probed.append(value)
        return value <= 40

    assert search_largest(grid, 40, passes)[0] == 40 and probed == [40, 41]
    probed.clear()
    assert search_largest(grid, 0, passes)[0] == 40 and len(probed) <= 2 * math.ceil(math.log2(100)) + 1
    probed.clear()
    assert search_largest(grid, 99, passes)[0] == 40 and len(probed) <= 2 * math.ceil(math.log2(100)) + 1


def test_interleaved_searches_take_turns_and_find_what_each_finds_alone():
    grid = list(range(20))
    order: list[str] = []

    def measure(name: str, limit: int):
        def run(index: int) -> bool:
            order.append(name)
            return grid[index] <= limit

        return run

    searches = [
        (largest_passing(20, 3), measure("baseline", 4)),
        (largest_passing(20, 5), measure("relay", 16)),
    ]
    assert interleave(searches) == [4, 16]
    assert (
        search_largest(grid, 3, lambda v: v <= 4)[0] == 4
        and search_largest(grid, 5, lambda v: v <= 16)[0] == 16
    )
    baseline_turns = order.count("baseline")
    assert order[: 2 * baseline_turns] == ["baseline", "relay"] * baseline_turns  # in turn while both run
    assert set(order[2 * baseline_turns :]) <= {"relay"}


def test_the_bootstrap_interval_of_a_p99_holds_the_true_p99_about_as_often_as_it_says():
    true_p99 = math.log(100)  # of the unit exponential
    trials = 200
    covered = 0
    widths = []
    for trial in range(trials):
        samples = np.random.default_rng(10_000 + trial).exponential(size=1000)
        low, high = bootstrap_ci(samples, 99, confidence=0.95, seed=trial)
        covered += low <= true_p99 <= high
        widths.append(high - low)
    # Nominal 95%; the percentile bootstrap of a tail quantile of 1000 samples gives about 93%.
    assert 0.88 <= covered / trials <= 0.99
    assert 0.5 < np.median(widths) < 2.5  # informative: the P99's standard error here is about 0.3


def test_the_bootstrap_of_2000_resamples_of_1000_samples_takes_well_under_a_second():
    samples = np.random.default_rng(0).exponential(size=1000)
    started = time.perf_counter()
    bootstrap_ci(samples, resamples=2000)
    assert time.perf_counter() - started < 0.5


def test_bootstrap_edge_cases():
    assert all(math.isnan(bound) for bound in bootstrap_ci([]))
    assert bootstrap_ci([7.0]) == (7.0, 7.0)
    assert bootstrap_ci([3.0] * 50) == (3.0, 3.0)
    # With failures beyond what a P99 tolerates, the interval's top is infinite, and with many, all of it.
    assert bootstrap_ci([*range(1, 96), *[math.inf] * 5])[1] == math.inf
    assert bootstrap_ci([1.0] * 50 + [math.inf] * 50) == (math.inf, math.inf)
    assert bootstrap_ci(list(range(100)), seed=3) == bootstrap_ci(list(range(100)), seed=3)
    for bad in ({"q": 0}, {"confidence": 1.0}, {"confidence": 0.0}, {"resamples": 0}):
        with pytest.raises(ValueError):
            bootstrap_ci([1.0, 2.0], **bad)


latencies = st.lists(
    st.one_of(st.floats(0, 1e4, allow_nan=False), st.just(math.inf)), min_size=1, max_size=300
)


@settings(max_examples=60, deadline=None)
@given(latencies, st.floats(0.5, 0.99), st.integers(0, 2**32 - 1))
def test_the_interval_is_ordered_made_of_samples_and_nested_in_the_confidence(samples, confidence, seed):
    low, high = bootstrap_ci(samples, 99, confidence, resamples=200, seed=seed)
    assert low <= high and low in samples and high in samples
    wider_low, wider_high = bootstrap_ci(samples, 99, 0.995, resamples=200, seed=seed)
    assert wider_low <= low and high <= wider_high  # the same resamples, a wider share of them


def run_search(grid: list[float], first: int, steps: int, passes: Callable[[float], bool]) -> tuple:
    """One refined search on its own: its answer and the values it measured, in order."""
    measured: list[float] = []

    def measure(value: float) -> bool:
        measured.append(value)
        return passes(value)

    (best,) = interleave([(largest_passing_value(grid, first, steps), measure)])
    return best, measured


def test_refinement_bisects_geometrically_between_the_best_and_the_first_failure():
    grid = [2.0, 4.0, 8.0, 16.0]
    best, measured = run_search(grid, 0, 2, lambda rate: rate <= 11)
    assert measured == [2.0, 4.0, 16.0, 8.0, 11.3, 9.5] and best == 9.5  # sqrt(8·16), then sqrt(8·11.3)
    best, measured = run_search(grid, 2, 2, lambda rate: rate <= 14)
    assert measured == [8.0, 16.0, 11.3, 13.4] and best == 13.4  # sqrt(11.3·16)
    assert run_search(grid, 2, 0, lambda rate: rate <= 14) == (8.0, [8.0, 16.0])


def test_refinement_stops_where_rounding_leaves_nothing_between_and_at_the_grid_ends():
    assert run_search([1.0, 1.1], 0, 3, lambda rate: rate <= 1.05) == (1.0, [1.0, 1.1])
    assert run_search([2.0, 3.0], 0, 5, lambda rate: rate < 2.5) == (2.4, [2.0, 3.0, 2.4, 2.7, 2.5])
    assert run_search([2.0, 4.0], 1, 2, lambda rate: True) == (4.0, [4.0])  # the grid's top passed
    assert run_search([2.0, 4.0], 1, 2, lambda rate: False) == (None, [4.0, 2.0])  # nothing passed


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 2000), min_size=1, max_size=12, unique=True).map(sorted),
    st.floats(0.5, 2500),
    st.integers(-1, 12),
    st.integers(0, 4),
)
def test_the_refined_answer_is_the_largest_measured_pass_below_every_failure(grid, limit, first, steps):
    values = [v / 10 for v in grid]
    best, measured = run_search(values, first, steps, lambda rate: rate <= limit)
    assert len(measured) == len(set(measured))
    passed = [v for v in measured if v <= limit]
    assert best == (max(passed) if passed else None)
    assert all(best is None or best < v for v in measured if v > limit)
    on_grid = [v for v in values if v <= limit]
    assert best == (on_grid[-1] if on_grid else None) or best > on_grid[-1]
    assert len([v for v in measured if v not in values]) <= steps


def test_refinements_of_several_sweeps_take_turns():
    order: list[str] = []

    def measure(name: str, limit: float) -> Callable[[float], bool]:
        def run(value: float) -> bool:
            order.append(name)
            return value <= limit

        return run

    grid = [2.0, 4.0, 8.0, 16.0]
    searches = [
        (largest_passing_value(grid, 2, 2), measure("baseline", 10)),
        (largest_passing_value(grid, 2, 2), measure("relay", 14)),
    ]
    assert interleave(searches) == [9.5, 13.4]
    assert order == ["baseline", "relay"] * 4
