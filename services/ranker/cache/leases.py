"""Consume-bound leases: a pre-inferred HBM entry is held for its Rank until that Rank consumes it or the
lease's deadline passes, whichever comes first, and each lease ends exactly once.

When a lease ends, the tokens its PreInfer computed were consumed or wasted (`LoadBook.relay_ended`).
Only leased entries are kept here, in the order their deadlines fall (every lease runs the same TTL from
when it was granted or renewed), so the sweep that expires them looks at the expired ones only, and the
leased bytes are a running sum: nothing per request scans the leases.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from services.ranker import metrics
from services.ranker.cache.index import CacheEntry, Lease, PrefixKey
from services.ranker.engine.load import LoadBook


class Leases:
    def __init__(self, ttl_s: float, clock: Callable[[], float], load: LoadBook) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._load = load
        # Soonest deadline first, with the HBM bytes each held when leased.
        self._held: OrderedDict[PrefixKey, tuple[CacheEntry, int]] = OrderedDict()
        self._bytes = 0
        metrics.LEASES_ACTIVE.set_function(self.__len__)

    def __len__(self) -> int:
        return len(self._held)

    def held_bytes(self) -> int:
        """HBM bytes of the leased entries."""
        return self._bytes

    def grant(self, entry: CacheEntry, owner: str) -> None:
        """Leases (or renews the lease of) an entry held in HBM for `ttl_s` from now."""
        entry.lease = Lease(owner, self._clock() + self.ttl_s)
        held = self._held.pop(entry.key, None)
        nbytes = entry.hbm.nbytes() if entry.hbm is not None else 0
        self._bytes += nbytes - (0 if held is None else held[1])
        self._held[entry.key] = (entry, nbytes)

    def end(self, entry: CacheEntry, consumed: bool = False) -> None:
        """Ends the entry's lease, if any: `consumed` by a Rank, or expired or removed."""
        if entry.lease is not None:
            entry.lease = None
            self._bytes -= self._held.pop(entry.key)[1]
            self._load.relay_ended(entry.relay_tokens, entry.relay_ms, consumed)
            entry.relay_tokens, entry.relay_ms = 0, 0.0

    def next_deadline(self) -> float | None:
        """The soonest deadline of a lease held now (None: none is)."""
        for entry, _ in self._held.values():
            return entry.lease.deadline
        return None

    def expired(self) -> list[CacheEntry]:
        """Leased entries past their deadline that nobody pins (a pinned one expires when released)."""
        now = self._clock()
        expired = []
        for entry, _ in self._held.values():
            if entry.lease.deadline > now:
                break
            if not entry.pinned:
                expired.append(entry)
        return expired
