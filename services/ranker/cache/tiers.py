"""Byte-budgeted cache tiers and the DRAM eviction policies.

A tier is pure bookkeeping: which keys it holds, how many bytes each takes, and the budget those bytes
may never exceed. It does not know about tensors, leases or productions (see `prefix_cache`), so the
accounting is tested on its own. Not thread-safe: every tier is used from the ranker's event loop only.

Eviction policies decide *which* DRAM entries go when room is needed:
- `LruPolicy` (default): least recently used first. A user's next request comes soon after the last one
  or not at all, so recency is the best cheap predictor of reuse, and it is O(1) per operation.
- `SizeAwarePolicy`: among the least recently used half, largest first — frees room with fewer
  evictions when a long history must fit, at the price of favouring short histories.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Protocol

K = Hashable


class EvictionPolicy(Protocol):
    """Orders a tier's keys for eviction. The tier tells it about every insert, use and removal."""

    def insert(self, key: K, nbytes: int) -> None: ...
    def touch(self, key: K) -> None: ...
    def remove(self, key: K) -> None: ...
    def victims(self) -> Iterator[K]:
        """Keys in the order they should be evicted (the tier may skip some, e.g. pinned ones)."""
        ...


class LruPolicy:
    def __init__(self) -> None:
        self._order: OrderedDict[K, int] = OrderedDict()

    def insert(self, key: K, nbytes: int) -> None:
        self._order[key] = nbytes
        self._order.move_to_end(key)

    def touch(self, key: K) -> None:
        self._order.move_to_end(key)

    def remove(self, key: K) -> None:
        self._order.pop(key, None)

    def victims(self) -> Iterator[K]:
        """Least recently used first, read as eviction goes: each key is the oldest one not offered yet, so
        the keys evicted meanwhile cost nothing and a full tier is not copied for every eviction."""
        offered: set[K] = set()
        while True:
            key = next((k for k in self._order if k not in offered), None)
            if key is None:
                return
            offered.add(key)
            yield key


class SizeAwarePolicy(LruPolicy):
    def victims(self) -> Iterator[K]:
        keys = list(self._order)
        old_half = keys[: max(1, (len(keys) + 1) // 2)]
        largest_first = sorted(old_half, key=lambda k: self._order[k], reverse=True)
        return iter(largest_first + keys[len(old_half) :])


POLICIES: dict[str, Callable[[], EvictionPolicy]] = {"lru": LruPolicy, "size": SizeAwarePolicy}


class Tier:
    """A byte budget over a set of keys. `reserve` never lets the held bytes exceed the budget."""

    def __init__(self, name: str, budget_bytes: int, policy: EvictionPolicy | None = None) -> None:
        self.name = name
        self.budget_bytes = budget_bytes
        self.policy = policy or LruPolicy()
        self._sizes: dict[K, int] = {}
        self._last_used: OrderedDict[K, float] = OrderedDict()  # least recently used first
        self.used_bytes = 0

    def __contains__(self, key: K) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def free_bytes(self) -> int:
        return self.budget_bytes - self.used_bytes

    def fits(self, nbytes: int) -> bool:
        return nbytes <= self.free_bytes()

    def reserve(self, key: K, nbytes: int, now: float | None = None) -> bool:
        """Accounts `nbytes` to `key` if they fit; False (and no change) otherwise."""
        if key in self._sizes:
            raise KeyError(f"{key!r} already holds bytes in the {self.name} tier")
        if not self.fits(nbytes):
            return False
        self._sizes[key] = nbytes
        self._last_used[key] = time.monotonic() if now is None else now
        self.used_bytes += nbytes
        self.policy.insert(key, nbytes)
        return True

    def resize(self, key: K, nbytes: int) -> bool:
        """Changes a reservation to the exact size produced; False if growing would exceed the budget."""
        delta = nbytes - self._sizes[key]
        if delta > self.free_bytes():
            return False
        self._sizes[key] = nbytes
        self.used_bytes += delta
        self.policy.remove(key)
        self.policy.insert(key, nbytes)
        return True

    def touch(self, key: K, now: float | None = None) -> None:
        self._last_used[key] = time.monotonic() if now is None else now
        self._last_used.move_to_end(key)
        self.policy.touch(key)

    def release(self, key: K) -> int:
        nbytes = self._sizes.pop(key)
        del self._last_used[key]
        self.used_bytes -= nbytes
        self.policy.remove(key)
        return nbytes

    def last_used(self, key: K) -> float:
        return self._last_used[key]

    def oldest_use(self) -> float | None:
        """When the least recently used key was last used (None: the tier is empty)."""
        for last_used in self._last_used.values():
            return last_used
        return None

    def idle_keys(self, older_than: float) -> list[K]:
        """Keys last used before `older_than`, oldest first; stops at the first newer one."""
        idle = []
        for key, last_used in self._last_used.items():
            if last_used >= older_than:
                break
            idle.append(key)
        return idle

    def victims(self) -> Iterator[K]:
        return self.policy.victims()

    def make_room(self, nbytes: int, evict: Callable[[K], None]) -> bool:
        """Evicts in the policy's order until `nbytes` fit; True when they do. `evict(key)` frees what it
        can of a key (it may keep a key that is in use, or free its bytes only later)."""
        if nbytes > self.budget_bytes:
            return False
        for key in self.victims():
            if self.fits(nbytes):
                break
            evict(key)
        return self.fits(nbytes)
