"""Moves of prefix KV between the tiers: demotion HBM → DRAM (by a copy off the critical path),
eviction from either tier, and removal of an entry with every byte it holds.

HBM's eviction demotes; DRAM's eviction drops. Neither touches an entry that is pinned, leased, being
produced or already moving, so what a Rank holds is never moved under it. An entry reloaded from DRAM
and unchanged keeps its DRAM copy: demoting it again copies nothing (no redundant reload or copy). Every
byte is reserved in the target tier before a copy starts, so neither budget is ever exceeded; a copy
that comes out larger than reserved is dropped, never the budget.

With a host pool (an accelerator), the DRAM tier's budget stays the accounting authority and the pool's
slabs are the memory: a demotion evicts DRAM victims until both the tier has the bytes and the pool a
contiguous slab for them (the pool can be fragmented), else the entry is dropped. The slab is taken
before the copy is queued, and every DRAM copy that is dropped gives its slab back exactly once, after any
reload still reading it (`_drop_dram`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from relaygr.v1 import common_pb2
from services.ranker import metrics
from services.ranker.cache.index import CacheEntry, Index, PrefixKey
from services.ranker.cache.leases import Leases
from services.ranker.cache.productions import Productions
from services.ranker.cache.tiers import Tier
from services.ranker.device.copier import PoolExhausted, TierCopier
from services.ranker.device.host_pool import Slab
from services.ranker.engine.scheduler import Op, Priority, Scheduler
from services.ranker.model.family import ModelConfig

log = logging.getLogger(__name__)

Miss = common_pb2.MissReason


class TierMoves:
    def __init__(
        self,
        hbm: Tier,
        dram: Tier,
        copier: TierCopier,
        copy_worker: Scheduler,
        index: Index,
        leases: Leases,
        productions: Productions,
        preset: ModelConfig,
        clock: Callable[[], float],
    ) -> None:
        self.hbm = hbm
        self.dram = dram
        self.copier = copier
        self.copy_worker = copy_worker
        self.index = index
        self.leases = leases
        self.productions = productions
        self.clock = clock
        self.preset = preset
        # The tiers' bytes and entries, read when the metrics are scraped.
        for tier in (hbm, dram):
            metrics.KV_CACHE_BYTES.labels(tier.name).set_function(functools.partial(_used_bytes, tier))
            metrics.KV_CACHE_ENTRIES.labels(tier.name).set_function(tier.__len__)

    def dram_nbytes(self, events: int) -> int:
        """Bytes the DRAM copy of one user's prefix of `events` takes (in FP8, with its scales)."""
        p = self.preset
        return self.copier.dram_nbytes(
            (p.num_layers, 2, 1, p.num_heads, events * p.tokens_per_event, p.head_dim)
        )

    def remove(self, entry: CacheEntry, reason: str) -> None:
        key = entry.key
        if key in self.hbm and key not in self.productions:
            self.hbm.release(key)
            metrics.KV_CACHE_EVICTIONS.labels("hbm", reason).inc()
        if key in self.dram:  # a held copy, or the reservation of a copy in flight
            self.dram.release(key)
            metrics.KV_CACHE_EVICTIONS.labels("dram", reason).inc()
        self.leases.end(entry)
        self._drop_dram(entry)
        entry.hbm = None
        self.index.drop(entry)

    def demote_victim(self, key: PrefixKey) -> None:
        """HBM's eviction: demotes the entry unless it is pinned, leased, moving or being produced."""
        entry = self.index.get(key)
        if entry is None or entry.pinned or entry.lease is not None or entry.demoting:
            return
        if key not in self.productions:
            self.demote(entry, Miss.MISS_REASON_EVICTED_HBM)

    def _evict_dram_victim(self, key: PrefixKey) -> None:
        """DRAM's eviction: drops the DRAM copy unless the entry is pinned or being produced."""
        entry = self.index.get(key)
        if entry is not None and key not in self.productions and not entry.pinned:
            self.evict_dram(entry, "capacity")

    def evict_dram(self, entry: CacheEntry, reason: str) -> None:
        if entry.hbm is not None:  # keep the HBM copy; only the DRAM copy goes
            self.dram.release(entry.key)
            self._drop_dram(entry)
            metrics.KV_CACHE_EVICTIONS.labels("dram", reason).inc()
            return
        self.remove(entry, reason)
        self.index.tombstone(entry.key.user_id, Miss.MISS_REASON_EVICTED_DRAM)

    def demote(self, entry: CacheEntry, reason_if_dropped: int) -> None:
        """Moves an unleased, unpinned HBM entry to DRAM; drops it when DRAM cannot hold it."""
        if entry.demoting or entry.hbm is None:
            return
        if entry.dram is not None:  # reloaded and unchanged: its DRAM copy is still valid, copy nothing
            self.hbm.release(entry.key)
            entry.hbm = None
            self.dram.touch(entry.key, self.clock())
            return
        nbytes = self.dram_nbytes(entry.length)
        room, slab = self._room_in_dram(nbytes)
        if not room:
            self.remove(
                entry, "lease_expired" if reason_if_dropped == Miss.MISS_REASON_LEASE_EXPIRED else "no_dram"
            )
            self.index.tombstone(entry.key.user_id, reason_if_dropped)
            return
        self.dram.reserve(entry.key, nbytes, self.clock())
        entry.demoting = True
        device_copy = entry.hbm
        if self.copier.in_place:  # nothing to copy: done here (two thread wake-ups fewer)
            future = asyncio.get_running_loop().create_future()
            future.set_result(self.copier.to_dram(device_copy, slab))
            self._demoted(entry, future, slab)
            return
        future = self.copy_worker.submit(
            lambda: self.copier.to_dram(device_copy, slab), Priority.PRE_INFER, Op.DEMOTE
        )
        future.add_done_callback(lambda f: self._demoted(entry, f, slab))

    def _room_in_dram(self, nbytes: int) -> tuple[bool, Slab | None]:
        """Evicts DRAM victims until the tier has `nbytes` free and, with a host pool, a contiguous slab of
        them is taken: (whether there is room, that slab)."""
        if not self.dram.make_room(nbytes, self._evict_dram_victim):
            return False, None
        if not self.copier.copies:
            return True, None
        slab = self.copier.reserve(nbytes)
        if slab is not None:
            return True, slab
        for key in self.dram.victims():  # enough bytes, but not in one piece: free more
            self._evict_dram_victim(key)
            slab = self.copier.reserve(nbytes)
            if slab is not None:
                return True, slab
        return False, None

    def _drop_dram(self, entry: CacheEntry) -> None:
        """Forgets the entry's DRAM copy, giving its slab back (after any reload that reads it)."""
        if entry.dram is not None:
            self.copier.release(entry.dram)
            entry.dram = None

    def _demoted(self, entry: CacheEntry, future: asyncio.Future, slab: Slab | None) -> None:
        entry.demoting = False
        error = None if future.cancelled() else future.exception()
        copied = not future.cancelled() and error is None
        if future.cancelled():  # dropped unstarted: no copy holds the slab
            self.copier.discard(slab)
        if self.index.get(entry.key) is not entry:  # removed while copying; `_remove` freed its bytes
            if copied:
                self.copier.release(future.result())
            return
        if not copied:  # `to_dram` gave its slab back
            self.dram.release(entry.key)
            self.remove(entry, "no_dram" if isinstance(error, PoolExhausted) else "copy_failed")
            return
        dram_copy = future.result()
        if not self.dram.resize(entry.key, dram_copy.nbytes()):
            # Larger than reserved and DRAM cannot hold the difference: drop the copy, never the budget.
            log.error("DRAM copy of %s is %d bytes, more than reserved", entry.key, dram_copy.nbytes())
            self.dram.release(entry.key)
            self.copier.release(dram_copy)
            if not entry.pinned and entry.lease is None and entry.key not in self.productions:
                self.remove(entry, "no_dram")
                self.index.tombstone(entry.key.user_id, Miss.MISS_REASON_EVICTED_HBM)
            return
        entry.dram = dram_copy
        if not entry.pinned and entry.lease is None and entry.key not in self.productions:
            self.hbm.release(entry.key)
            entry.hbm = None


def _used_bytes(tier: Tier) -> int:
    return tier.used_bytes
