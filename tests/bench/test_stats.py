"""The benchmark's statistics: nearest-rank percentiles, the SLO verdict and the grid search."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from bench.stats import interleave, largest_passing, meets_slo, percentile, violation_budget


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
