"""Consume-bound leases: a pre-inferred HBM entry is held for its Rank until that Rank consumes it or the
lease's deadline passes, whichever comes first, and each lease ends exactly once.

When a lease ends, the tokens its PreInfer computed were consumed or wasted (`LoadBook.relay_ended`).
Only leased entries are kept here, so the sweep that expires them never scans the whole cache.
"""

from __future__ import annotations

from collections.abc import Callable

from services.ranker import metrics
from services.ranker.cache.index import CacheEntry, Lease, PrefixKey
from services.ranker.engine.load import LoadBook


class Leases:
    def __init__(self, ttl_s: float, clock: Callable[[], float], load: LoadBook) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._load = load
        self._held: dict[PrefixKey, CacheEntry] = {}

    def __len__(self) -> int:
        return len(self._held)

    def held_bytes(self) -> int:
        """HBM bytes of the leased entries."""
        return sum(entry.hbm.nbytes() for entry in self._held.values() if entry.hbm is not None)

    def grant(self, entry: CacheEntry, owner: str) -> None:
        """Leases (or renews the lease of) an entry held in HBM for `ttl_s` from now."""
        entry.lease = Lease(owner, self._clock() + self.ttl_s)
        self._held[entry.key] = entry
        metrics.LEASES_ACTIVE.set(len(self._held))

    def end(self, entry: CacheEntry, consumed: bool = False) -> None:
        """Ends the entry's lease, if any: `consumed` by a Rank, or expired or removed."""
        if entry.lease is not None:
            entry.lease = None
            del self._held[entry.key]
            metrics.LEASES_ACTIVE.set(len(self._held))
            self._load.relay_ended(entry.relay_tokens, entry.relay_ms, consumed)
            entry.relay_tokens, entry.relay_ms = 0, 0.0

    def expired(self) -> list[CacheEntry]:
        """Leased entries past their deadline that nobody pins (a pinned one expires when released)."""
        now = self._clock()
        return [e for e in self._held.values() if e.lease.deadline <= now and not e.pinned]
