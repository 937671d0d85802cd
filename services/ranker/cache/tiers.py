"""Byte-budgeted cache tiers and the DRAM eviction policies.

A tier is pure bookkeeping: which keys it holds, how many bytes each takes, the budget those bytes may
never exceed, and when each key was last used. It does not know about tensors, leases or productions (see
`prefix_cache`), so the accounting is tested on its own. Not thread-safe: every tier is used from the
ranker's event loop only.

A tier keeps its keys in the order of their last use (`Recency`), oldest first, on one clock: a use is
stamped with the time it happened, which is the time it is recorded for the tier's own uses (O(1): it goes
last) and earlier for an entry handed off from a peer, stamped with its last use there (placed by
bisection). Walks of that order (eviction, the TTL sweep) read it as they go, so keys evicted meanwhile
cost nothing and a full tier is never copied or rescanned for each eviction.

Eviction policies decide *which* DRAM entries go when room is needed, from that order:
- `LruPolicy` (default): least recently used first. A user's next request comes soon after the last one
  or not at all, so recency is the best cheap predictor of reuse.
- `SizeAwarePolicy`: among the least recently used half, largest first — frees room with fewer
  evictions when a long history must fit, at the price of favouring short histories.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Protocol

K = Hashable


class Recency:
    """Keys in the order of their last use, oldest first; keys used at the same time in the order their
    uses were recorded.

    One sorted list of `(used_at, seq, key)`: a use at or after the newest one is appended, an earlier
    one inserted where it belongs. A key's earlier items stay in the list, dead (its live item is the one
    whose `seq` the key maps to), and are dropped when they outnumber the live ones, so every operation is
    O(1) amortised but an earlier-stamped use (a bisection, then a move of the items after it)."""

    def __init__(self) -> None:
        self._stamps: dict[K, tuple[float, int]] = {}
        self._items: list[tuple[float, int, K]] = []
        self._head = 0  # every item before it is dead
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._stamps)

    def __contains__(self, key: K) -> bool:
        return key in self._stamps

    def place(self, key: K, used_at: float) -> None:
        """Records a use of `key` at `used_at` (its earlier use, if any, is forgotten)."""
        if used_at != used_at:  # NaN: no place in the order
            raise ValueError(f"{key!r}: a use at NaN")
        seq = next(self._seq)
        self._stamps[key] = (used_at, seq)
        items = self._items
        if not items or items[-1][0] <= used_at:
            items.append((used_at, seq, key))
        else:  # (used_at, seq) are unique: keys are never compared
            at = bisect.bisect_right(items, (used_at, seq))
            items.insert(at, (used_at, seq, key))
            self._head = min(self._head, at)
        self._compact()

    def forget(self, key: K) -> None:
        del self._stamps[key]
        self._compact()

    def last_used(self, key: K) -> float:
        return self._stamps[key][0]

    def oldest(self) -> float | None:
        """When the least recently used key was last used (None: no key)."""
        items, stamps = self._items, self._stamps
        while self._head < len(items):
            used_at, seq, key = items[self._head]
            if stamps.get(key, (0.0, -1))[1] == seq:
                return used_at
            self._head += 1
        return None

    def walk(self) -> Iterator[tuple[K, float]]:
        """(key, last use), oldest first, read as the walk goes: a key forgotten meanwhile is not yielded, one
        used again is yielded at its new place (if the walk gets there), and a use placed behind the walk's
        position is not yielded."""
        self.oldest()  # skips the dead items at the front once, for this walk and the next ones
        items, at, last = self._items, self._head, None
        while True:
            if self._items is not items or (last is not None and items[at - 1] is not last):
                # changed under the walk (compacted, or a use placed before its position): find its place
                items = self._items
                at = 0 if last is None else bisect.bisect_left(items, (last[0], last[1] + 1))
            if at >= len(items):
                return
            item = last = items[at]
            at += 1
            used_at, seq, key = item
            if self._stamps.get(key, (0.0, -1))[1] == seq:
                yield key, used_at

    def _compact(self) -> None:
        if len(self._items) > 2 * len(self._stamps) + 64:
            stamps = self._stamps
            self._items = [item for item in self._items if stamps.get(item[2], (0.0, -1))[1] == item[1]]
            self._head = 0


class EvictionPolicy(Protocol):
    """Orders a tier's keys for eviction, from their order of last use and their sizes."""

    def victims(self, recency: Recency, sizes: Mapping[K, int]) -> Iterator[K]:
        """Keys in the order they should be evicted (the tier may skip some, e.g. pinned ones)."""
        ...


class LruPolicy:
    def victims(self, recency: Recency, sizes: Mapping[K, int]) -> Iterator[K]:
        """Least recently used first, read as eviction goes (`Recency.walk`)."""
        return (key for key, _ in recency.walk())


class SizeAwarePolicy:
    def victims(self, recency: Recency, sizes: Mapping[K, int]) -> Iterator[K]:
        keys = [key for key, _ in recency.walk()]
        old_half = keys[: max(1, (len(keys) + 1) // 2)]
        largest_first = sorted(old_half, key=lambda k: sizes[k], reverse=True)
        return iter(largest_first + keys[len(old_half) :])


POLICIES: dict[str, Callable[[], EvictionPolicy]] = {"lru": LruPolicy, "size": SizeAwarePolicy}


class Tier:
    """A byte budget over a set of keys. `reserve` never lets the held bytes exceed the budget."""

    def __init__(self, name: str, budget_bytes: int, policy: EvictionPolicy | None = None) -> None:
        self.name = name
        self.budget_bytes = budget_bytes
        self.policy = policy or LruPolicy()
        self._sizes: dict[K, int] = {}
        self._recency = Recency()
        self.used_bytes = 0

    def __contains__(self, key: K) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def free_bytes(self) -> int:
        return self.budget_bytes - self.used_bytes

    def fits(self, nbytes: int) -> bool:
        return nbytes <= self.free_bytes()

    def size(self, key: K) -> int:
        return self._sizes[key]

    def reserve(self, key: K, nbytes: int, now: float | None = None) -> bool:
        """Accounts `nbytes` to `key` if they fit, last used at `now` (default: the monotonic clock's
        now); False (and no change) otherwise."""
        if key in self._sizes:
            raise KeyError(f"{key!r} already holds bytes in the {self.name} tier")
        if not self.fits(nbytes):
            return False
        self._sizes[key] = nbytes
        self._recency.place(key, time.monotonic() if now is None else now)
        self.used_bytes += nbytes
        return True

    def resize(self, key: K, nbytes: int) -> bool:
        """Changes a reservation to the exact size produced; False if growing would exceed the budget."""
        delta = nbytes - self._sizes[key]
        if delta > self.free_bytes():
            return False
        self._sizes[key] = nbytes
        self.used_bytes += delta
        return True

    def touch(self, key: K, now: float | None = None) -> None:
        self._recency.place(key, time.monotonic() if now is None else now)

    def release(self, key: K) -> int:
        nbytes = self._sizes.pop(key)
        self._recency.forget(key)
        self.used_bytes -= nbytes
        return nbytes

    def last_used(self, key: K) -> float:
        return self._recency.last_used(key)

    def oldest_use(self) -> float | None:
        """When the least recently used key was last used (None: the tier is empty)."""
        return self._recency.oldest()

    def by_last_use(self) -> Iterator[tuple[K, float]]:
        """(key, last use), least recently used first, read as the walk goes (`Recency.walk`): a caller
        that stops at the first key used after some time visits only the keys used before it, and one."""
        return self._recency.walk()

    def idle_keys(self, older_than: float) -> list[K]:
        """Keys last used before `older_than`, oldest first; stops at the first newer one."""
        idle = []
        for key, last_used in self._recency.walk():
            if last_used >= older_than:
                break
            idle.append(key)
        return idle

    def victims(self) -> Iterator[K]:
        return self.policy.victims(self._recency, self._sizes)

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
