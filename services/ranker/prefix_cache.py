"""The prefix-KV cache of one ranker: two byte-budgeted tiers, leases, single-flight productions.

Lifecycle of an entry (brief §5):

    PreInfer ─▶ PRODUCING ─▶ HBM, leased until a Rank consumes it or the lease expires
                   ▲                 │ consumed / expired
                   │ reload          ▼
                   └──────────── DRAM (LRU + TTL) ──▶ evicted

Keys are (user id, fingerprint of the long-term events, model version): a Rank whose long-term events
differ from a cached entry's never uses it, except that an entry whose events are a strict prefix of the
Rank's is *extended* with the appended events. One production per key runs at a time (a compute, a
reload or an extension); every PreInfer or Rank for that key joins it, and a joiner's cancellation never
cancels the shared work. HBM bytes are reserved before a production starts, so neither budget is ever
exceeded: when HBM cannot hold a prefix, PreInfer is refused and Rank computes without caching.

Not thread-safe by design: every method runs on the ranker's event loop; only model work and copies
run on their own threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import time
from collections.abc import Callable

from relaygr.v1 import common_pb2, ranker_pb2
from services.common import metrics
from services.common.errors import DeadlineExceeded
from services.ranker.cache_index import CacheEntry, Index, Pin, PrefixKey
from services.ranker.device import TierCopier
from services.ranker.events import Events
from services.ranker.leases import Leases
from services.ranker.runner import ModelRunner
from services.ranker.scheduler import Op, Priority, Scheduler
from services.ranker.tiers import Tier

log = logging.getLogger(__name__)

Miss = common_pb2.MissReason
Outcome = ranker_pb2.PreInferOutcome


class OverBudget(Exception):
    """A production's KV came out larger than the HBM bytes reserved for it, and the tier cannot hold the
    difference: the entry is refused rather than let the budget be exceeded."""


class Source(enum.Enum):
    HBM = common_pb2.CACHE_SOURCE_HBM
    DRAM = common_pb2.CACHE_SOURCE_DRAM
    EXTENDED = common_pb2.CACHE_SOURCE_EXTENDED
    MISS = common_pb2.CACHE_SOURCE_MISS

    @property
    def label(self) -> str:
        return self.name.lower()


class Kind(enum.Enum):
    COMPUTE = "compute"
    RELOAD = "reload"
    EXTEND = "extend"


@dataclasses.dataclass(eq=False)
class Production:
    kind: Kind
    for_rank: bool
    task: asyncio.Task
    priority: Priority
    # The device job computing it, once submitted: a Rank that joins promotes it to rank priority.
    job: asyncio.Future | None = None
    # Lease the entry when done: a PreInfer started or joined this production.
    lease: bool = False
    # Why the Rank that started a compute missed; Ranks that join it share the reason.
    miss_reason: int = Miss.MISS_REASON_UNSPECIFIED
    # Ranks awaiting it; when it completes, it pins the entry once for each, and each takes its pin.
    waiters: int = 0
    handed: list[Pin] = dataclasses.field(default_factory=list)
    # The pin that holds the entry it reloads or extends, until it is done.
    base_pin: Pin | None = None


@dataclasses.dataclass(frozen=True)
class Acquired:
    """What a Rank ranks against: a pinned entry, or nothing (compute the whole sequence)."""

    entry: CacheEntry | None
    source: Source
    miss_reason: int = Miss.MISS_REASON_UNSPECIFIED
    pin: Pin | None = None


class PrefixCache:
    def __init__(
        self,
        runner: ModelRunner,
        copier: TierCopier,
        copy_worker: Scheduler,
        hbm: Tier,
        dram: Tier,
        lease_ttl_s: float,
        dram_ttl_s: float,
        instance: str,
        max_pending_pre_infer: int,
        max_tombstones: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runner = runner
        self.copier = copier
        self.copy_worker = copy_worker
        self.hbm = hbm
        self.dram = dram
        self.leases = Leases(lease_ttl_s, clock)
        self.dram_ttl_s = dram_ttl_s
        self.max_pending_pre_infer = max_pending_pre_infer
        self.clock = clock
        self.bytes_per_token = runner.kv_bytes_per_token
        self.dram_bytes_per_token = (
            self.bytes_per_token * copier.dram_dtype.itemsize // copier.compute_dtype.itemsize
        )
        self.index = Index(instance, max_tombstones)
        self.productions: dict[PrefixKey, Production] = {}
        self.accepting = True
        metrics.KV_CACHE_CAPACITY_BYTES.labels("hbm").set(hbm.budget_bytes)
        metrics.KV_CACHE_CAPACITY_BYTES.labels("dram").set(dram.budget_bytes)
        self._publish()

    # ---- public API ----

    @property
    def entries(self) -> dict[PrefixKey, CacheEntry]:
        return self.index.entries

    def pins(self) -> list[Pin]:
        """Every pin held now, with its owner and age: after traffic has settled, none (a leak if any)."""
        return [pin for entry in self.index for pin in entry.pins]

    def key(self, user_id: str, events: Events) -> PrefixKey:
        return PrefixKey(user_id, events.fingerprint, self.runner.model_version)

    async def pre_infer(self, user_id: str, events: Events) -> tuple[int, int]:
        """Starts (or joins, or renews) the production of `events`' prefix KV: (outcome, HBM bytes)."""
        self.sweep()
        key = self.key(user_id, events)
        nbytes = len(events) * self.bytes_per_token
        production = self.productions.get(key)
        if production is not None:
            # Joining: the entry is leased when the shared production completes.
            production.lease = True
            return Outcome.PRE_INFER_OUTCOME_ACCEPTED, nbytes
        entry = self.index.get(key)
        if entry is not None and entry.hbm is not None:
            self._lease(key, user_id)
            return Outcome.PRE_INFER_OUTCOME_ALREADY_CACHED, nbytes
        if not self.accepting or self._pending_pre_infer() >= self.max_pending_pre_infer:
            return Outcome.PRE_INFER_OUTCOME_REJECTED_OVERLOAD, 0
        if entry is not None:  # in DRAM only: reload, off the ranking's critical path
            started = self._start(key, events, Kind.RELOAD, Priority.RELOAD, for_rank=False, base=entry)
            outcome = Outcome.PRE_INFER_OUTCOME_RELOADED
        else:
            base = self._extension_base(user_id, events)
            kind = Kind.COMPUTE if base is None else Kind.EXTEND
            started = self._start(key, events, kind, Priority.PRE_INFER, for_rank=False, base=base)
            outcome = Outcome.PRE_INFER_OUTCOME_ACCEPTED
        if started is None:
            self.index.tombstone(user_id, Miss.MISS_REASON_REJECTED_CAPACITY)
            return Outcome.PRE_INFER_OUTCOME_REJECTED_CAPACITY, 0
        return outcome, nbytes

    async def acquire(
        self, user_id: str, events: Events, relay_instance: str, deadline: float | None = None
    ) -> Acquired:
        """The prefix a Rank of `events` ranks against, pinned until `release`. Never raises for the cache's
        sake: when no prefix can be held, the result has no entry and the Rank computes in full. A production
        this Rank starts carries its `deadline` (`time.monotonic()`): once the Rank has given up, the device
        drops the production unstarted, and any joiner computes on its own."""
        self.sweep()
        key = self.key(user_id, events)
        entry = self.index.get(key)
        if entry is not None and entry.hbm is not None and key not in self.productions:
            self.leases.end(entry)  # consumed
            return Acquired(entry, Source.HBM, pin=entry.pin("rank"))
        production = self.productions.get(key)
        if production is not None:
            metrics.PRODUCTION_JOINS.inc()
            self._promote(production)
            return await self._join(production, key)
        miss_reason = self._miss_reason(user_id, events, relay_instance)
        if entry is not None:
            production = self._start(
                key, events, Kind.RELOAD, Priority.RANK, for_rank=True, base=entry, deadline=deadline
            )
        else:
            base = self._extension_base(user_id, events)
            kind = Kind.COMPUTE if base is None else Kind.EXTEND
            production = self._start(
                key, events, kind, Priority.RANK, for_rank=True, base=base, deadline=deadline
            )
        if production is None:
            return Acquired(None, Source.MISS, miss_reason)
        production.miss_reason = miss_reason
        return await self._join(production, key)

    def release(self, acquired: Acquired) -> None:
        if acquired.pin is None:
            return
        entry = acquired.pin.release()
        if entry is not None and not entry.pinned and entry.lease is None and self.index.holds(entry):
            self._demote(entry, Miss.MISS_REASON_EVICTED_HBM)
        self._publish()

    def sweep(self) -> None:
        """Releases expired leases (exactly once each) and DRAM entries idle past their TTL."""
        now = self.clock()
        for entry in self.leases.expired():
            self.leases.end(entry)
            metrics.LEASE_EXPIRATIONS.inc()
            self._demote(entry, Miss.MISS_REASON_LEASE_EXPIRED)
        for key in self.dram.idle_keys(older_than=now - self.dram_ttl_s):
            entry = self.index.get(key)
            if entry is not None and entry.hbm is None and key not in self.productions:
                self._evict_dram(entry, "ttl")
        self._publish()

    def leased(self) -> int:
        return len(self.leases)

    async def close(self) -> None:
        for production in list(self.productions.values()):
            production.task.cancel()
        for production in list(self.productions.values()):
            with contextlib.suppress(BaseException):
                await production.task

    # ---- productions ----

    def _pending_pre_infer(self) -> int:
        return sum(1 for p in self.productions.values() if not p.for_rank)

    @staticmethod
    def _source_of(production: Production) -> Source:
        if production.kind is Kind.RELOAD:
            return Source.DRAM
        if production.kind is Kind.EXTEND:
            return Source.EXTENDED
        return Source.MISS if production.for_rank else Source.HBM

    def _start(
        self,
        key: PrefixKey,
        events: Events,
        kind: Kind,
        priority: Priority,
        for_rank: bool,
        base: CacheEntry | None,
        deadline: float | None = None,
    ) -> Production | None:
        """Reserves HBM for the production and starts it; None when HBM cannot hold it."""
        need = len(events) * self.bytes_per_token
        if kind is Kind.EXTEND and base.hbm is None:
            need += base.length * self.bytes_per_token  # the base's transient device copy
        if not self.hbm.make_room(need, self._demote_victim):
            return None
        self.hbm.reserve(key, need, self.clock())
        base_pin = None if base is None else base.pin(f"{kind.value} of {key.user_id}")
        task = asyncio.get_running_loop().create_task(
            self._produce(key, events, kind, priority, base, base_pin, deadline)
        )
        # Its waiters may all be gone (cancelled) when it fails: mark the failure seen, or asyncio logs it.
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
        production = Production(kind, for_rank, task, priority, lease=not for_rank, base_pin=base_pin)
        self.productions[key] = production
        metrics.PRODUCTIONS.labels(kind.value).inc()
        self._publish()
        return production

    async def _produce(
        self,
        key: PrefixKey,
        events: Events,
        kind: Kind,
        priority: Priority,
        base: CacheEntry | None,
        base_pin: Pin | None,
        deadline: float | None,
    ) -> CacheEntry:
        try:
            base_kv = None
            reloaded = False
            if base is not None:
                base_kv = base.hbm
                reloaded = base_kv is None
                if reloaded:
                    dram_copy = base.dram
                    base_kv = await self.copy_worker.submit(
                        lambda: self.copier.to_hbm(dram_copy), priority, Op.RELOAD, deadline
                    )
            if kind is Kind.RELOAD:
                kv = base_kv
            elif kind is Kind.EXTEND:
                production = self.productions[key]
                production.job = self.runner.extend(
                    base_kv, events.suffix(base.length), production.priority, deadline
                )
                kv = await production.job
            else:
                production = self.productions[key]
                production.job = self.runner.pre_infer(events, production.priority, deadline)
                kv = await production.job
        except BaseException:
            self.hbm.release(key)
            del self.productions[key]
            self._unpin_base(base_pin, superseded=False)
            self._publish()
            raise
        production = self.productions.pop(key)
        if not self.hbm.resize(key, kv.nbytes()):
            log.error("prefix KV of %s is %d bytes, more than reserved; HBM cannot hold it", key, kv.nbytes())
            self.hbm.release(key)
            self._unpin_base(base_pin, superseded=False)
            self.index.tombstone(key.user_id, Miss.MISS_REASON_REJECTED_CAPACITY)
            self._publish()
            raise OverBudget(f"{kv.nbytes()} bytes do not fit in the HBM tier")
        entry = base if kind is Kind.RELOAD else CacheEntry(key, events)
        if base is not None:  # reloaded, or extended from a base: lossy if that KV came from a lossy copy
            entry.lossy = base.lossy or (reloaded and self.copier.lossy)
        entry.hbm = kv
        production.handed = [entry.pin("rank") for _ in range(production.waiters)]
        if kind is not Kind.RELOAD:
            self.index.insert(entry)
        if production.lease:
            self._lease(key, key.user_id)
        self._unpin_base(base_pin, superseded=kind is Kind.EXTEND)
        self._publish()
        return entry

    def _promote(self, production: Production) -> None:
        """A Rank waits on this production now: it must not wait behind the Ranks that arrive after it."""
        if production.priority > Priority.RANK:
            production.priority = Priority.RANK
            if production.job is not None:
                self.runner.worker.promote(production.job, Priority.RANK)

    def _unpin_base(self, base_pin: Pin | None, superseded: bool) -> None:
        base = None if base_pin is None else base_pin.release()
        if base is None:
            return
        if superseded and not base.pinned and base.lease is None and self.index.holds(base):
            self._remove(base, "superseded")

    async def _join(self, production: Production, key: PrefixKey) -> Acquired:
        """Waits for a shared production. The production pins the entry for every waiter when it completes,
        so nothing can demote it before they resume; a waiter cancelled after that gives its pin back."""
        source = self._source_of(production)
        miss_reason = production.miss_reason if source is Source.MISS else Miss.MISS_REASON_UNSPECIFIED
        production.waiters += 1
        try:
            entry = await asyncio.shield(production.task)
        except asyncio.CancelledError:
            task = production.task
            if task.done() and not task.cancelled() and task.exception() is None:
                self.release(Acquired(task.result(), source, pin=production.handed.pop()))
            else:
                production.waiters -= 1
            raise
        except OverBudget:  # produced, but HBM could not hold it: this Rank computes without caching
            return Acquired(None, Source.MISS, Miss.MISS_REASON_REJECTED_CAPACITY)
        except DeadlineExceeded:  # the Rank that started it gave up: this one computes on its own, in time
            return Acquired(None, Source.MISS, miss_reason or Miss.MISS_REASON_COLD)
        except Exception:  # the shared production failed: this Rank computes on its own
            log.warning("production of %s failed", key, exc_info=True)
            return Acquired(None, Source.MISS, miss_reason or Miss.MISS_REASON_COLD)
        self.leases.end(entry)  # a pre-infer leased it: this Rank consumes the lease
        return Acquired(entry, source, miss_reason, pin=production.handed.pop())

    def _lease(self, key: PrefixKey, owner: str) -> None:
        entry = self.index.get(key)
        if entry is None or entry.hbm is None:
            return
        self.leases.grant(entry, owner)
        self._publish()

    # ---- lookups ----

    def _extension_base(self, user_id: str, events: Events) -> CacheEntry | None:
        """The longest cached entry of this user whose events are a strict prefix of `events`."""
        return self.index.extension_base(
            user_id, events, busy=lambda entry: entry.key in self.productions or entry.demoting
        )

    def _miss_reason(self, user_id: str, events: Events, relay_instance: str) -> int:
        """Why this Rank found no prefix; stale entries of the user that nothing holds go on the way."""
        if relay_instance and relay_instance != self.index.instance:
            return self.index.miss_reason(user_id, relay_instance, stale=False)
        stale = self.index.stale(user_id, events)
        for entry in stale:
            if not entry.pinned and entry.lease is None and entry.key not in self.productions:
                self._remove(entry, "stale")
        return self.index.miss_reason(user_id, relay_instance, stale=bool(stale))

    # ---- tier moves ----

    def _remove(self, entry: CacheEntry, reason: str) -> None:
        key = entry.key
        if key in self.hbm and key not in self.productions:
            self.hbm.release(key)
            metrics.KV_CACHE_EVICTIONS.labels("hbm", reason).inc()
        if key in self.dram:  # a held copy, or the reservation of a copy in flight
            self.dram.release(key)
            metrics.KV_CACHE_EVICTIONS.labels("dram", reason).inc()
        self.leases.end(entry)
        entry.hbm = entry.dram = None
        self.index.drop(entry)

    def _demote_victim(self, key: PrefixKey) -> None:
        """HBM's eviction: demotes the entry unless it is pinned, leased, moving or being produced."""
        entry = self.index.get(key)
        if entry is None or entry.pinned or entry.lease is not None or entry.demoting:
            return
        if key not in self.productions:
            self._demote(entry, Miss.MISS_REASON_EVICTED_HBM)

    def _evict_dram_victim(self, key: PrefixKey) -> None:
        """DRAM's eviction: drops the DRAM copy unless the entry is pinned or being produced."""
        entry = self.index.get(key)
        if entry is not None and key not in self.productions and not entry.pinned:
            self._evict_dram(entry, "capacity")

    def _evict_dram(self, entry: CacheEntry, reason: str) -> None:
        if entry.hbm is not None:  # keep the HBM copy; only the DRAM copy goes
            self.dram.release(entry.key)
            entry.dram = None
            metrics.KV_CACHE_EVICTIONS.labels("dram", reason).inc()
            return
        self._remove(entry, reason)
        self.index.tombstone(entry.key.user_id, Miss.MISS_REASON_EVICTED_DRAM)

    def _demote(self, entry: CacheEntry, reason_if_dropped: int) -> None:
        """Moves an unleased, unpinned HBM entry to DRAM; drops it when DRAM cannot hold it."""
        if entry.demoting or entry.hbm is None:
            return
        if entry.dram is not None:  # reloaded and unchanged: its DRAM copy is still valid, copy nothing
            self.hbm.release(entry.key)
            entry.hbm = None
            self.dram.touch(entry.key, self.clock())
            return
        nbytes = entry.length * self.dram_bytes_per_token
        if not self.dram.make_room(nbytes, self._evict_dram_victim):
            self._remove(
                entry, "lease_expired" if reason_if_dropped == Miss.MISS_REASON_LEASE_EXPIRED else "no_dram"
            )
            self.index.tombstone(entry.key.user_id, reason_if_dropped)
            return
        self.dram.reserve(entry.key, nbytes, self.clock())
        entry.demoting = True
        device_copy = entry.hbm
        future = self.copy_worker.submit(
            lambda: self.copier.to_dram(device_copy), Priority.PRE_INFER, Op.DEMOTE
        )
        future.add_done_callback(lambda f: self._demoted(entry, f))

    def _demoted(self, entry: CacheEntry, future: asyncio.Future) -> None:
        entry.demoting = False
        if self.index.get(entry.key) is not entry:  # removed while copying; `_remove` freed its bytes
            return
        if future.cancelled() or future.exception() is not None:
            self.dram.release(entry.key)
            self._remove(entry, "copy_failed")
            return
        dram_copy = future.result()
        if not self.dram.resize(entry.key, dram_copy.nbytes()):
            # Larger than reserved and DRAM cannot hold the difference: drop the copy, never the budget.
            log.error("DRAM copy of %s is %d bytes, more than reserved", entry.key, dram_copy.nbytes())
            self.dram.release(entry.key)
            if not entry.pinned and entry.lease is None and entry.key not in self.productions:
                self._remove(entry, "no_dram")
                self.index.tombstone(entry.key.user_id, Miss.MISS_REASON_EVICTED_HBM)
            self._publish()
            return
        entry.dram = dram_copy
        if not entry.pinned and entry.lease is None and entry.key not in self.productions:
            self.hbm.release(entry.key)
            entry.hbm = None
        self._publish()

    def _publish(self) -> None:
        for tier in (self.hbm, self.dram):
            stats = tier.stats()
            metrics.KV_CACHE_BYTES.labels(tier.name).set(stats.bytes)
            metrics.KV_CACHE_ENTRIES.labels(tier.name).set(stats.entries)
