"""The arms' turn orders (`bench.lib.orders`): the Williams design, the blocks' random orders in whole
balanced sets, a fixed schedule's turns, and the checks of a run's orders."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.lib import orders


def _position_counts(rows: list[list[int]] | list[list[str]]) -> Counter:
    return Counter((position, item) for row in rows for position, item in enumerate(row))


def _neighbour_counts(rows: list[list[int]] | list[list[str]]) -> Counter:
    return Counter((a, b) for row in rows for a, b in pairwise(row))


@pytest.mark.parametrize("n", range(2, 10))
def test_williams_rows_balance_positions_and_neighbours(n: int):
    rows = orders.williams_rows(n)
    assert len(rows) == (n if n % 2 == 0 else 2 * n)
    assert all(sorted(row) == list(range(n)) for row in rows)
    positions = _position_counts(rows)
    assert set(positions) == {(p, t) for p in range(n) for t in range(n)}
    assert set(positions.values()) == {len(rows) // n}
    neighbours = _neighbour_counts(rows)
    assert set(neighbours) == {(a, b) for a in range(n) for b in range(n) if a != b}
    assert set(neighbours.values()) == {1 if n % 2 == 0 else 2}


def test_williams_rows_first_row_and_bad_sizes():
    assert orders.williams_rows(4) == [[0, 1, 3, 2], [1, 2, 0, 3], [2, 3, 1, 0], [3, 0, 2, 1]]
    assert orders.williams_rows(5)[0] == [0, 1, 4, 2, 3]
    assert orders.williams_rows(5)[5] == [3, 2, 4, 1, 0]  # the mirror image of the first row
    for n in (1, 0, -3):
        with pytest.raises(ValueError):
            orders.williams_rows(n)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 6), st.integers(1, 3), st.integers(0, 2**32 - 1))
def test_block_orders_balance_every_whole_set(arm_count: int, sets: int, seed: int):
    arms = [f"arm{i}" for i in range(arm_count)]
    size = arm_count if arm_count % 2 == 0 else 2 * arm_count
    design = orders.block_orders(arms, size * sets, seed)
    assert len(design) == size * sets
    assert design == orders.block_orders(arms, size * sets, seed)  # deterministic for a seed
    for start in range(0, len(design), size):
        chunk = design[start : start + size]
        assert all(sorted(order) == sorted(arms) for order in chunk)
        assert set(_position_counts(chunk).values()) == {size // arm_count}
        neighbours = _neighbour_counts(chunk)
        assert len(neighbours) == arm_count * (arm_count - 1)
        assert set(neighbours.values()) == {1 if arm_count % 2 == 0 else 2}
        assert orders.is_balanced(chunk)
    assert orders.is_balanced(design)


def test_block_orders_differ_across_seeds_and_sets():
    arms = ["baseline@1", "relay@2", "relay@2.5", "relay@3", "admit-all@3"]
    designs = {seed: orders.block_orders(arms, 20, seed) for seed in range(5)}
    assert len({str(value) for value in designs.values()}) == 5
    first, second = designs[0][:10], designs[0][10:]
    assert first != second  # each set has its own assignment and row order


def test_block_orders_refuse_a_partial_set():
    arms = ["a", "b", "c"]  # odd: a set is 6 blocks
    for blocks in (0, 5, 7, -6):
        with pytest.raises(ValueError, match=r"--blocks.*\b6\b"):
            orders.block_orders(arms, blocks, 0)
    with pytest.raises(ValueError, match=r"--blocks.*\b4\b"):
        orders.block_orders(["a", "b", "c", "d"], 6, 0)
    with pytest.raises(ValueError):
        orders.block_orders(["a", "a"], 2, 0)


def test_carryover_counts_and_a_broken_balance():
    design = orders.block_orders(["a", "b", "c", "d"], 8, seed=3)
    counts = orders.carryover_counts(design)
    assert len(counts) == 12 and set(counts.values()) == {2}
    assert orders.is_balanced(design)
    swapped = [list(order) for order in design]
    swapped[0][0], swapped[0][1] = swapped[0][1], swapped[0][0]
    assert not orders.is_balanced(swapped)
    assert orders.carryover_counts([["a", "b", "c"]]) == {
        ("a", "b"): 1,
        ("a", "c"): 0,
        ("b", "a"): 0,
        ("b", "c"): 1,
        ("c", "a"): 0,
        ("c", "b"): 0,
    }
    assert not orders.is_balanced([])
    assert not orders.is_balanced(design[:7])  # a set with a block dropped
    assert not orders.is_balanced([["a", "b"], ["a", "c"]])  # not the same arms


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_fixed_schedules_turns_are_williams_rows_balanced_over_each_whole_set(n: int):
    arms = [f"arm{i}" for i in range(n)]
    size = len(orders.williams_rows(n))
    turns = [orders.turn(arms, index) for index in range(3 * size)]
    assert turns[0] == [arms[t] for t in orders.williams_rows(n)[0]]
    assert turns[:size] == turns[size : 2 * size]  # the rows in turn, no randomness
    assert orders.is_balanced(turns[:size]) and orders.is_balanced(turns)
    assert orders.turn(["baseline", "relay"], 1) == ["relay", "baseline"]
