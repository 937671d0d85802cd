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
exceeded: when HBM cannot hold a prefix, PreInfer is refused and Rank computes without caching. A
PreInfer is refused too when the pre-inference already queued ahead of it takes `max_pre_infer_backlog_ms`
of device time (`backlog_full`): it would not even start before its Rank, so it could save that Rank
nothing. Every production's cost goes into the load book, which the load report reads. The PreInfers of a
batch (`pre_infer_many`) are decided one by one, in order, as single ones; only the hand-off of their
device jobs is one.

The roles each have their file (see the package's docstring); this class decides, for a PreInfer or a
Rank, which of them to use. After a ring change, a miss may first read the prefix through from a peer
(`read_through`, `services.ranker.handoff`).

Not thread-safe by design: every method runs on the ranker's event loop; only model work and copies
run on their own threads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from relaygr.v1 import ranker_pb2
from services.common import tracing
from services.common.errors import DeadlineExceeded
from services.ranker import metrics
from services.ranker.cache.acquired import Acquired, Miss, Source, first_use
from services.ranker.cache.admission import ReadsThrough
from services.ranker.cache.index import CacheEntry, Index, Pin, PrefixKey
from services.ranker.cache.leases import Leases
from services.ranker.cache.moves import TierMoves
from services.ranker.cache.productions import Kind, Production, Productions
from services.ranker.cache.tiers import Tier
from services.ranker.device.copier import TierCopier
from services.ranker.engine.load import LoadBook
from services.ranker.engine.runner import ModelRunner
from services.ranker.engine.scheduler import Priority, Scheduler
from services.ranker.model.events import Events
from services.ranker.model.prefix_kv import PrefixKV

log = logging.getLogger(__name__)

Outcome = ranker_pb2.PreInferOutcome

# How long past its TTL an idle DRAM entry may wait for the sweep that evicts it when no request sweeps
# meanwhile (every PreInfer and Rank sweeps too): a DRAM TTL is a minute, and waking the event loop costs CPU.
DRAM_SWEEP_SLACK_S = 1.0


class OverBudget(Exception):
    """A production's KV came out larger than the HBM bytes reserved for it, and the tier cannot hold the
    difference: the entry is refused rather than let the budget be exceeded."""


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
        load: LoadBook,
        max_pre_infer_backlog_ms: float = float("inf"),
        max_tombstones: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runner = runner
        self.copier = copier
        self.copy_worker = copy_worker
        self.hbm = hbm
        self.dram = dram
        self.load = load
        self.leases = Leases(lease_ttl_s, clock, load)
        self.dram_ttl_s = dram_ttl_s
        self.max_pending_pre_infer = max_pending_pre_infer
        self.max_pre_infer_backlog_ms = max_pre_infer_backlog_ms
        self.clock = clock
        self.bytes_per_token = runner.kv_bytes_per_token
        self.index = Index(instance, max_tombstones)
        self.productions = Productions(runner, copier, copy_worker)
        self.moves = TierMoves(
            hbm, dram, copier, copy_worker, self.index, self.leases, self.productions,
            preset=runner.model.preset, clock=clock,
        )  # fmt: skip
        self.accepting = True
        self.read_through: ReadsThrough | None = None  # set by the app when peers are known
        metrics.KV_CACHE_CAPACITY_BYTES.labels("hbm").set(hbm.budget_bytes)
        metrics.KV_CACHE_CAPACITY_BYTES.labels("dram").set(dram.budget_bytes)

    # ---- public API ----

    entries = property(lambda self: self.index.entries)

    def pins(self) -> list[Pin]:
        """Every pin held now, with its owner and age: after traffic has settled, none (a leak if any)."""
        return [pin for entry in self.index for pin in entry.pins]

    def key(self, user_id: str, events: Events) -> PrefixKey:
        return PrefixKey(user_id, events.fingerprint, self.runner.model_version)

    def decoded(self, user_id: str, wire_digest: bytes) -> Events | None:
        """This user's events decoded from wire bytes of this digest, while an entry or production made from
        them is here (a Rank carrying its PreInfer's history is not decoded again); None otherwise."""
        key = self.index.wire_key(user_id, wire_digest)
        if key is None:
            return None
        production = self.productions.get(key)
        if production is not None:
            return production.events
        entry = self.index.get(key)
        return None if entry is None else entry.events

    async def pre_infer(self, user_id: str, events: Events) -> tuple[int, int]:
        """Starts (or joins, or renews) the production of `events`' prefix KV: (outcome, HBM bytes)."""
        (answer,) = await self.pre_infer_many([(user_id, events)])
        return answer

    async def pre_infer_many(self, requests: Sequence[tuple[str, Events]]) -> list[tuple[int, int]]:
        """`pre_infer` of each (user id, events), in order, each answered as it would be alone; the device
        jobs they start are handed to the device thread together, with one wake-up."""
        with self.runner.worker.together():
            return [self._pre_infer(user_id, events) for user_id, events in requests]

    def _pre_infer(self, user_id: str, events: Events) -> tuple[int, int]:
        self.sweep()
        key = self.key(user_id, events)
        nbytes = len(events) * self.bytes_per_token
        production = self.productions.get(key)
        if production is not None:
            # Joining: the entry is leased when the shared production completes.
            production.lease = True
            production.pre_infer = tracing.current_context() or production.pre_infer
            return Outcome.PRE_INFER_OUTCOME_ACCEPTED, nbytes
        entry = self.index.get(key)
        if entry is not None and entry.hbm is not None:
            self._lease(key, user_id)
            entry.pre_infer = tracing.current_context()
            return Outcome.PRE_INFER_OUTCOME_ALREADY_CACHED, nbytes
        if not self.accepting or self.productions.pending_pre_infer() >= self.max_pending_pre_infer:
            return Outcome.PRE_INFER_OUTCOME_REJECTED_OVERLOAD, 0
        if entry is not None:  # in DRAM only: reload, off the ranking's critical path
            started = self._start(key, events, Kind.RELOAD, Priority.RELOAD, for_rank=False, base=entry)
            outcome = Outcome.PRE_INFER_OUTCOME_RELOADED
        else:
            if self.backlog_full():  # before a prefetch too: it is answered as accepted at once
                return Outcome.PRE_INFER_OUTCOME_REJECTED_BACKLOG, 0
            again = lambda: self._pre_infer(user_id, events)  # noqa: E731
            if self.read_through is not None and self.read_through.prefetch(user_id, events, again):
                return Outcome.PRE_INFER_OUTCOME_ACCEPTED, nbytes  # produced once a peer has answered
            base = self._extension_base(user_id, events)
            kind = Kind.COMPUTE if base is None else Kind.EXTEND
            started = self._start(key, events, kind, Priority.PRE_INFER, for_rank=False, base=base)
            outcome = Outcome.PRE_INFER_OUTCOME_ACCEPTED
        if started is None:
            self.index.tombstone(user_id, Miss.MISS_REASON_REJECTED_CAPACITY)
            return Outcome.PRE_INFER_OUTCOME_REJECTED_CAPACITY, 0
        return outcome, nbytes

    def backlog_full(self) -> bool:
        """Whether a new pre-inference could save its Rank nothing: the pre-inference queued ahead of it takes
        `max_pre_infer_backlog_ms` of device time, so it would not start before its Rank computed the prefix
        itself (its own length does not count: a Rank joins what it started). Never on a provisional curve."""
        load = self.load
        return not load.calibration.provisional and load.pre_infer_backlog_ms >= self.max_pre_infer_backlog_ms

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
            pre_infer = entry.pre_infer if entry.lease is not None else None
            self.leases.end(entry, consumed=True)
            entry.pre_infer = None
            return Acquired(entry, first_use(entry, Source.HBM), pin=entry.pin("rank"), pre_infer=pre_infer)
        production = self.productions.get(key)
        if production is not None:
            metrics.PRODUCTION_JOINS.inc()
            self.productions.promote(production)
            return await self._join(production, joined=True)
        read_through = self.read_through
        if entry is None and read_through and await read_through.before_compute(user_id, events, deadline):
            return await self.acquire(user_id, events, relay_instance, deadline)  # it waited: look again
        miss_reason = self._miss_reason(user_id, events, relay_instance)
        if entry is not None:
            production = self._start(
                key, events, Kind.RELOAD, Priority.RANK, for_rank=True, base=entry, deadline=deadline
            )
        else:
            base = self._extension_base(user_id, events)
            kind = Kind.COMPUTE if base is None else Kind.EXTEND
            production = self._start(
                key, events, kind, Priority.AWAITED, for_rank=True, base=base, deadline=deadline
            )
        if production is None:
            return Acquired(None, Source.MISS, miss_reason)
        production.miss_reason = miss_reason
        return await self._join(production, joined=False)

    def release(self, acquired: Acquired) -> None:
        if acquired.pin is None:
            return
        entry = acquired.pin.release()
        if entry is not None and not entry.pinned and entry.lease is None and self.index.holds(entry):
            self.moves.demote(entry, Miss.MISS_REASON_EVICTED_HBM)

    def sweep(self) -> None:
        """Releases expired leases (exactly once each) and DRAM entries idle past their TTL."""
        now = self.clock()
        for entry in self.leases.expired():
            self.leases.end(entry)
            metrics.LEASE_EXPIRATIONS.inc()
            self.moves.demote(entry, Miss.MISS_REASON_LEASE_EXPIRED)
        for key in self.dram.idle_keys(older_than=now - self.dram_ttl_s):
            entry = self.index.get(key)
            if entry is not None and entry.hbm is None and key not in self.productions:
                self.moves.evict_dram(entry, "ttl")

    def next_sweep_in(self) -> float:
        """Seconds until a sweep could release something: the soonest lease deadline, or DRAM TTL expiry
        give or take `DRAM_SWEEP_SLACK_S` (expiries close together share a wake-up); with nothing held, the
        shorter of the two TTLs."""
        now, soonest = self.clock(), min(self.leases.ttl_s, self.dram_ttl_s + DRAM_SWEEP_SLACK_S)
        deadline, oldest = self.leases.next_deadline(), self.dram.oldest_use()
        if deadline is not None:
            soonest = min(soonest, deadline - now)
        if oldest is not None:
            soonest = min(soonest, oldest + self.dram_ttl_s + DRAM_SWEEP_SLACK_S - now)
        return soonest

    def leased(self) -> int:
        return len(self.leases)

    def leased_bytes(self) -> int:
        return self.leases.held_bytes()

    def budgets(self) -> tuple[int, int]:
        return self.hbm.budget_bytes, self.dram.budget_bytes

    async def close(self) -> None:
        await self.productions.close()

    # ---- productions ----

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
        if not self.hbm.make_room(need, self.moves.demote_victim):
            return None
        self.hbm.reserve(key, need, self.clock())
        self.index.remember_wire(key, events)
        production = self.productions.start(
            key, events, kind, priority, for_rank=for_rank, base=base, deadline=deadline,
            finish=self._finish, fail=self._fail,
        )  # fmt: skip
        production.tokens, production.reserved_bytes = self._tokens(events, kind, base), need
        production.cost_ms = self.load.cost_ms("pre_infer_ms", production.tokens)
        self._book(production, +1)
        metrics.PRODUCTIONS.labels(kind.value).inc()
        return production

    @staticmethod
    def _tokens(events: Events, kind: Kind, base: CacheEntry | None) -> int:
        """Tokens a production computes: all of them, the appended ones of an extension, none to reload."""
        if kind is Kind.RELOAD:
            return 0
        return len(events) - (base.length if kind is Kind.EXTEND else 0)

    def _book(self, production: Production, sign: int) -> None:
        """Adds (+1) or removes (-1) a production's cost: a miss's to the rank backlog (its Rank waits for
        it), a PreInfer's to the pre-inference backlog with the HBM it reserved."""
        if production.for_rank:
            self.load.add_rank(sign * production.cost_ms)
        else:
            self.load.add_pre_infer(sign * production.cost_ms, sign * production.reserved_bytes)

    def _fail(self, production: Production) -> None:
        if self.index.get(production.key) is None:
            self.index.forget_wire(production.key, production.events)
        self._book(production, -1)
        self.hbm.release(production.key)
        self._unpin_base(production.base_pin, superseded=False)

    def _finish(self, production: Production, kv: PrefixKV, reloaded: bool) -> CacheEntry:
        """Installs a production's KV: into HBM within its reservation, into the index, leased if asked."""
        key, kind, base_pin = production.key, production.kind, production.base_pin
        self._book(production, -1)
        if not self.hbm.resize(key, kv.nbytes()):
            log.error("prefix KV of %s is %d bytes, more than reserved; HBM cannot hold it", key, kv.nbytes())
            self.index.tombstone(key.user_id, Miss.MISS_REASON_REJECTED_CAPACITY)
            self._book(production, +1)  # _fail takes it off again
            self._fail(production)
            raise OverBudget(f"{kv.nbytes()} bytes do not fit in the HBM tier")
        base = production.base
        entry = base if kind is Kind.RELOAD else CacheEntry(key, production.events)
        if base is not None:  # reloaded, or extended from a base: lossy if that KV came from a lossy copy
            entry.lossy = base.lossy or (reloaded and self.copier.lossy)
        entry.hbm = kv
        if not production.for_rank:
            entry.relay_tokens, entry.relay_ms = production.tokens, production.cost_ms
        if production.lease:
            entry.pre_infer = production.pre_infer
        production.hand_out(entry)
        if kind is not Kind.RELOAD:
            self.index.insert(entry)
        if production.lease:
            self._lease(key, key.user_id)
        self._unpin_base(base_pin, superseded=kind is Kind.EXTEND)
        return entry

    def _unpin_base(self, base_pin: Pin | None, superseded: bool) -> None:
        base = None if base_pin is None else base_pin.release()
        if base is None:
            return
        if superseded and not base.pinned and base.lease is None and self.index.holds(base):
            self.moves.remove(base, "superseded")

    async def _join(self, production: Production, joined: bool) -> Acquired:
        """Waits for a production, one this Rank started or (`joined`) one already running; when it fails,
        this Rank computes on its own."""
        source = production.source
        miss_reason = production.miss_reason if source is Source.MISS else Miss.MISS_REASON_UNSPECIFIED
        try:
            entry, pin = await self.productions.join(
                production, on_abandoned=lambda pin: self.release(Acquired(pin.entry, source, pin=pin))
            )
        except OverBudget:  # produced, but HBM could not hold it: this Rank computes without caching
            return Acquired(None, Source.MISS, Miss.MISS_REASON_REJECTED_CAPACITY)
        except DeadlineExceeded:  # the Rank that started it gave up: this one computes on its own, in time
            return Acquired(None, Source.MISS, miss_reason or Miss.MISS_REASON_COLD)
        except Exception:  # the shared production failed: this Rank computes on its own
            log.warning("production of %s failed", production.key, exc_info=True)
            return Acquired(None, Source.MISS, miss_reason or Miss.MISS_REASON_COLD)
        self.leases.end(entry, consumed=True)  # a pre-infer leased it: this Rank consumes the lease
        entry.pre_infer = None
        computed = 0 if joined else production.tokens
        source = first_use(entry, source)
        return Acquired(
            entry, source, miss_reason, pin=pin, joined=joined, pre_infer=production.pre_infer,
            computed_events=computed,
        )  # fmt: skip

    def _lease(self, key: PrefixKey, owner: str) -> None:
        entry = self.index.get(key)
        if entry is None or entry.hbm is None:
            return
        self.leases.grant(entry, owner)

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
                self.moves.remove(entry, "stale")
        return self.index.miss_reason(user_id, relay_instance, stale=bool(stale))
