"""What the benchmark's users look like: who sends each request, and the user universes the stub serves.

`RevisitSampler` names the user of request i: with probability `revisit_probability` the user of a request
drawn uniformly from those of the last `window_s` seconds (at the offered rate, the last rate·window_s),
otherwise a new user, so about that share of requests revisit a user within `window_s` (the DRAM tier and
prefix extension serve such returns); users with more requests come back more often (sessions). Users are
named `<namespace>-<n>`: one namespace per load point keeps points off each other's caches, and equal
namespaces give both modes the same users. `Population` is a closed population instead.

`fixed_length_universe` starts every user at exactly L long-term events (the length sweep), with
`growth_headroom` events of room so that a returning user's history grows by appending (its cached prefix
is extended) instead of sliding; `mix_universe` draws lognormal lengths capped at a maximum, as production
caps sequences.
"""

from __future__ import annotations

import dataclasses

import numpy as np


class RevisitSampler:
    """The user of each request of one load point; deterministic in (seed, namespace, rate)."""

    def __init__(
        self, namespace: str, rate: float, revisit_probability: float, window_s: float, seed: int
    ) -> None:
        if not 0 <= revisit_probability < 1:
            raise ValueError("revisit_probability must be in [0, 1)")
        if not rate > 0 or not window_s > 0:
            raise ValueError("rate and window_s must be positive")
        self.namespace = namespace
        self.revisit_probability = revisit_probability
        self.window_requests = max(1, round(rate * window_s))
        # The namespace's bytes join the seed: each point gets its own draws, equal in both modes.
        self._rng = np.random.default_rng([seed, *namespace.encode()])
        self._users: list[str] = []
        self._new_users = 0

    def user(self, index: int) -> str:
        """The user of request `index` (requests may be asked for in any order)."""
        while len(self._users) <= index:
            self._users.append(self._draw(len(self._users)))
        return self._users[index]

    def _draw(self, index: int) -> str:
        if index > 0 and self._rng.random() < self.revisit_probability:
            return self._users[int(self._rng.integers(max(0, index - self.window_requests), index))]
        self._new_users += 1
        return f"{self.namespace}-{self._new_users}"


class Population:
    """A closed population of `size` users: requests 0 … size-1 are each user's first visit, in turn, and
    every later request is a user drawn uniformly, a return. Deterministic in (seed, namespace); the same
    `user(index)` interface as `RevisitSampler`."""

    def __init__(self, namespace: str, size: int, seed: int) -> None:
        if size < 1:
            raise ValueError("a population needs at least one user")
        self.namespace = namespace
        self.size = size
        self._rng = np.random.default_rng([seed, *namespace.encode()])
        self._users: list[str] = []

    def user(self, index: int) -> str:
        while len(self._users) <= index:
            n = len(self._users)
            member = n if n < self.size else int(self._rng.integers(self.size))
            self._users.append(f"{self.namespace}-{member}")
        return self._users[index]


@dataclasses.dataclass(frozen=True)
class Universe:
    """A retrieval-stub user universe: its label, its stub flags, and its longest long-term history."""

    label: str
    stub_args: tuple[str, ...]
    max_long_term: int


def fixed_length_universe(long_term: int, short_term: int, growth_headroom: int, seed: int) -> Universe:
    """Every user starts with exactly `long_term` long-term events (plus `short_term` recent ones)."""
    history = long_term + short_term
    args = (
        "--universe-seed", str(seed), "--history-distribution", "fixed",
        "--short-term-length", str(short_term), "--history-min", str(short_term + 1),
        "--history-median", str(history), "--history-max", str(history + growth_headroom),
    )  # fmt: skip
    return Universe(f"L{long_term}", args, long_term + growth_headroom)


def mix_universe(median: int, sigma: float, maximum: int, short_term: int, seed: int) -> Universe:
    """Long-term lengths lognormal around `median`, capped at `maximum` (as production caps them: a capped
    history slides when it grows)."""
    args = (
        "--universe-seed", str(seed), "--history-distribution", "lognormal",
        "--short-term-length", str(short_term), "--history-min", str(short_term + 16),
        "--history-median", str(median + short_term), "--history-sigma", str(sigma),
        "--history-max", str(maximum + short_term),
    )  # fmt: skip
    return Universe(f"mix-m{median}-s{sigma:g}-max{maximum}", args, maximum)
