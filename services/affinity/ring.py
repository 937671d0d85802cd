"""Consistent hashing with bounded loads over stable member names.

Contract:
- `stable_hash` is the first 8 bytes of BLAKE2b read as a big-endian integer: the same in every process,
  Python version and platform (Python's `hash()` is salted per process and must never place a key).
- A member owns `virtual_nodes` points at `stable_hash(f"{name}#{i}")`; a key belongs to the member of
  the first point clockwise from `stable_hash(key)`. Points depend only on the member's name, so adding
  or removing one of N members moves only the keys of the arcs it gains or loses (about 1/N of them),
  and a member that leaves and comes back gets exactly its arcs back.
- Bounded load (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA 2018):
  with `total` requests in flight over `n` usable members, a member takes a new request only while its
  in-flight count is below `load_bound(total, n, factor)`; otherwise the key goes to the next distinct
  usable member clockwise. The walk order depends only on the key and the names, so the spill is
  deterministic. The loads sum to `total`, which is less than `factor * (total + 1)` for any
  factor >= 1, so some usable member is always below the bound and placement never fails. A `load_floor`
  raises the bound to at least that many requests, so that low load never spills.

Not thread-safe: the router uses one ring from one event loop.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import math
from collections.abc import Iterable, Iterator, Mapping


def stable_hash(text: str) -> int:
    """A 64-bit hash of `text` that is identical in every process and on every platform."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


# The router's defaults (services/router/config.py reads them from here, so the two cannot disagree).
VIRTUAL_NODES = 160
LOAD_FACTOR = 1.25
LOAD_FLOOR = 4


def load_bound(total_in_flight: int, members: int, factor: float, floor: int = LOAD_FLOOR) -> int:
    """The in-flight count at or above which a member takes no new request.

    `floor` keeps the bound from dropping to one or two requests at low load, where the pure formula
    would spill a user away from its cache for a single request in flight.
    """
    return max(floor, math.ceil(factor * (total_in_flight + 1) / members))


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the ring put a key: `member`, and whether bounded load moved it off its first usable member."""

    member: str
    spilled: bool


class AffinityRing:
    """A consistent-hash ring of member names with virtual nodes and bounded-load placement."""

    def __init__(
        self,
        members: Iterable[str] = (),
        virtual_nodes: int = VIRTUAL_NODES,
        load_factor: float = LOAD_FACTOR,
        load_floor: int = LOAD_FLOOR,
    ) -> None:
        if virtual_nodes <= 0:
            raise ValueError("virtual_nodes must be positive")
        if load_factor < 1.0:
            raise ValueError("load_factor must be at least 1.0")
        self.virtual_nodes = virtual_nodes
        self.load_factor = load_factor
        self.load_floor = load_floor
        self._members: set[str] = set()
        self._hashes: list[int] = []
        self._owners: list[str] = []
        for name in members:
            self.add(name)

    @property
    def members(self) -> frozenset[str]:
        return frozenset(self._members)

    def __contains__(self, name: object) -> bool:
        return name in self._members

    def __len__(self) -> int:
        return len(self._members)

    def add(self, name: str) -> None:
        if not name:
            raise ValueError("a member name must not be empty")
        if name not in self._members:
            self._members.add(name)
            self._rebuild()

    def remove(self, name: str) -> None:
        if name in self._members:
            self._members.remove(name)
            self._rebuild()

    def _rebuild(self) -> None:
        # Ties between points of two members (a 2^-64 event) are broken by name, so every process agrees.
        points = sorted(
            (stable_hash(f"{name}#{i}"), name) for name in self._members for i in range(self.virtual_nodes)
        )
        self._hashes = [h for h, _ in points]
        self._owners = [name for _, name in points]

    def walk(self, key: str) -> Iterator[str]:
        """Every member once, in clockwise order from the key's position; the first is the key's owner."""
        if not self._owners:
            return
        start = bisect.bisect_left(self._hashes, stable_hash(key))
        seen: set[str] = set()
        count = len(self._owners)
        for offset in range(count):
            name = self._owners[(start + offset) % count]
            if name not in seen:
                seen.add(name)
                yield name
                if len(seen) == len(self._members):
                    return

    def owner(self, key: str) -> str | None:
        return next(self.walk(key), None)

    def place(self, key: str, in_flight: Mapping[str, int]) -> Placement | None:
        """The member for `key` among the usable members: the ring members among the keys of `in_flight`,
        which maps each to its in-flight count. None when no member is usable.
        """
        loads = {name: count for name, count in in_flight.items() if name in self._members}
        if not loads:
            return None
        bound = load_bound(sum(loads.values()), len(loads), self.load_factor, self.load_floor)
        usable = (name for name in self.walk(key) if name in loads)
        first = next(usable)
        if loads[first] < bound:
            return Placement(first, spilled=False)
        # Some usable member is below the bound (see the module docstring), so this always finds one.
        return Placement(next(name for name in usable if loads[name] < bound), spilled=True)
