"""Consume-bound leases: a pre-inferred HBM entry is held for its Rank until that Rank consumes it or the
lease's deadline passes, whichever comes first, and each lease ends exactly once.

Only leased entries are kept here, so the sweep that expires them never scans the whole cache.
"""

from __future__ import annotations

from collections.abc import Callable

from services.ranker import metrics
from services.ranker.cache_index import CacheEntry, Lease, PrefixKey


class Leases:
    def __init__(self, ttl_s: float, clock: Callable[[], float]) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._held: dict[PrefixKey, CacheEntry] = {}

    def __len__(self) -> int:
        return len(self._held)

    def grant(self, entry: CacheEntry, owner: str) -> None:
        """Leases (or renews the lease of) an entry held in HBM for `ttl_s` from now."""
        entry.lease = Lease(owner, self._clock() + self.ttl_s)
        self._held[entry.key] = entry
        metrics.LEASES_ACTIVE.set(len(self._held))

    def end(self, entry: CacheEntry) -> None:
        """Ends the entry's lease, if any: consumed, expired or removed."""
        if entry.lease is not None:
            entry.lease = None
            del self._held[entry.key]
            metrics.LEASES_ACTIVE.set(len(self._held))

    def expired(self) -> list[CacheEntry]:
        """Leased entries past their deadline that nobody pins (a pinned one expires when released)."""
        now = self._clock()
        return [e for e in self._held.values() if e.lease.deadline <= now and not e.pinned]
