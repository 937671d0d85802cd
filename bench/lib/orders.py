"""The order in which a benchmark's arms take their turns, one module for every command that interleaves arms.

An arm could inherit something from the one before it (a warm cache, a backlog, the machine's drift).
`williams_rows` is a Williams design: every treatment takes every position equally often and follows every
other equally often. `block_orders` uses whole sets of such rows, each set with its own random assignment
of arms and its rows in random order (a partial set is refused: it breaks the balance); `turn` is one
block of a fixed schedule. `carryover_counts` and `is_balanced` check the orders of the blocks run.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Sequence


def williams_rows(n: int) -> list[list[int]]:
    """A Williams design for `n` treatments: `n` rows for an even n, `2n` (the rows and their mirror images)
    for an odd n. Each row is a permutation of range(n); every treatment takes every position equally often
    and every ordered pair of distinct treatments are neighbours equally often (once for an even n, twice
    for an odd n). The first row is 0, 1, n-1, 2, n-2, ...; row i adds i modulo n."""
    if n < 2:
        raise ValueError("a Williams design needs at least 2 treatments")
    first = [0]
    low, high = 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(t + i) % n for t in first] for i in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return rows


def block_orders(arms: Sequence[str], blocks: int, seed: int) -> list[list[str]]:
    """The run order of `arms` in each of `blocks` blocks: whole sets of Williams rows, each set with its own
    random assignment of arms to treatments and its rows in random order (random.Random(seed)). `blocks`
    must be a positive multiple of the set size (the number of rows of `williams_rows(len(arms))`)."""
    if len(set(arms)) != len(arms):
        raise ValueError("arms must be distinct")
    rows = williams_rows(len(arms))
    size = len(rows)
    if blocks < 1 or blocks % size:
        raise ValueError(
            f"--blocks must be a positive multiple of {size} (one balanced set of {len(arms)} arms is "
            f"{size} blocks), got {blocks}"
        )
    rng = random.Random(seed)
    orders: list[list[str]] = []
    for _ in range(blocks // size):
        assigned = list(arms)
        rng.shuffle(assigned)
        shuffled = [list(row) for row in rows]
        rng.shuffle(shuffled)
        orders += [[assigned[t] for t in row] for row in shuffled]
    return orders


def turn(arms: Sequence[str], index: int) -> list[str]:
    """The order of `arms` in block `index` of a fixed schedule: Williams row `index` (modulo the rows), so
    every whole set of consecutive blocks is balanced."""
    rows = williams_rows(len(arms))
    return [arms[t] for t in rows[index % len(rows)]]


def carryover_counts(orders: Sequence[Sequence[str]]) -> dict[tuple[str, str], int]:
    """How often arm b immediately follows arm a within a block, keyed (a, b), for every ordered pair of
    distinct arms that appear in `orders` (0 for a pair never seen)."""
    arms = sorted({arm for order in orders for arm in order})
    seen = Counter(pair for order in orders for pair in itertools.pairwise(order))
    return {(a, b): seen[(a, b)] for a in arms for b in arms if a != b}


def is_balanced(orders: Sequence[Sequence[str]]) -> bool:
    """Whether `orders` are balanced: each a permutation of the same arms, every arm in every position
    equally often and every ordered pair of distinct arms neighbours equally often. False for no orders."""
    if not orders:
        return False
    arms = sorted(orders[0])
    if len(set(arms)) != len(arms) or any(sorted(order) != arms for order in orders):
        return False
    positions = Counter((position, arm) for order in orders for position, arm in enumerate(order))
    if len(set(positions.values())) != 1 or len(positions) != len(arms) ** 2:
        return False
    return len(set(carryover_counts(orders).values())) <= 1
