"""Prefixes that come from, and go to, other rankers (`services.ranker.handoff`): admission into DRAM, and
the resident entries a drain or a peer's read-through sends.

Admission is safe by construction:
- Into DRAM only, under the DRAM tier's own budget, and only with this ranker's model version and KV
  layout (its DRAM dtype among them: a ranker takes entries of its own `--dram-precision` only; an FP8
  entry's scales must be one finite, positive float32 a layer, keys or values and head), valid events,
  and a sender-side idle time (`idle_s`) that is finite, not negative and within the
  DRAM TTL (a staler entry would expire on arrival); anything else is refused as invalid, the field named
  in the log.
- Nothing is evicted for an entry before every byte of it has arrived with the header's size and CRC-32
  (`codec.Assembly`). An entry whose bytes fit the DRAM tier's free bytes lands in its DRAM copy as it
  arrives, under a reservation of its own (`("incoming", key)`, counted in the tier: the tier never holds
  more than its budget, arrived or not). One that needs room made is taken only if the room could be made
  (see below), and its bytes arrive into a staging buffer of their own, under the handoff's staging budget
  (`--handoff-staging-mb`, host memory beside the DRAM budget, a few entries at a time); once it is whole
  and verified, its victims are evicted and its bytes become (or, with a host pool, are copied into) its
  DRAM copy. Staging beside the DRAM budget rather than carved out of it keeps every ranker's DRAM tier
  whole between handoffs. A stream torn before an entry's last chunk admits nothing of it and gives its
  reservation and its buffer back.
- Room is made by evicting, oldest first, only entries held in DRAM alone (neither leased, pinned,
  resident in HBM nor being produced), last used strictly before the incoming entry was last used on its
  sender, and not admitted earlier in the same stream: the walk of the tier's order stops at the first
  entry used at or after that time, so it visits the victims (and entries it must skip), never the whole
  tier. What still does not fit is refused.
- One clock: an admitted entry is stamped with its last use on the sender mapped onto this ranker's clock
  (arrival minus `idle_s`), the same time its eligibility to evict was judged by. Its TTL runs from then,
  and an entry of the same stream never evicts one admitted before it, so a receipt's `admitted` are all
  held when the stream ends.
- Idempotently: a key this ranker holds or is producing is acknowledged (`held`), and nothing is stored.

An admitted entry is an ordinary DRAM entry from then on (reloaded by a Rank or a PreInfer, extended,
evicted by TTL or LRU).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Collection
from typing import Protocol

import torch

from relaygr.v1 import handoff_pb2
from services.common import validation
from services.common.errors import InvalidArgument
from services.ranker.cache import kv_wire as codec
from services.ranker.cache.index import CacheEntry, PrefixKey
from services.ranker.cache.tiers import Tier
from services.ranker.engine.scheduler import Op, Priority
from services.ranker.model.events import Events
from services.ranker.model.prefix_kv import PrefixKV

log = logging.getLogger(__name__)

Refusal = handoff_pb2.HandoffRefusal
# What `begin` and `finish` answer besides a `HandoffRefusal`: the key is held here already (acknowledged),
# or the entry was admitted.
HELD = 0
ADMITTED = -1


class ReadsThrough(Protocol):
    """What `PrefixCache` asks of a read-through (`services.ranker.handoff.read_through`) on a miss."""

    def prefetch(self, user_id: str, events: Events, then: Callable[[], object]) -> bool:
        """A PreInfer's: fetch, then call `then`; False when there is nothing to ask."""

    async def before_compute(self, user_id: str, events: Events, deadline: float | None) -> bool:
        """A Rank's: True when it waited for a peer (the Rank looks again: the cache may have changed)."""


@dataclasses.dataclass(eq=False)
class Incoming:
    """An entry being received: its key and events, the buffer filling up (its DRAM copy, or with `staged`
    a staging buffer of its own), the reservation that accounts for it (`("incoming", key)`, in the DRAM
    tier or the staging tier, never the key itself), and its last use on the sender on this ranker's
    clock."""

    key: PrefixKey
    events: Events
    kv: PrefixKV
    assembly: codec.Assembly
    used_at: float
    staged: bool = False

    @property
    def reservation(self) -> tuple[str, PrefixKey]:
        return ("incoming", self.key)


class Admission:
    """Admits entries into a `PrefixCache`'s DRAM tier and reads its resident entries out. `staging_bytes`
    bounds the bytes of entries still arriving that need room made in DRAM (the staging tier)."""

    def __init__(self, cache, max_events: int, num_action_types: int, staging_bytes: int = 0) -> None:
        self.cache = cache
        self.max_events = max_events
        self.num_action_types = num_action_types
        self.staging = Tier("handoff-staging", staging_bytes)
        preset = cache.runner.model.preset
        dtype = cache.copier.dram_dtype
        self.layout = codec.layout(
            preset.num_layers, preset.num_heads, preset.head_dim, dtype, preset.tokens_per_event
        )

    # ---- receiving ----

    def begin(
        self,
        entry: handoff_pb2.HandoffEntry,
        wanted: Events | None = None,
        now: float | None = None,
        protected: Collection[PrefixKey] = frozenset(),
    ) -> Incoming | int:
        """An `Incoming` for `entry`'s bytes, or why it is not taken: a `HandoffRefusal`, or `HELD` when this
        ranker holds the key already (an acknowledgement). With `wanted` (a read-through's events), only an
        entry of those events or of a strict prefix of them is taken. `protected`: the keys admitted earlier
        in the same stream, which it may not evict. Evicts nothing."""
        cache = self.cache
        if entry.model_version != cache.runner.model_version:
            return Refusal.HANDOFF_REFUSAL_MODEL_VERSION
        if entry.layout != self.layout:
            return Refusal.HANDOFF_REFUSAL_LAYOUT
        try:
            events, buffer_shape, scale = self._validate(entry, wanted)
        except InvalidArgument as exc:
            log.warning("handoff entry refused as invalid: %s", exc.message)
            return Refusal.HANDOFF_REFUSAL_INVALID
        key = cache.key(entry.user_id, events)
        if self.holds(key):
            return HELD
        now = cache.clock() if now is None else now
        used_at = now - entry.idle_s
        reservation, nbytes, dram = ("incoming", key), cache.copier.dram_nbytes(buffer_shape), cache.dram
        if reservation in dram or reservation in self.staging or nbytes > dram.budget_bytes:
            return Refusal.HANDOFF_REFUSAL_BUDGET
        if dram.fits(nbytes):
            kv = cache.copier.new_dram(buffer_shape)
            if kv is not None:  # else the host pool has no contiguous range that large: stage it
                if scale is not None:
                    kv.scale.copy_(scale)
                dram.reserve(reservation, nbytes, now)
                return Incoming(key, events, kv, codec.Assembly(entry, kv.buffer), used_at)
        if not self.staging.fits(nbytes) or self._victims(nbytes, used_at, protected) is None:
            return Refusal.HANDOFF_REFUSAL_BUDGET
        staged = PrefixKV(torch.empty(buffer_shape, dtype=cache.copier.dram_dtype), scale=scale)
        self.staging.reserve(reservation, nbytes, now)
        return Incoming(key, events, staged, codec.Assembly(entry, staged.buffer), used_at, staged=True)

    def _validate(
        self, entry: handoff_pb2.HandoffEntry, wanted: Events | None
    ) -> tuple[Events, tuple, torch.Tensor | None]:
        """The entry's events, buffer shape and scales (FP8); InvalidArgument naming the field at fault."""
        arrays = validation.sequence_arrays(
            entry.events, "entry.events", self.max_events, self.num_action_types, allow_empty=False
        )
        validation.user_id(entry.user_id, "entry.user_id")
        idle_s, ttl_s = entry.idle_s, self.cache.dram_ttl_s
        if not math.isfinite(idle_s) or idle_s < 0:
            raise InvalidArgument("entry.idle_s", f"must be finite and not negative ({idle_s})")
        if idle_s > ttl_s:
            raise InvalidArgument("entry.idle_s", f"{idle_s:g} s is past the DRAM TTL ({ttl_s:g} s): stale")
        events = Events(*arrays)
        if wanted is not None and not (events.fingerprint == wanted.fingerprint or wanted.has_prefix(events)):
            raise InvalidArgument("entry.events", "are neither the events asked for nor a prefix of them")
        buffer_shape = codec.shape(entry.layout, entry.nbytes, len(events))
        if buffer_shape is None:
            raise InvalidArgument(
                "entry.nbytes", f"{entry.nbytes} bytes are not {len(events)} events in the entry's layout"
            )
        try:
            scale = codec.scales(entry.layout, entry.scale)
        except ValueError as exc:
            raise InvalidArgument("entry.scale", str(exc)) from None
        return events, buffer_shape, scale

    def finish(self, incoming: Incoming, protected: set[PrefixKey] | None = None) -> int:
        """Indexes a complete entry: `ADMITTED`, `HELD` (produced or admitted here meanwhile), or why it was
        refused. A staged entry's victims are evicted here, once its bytes are verified. An admitted key is
        added to `protected` (the stream's admitted keys, which later entries of it may not evict)."""
        cache = self.cache
        protected = set() if protected is None else protected
        self._give_back(incoming)
        if not incoming.assembly.complete:
            self._drop(incoming)
            return Refusal.HANDOFF_REFUSAL_CHECKSUM
        if self.holds(incoming.key):  # produced or admitted here while it was arriving
            self._drop(incoming)
            return HELD
        kv = self._place(incoming, protected) if incoming.staged else incoming.kv
        if kv is None:
            return Refusal.HANDOFF_REFUSAL_BUDGET
        nbytes = kv.nbytes()
        if not cache.dram.reserve(incoming.key, nbytes, incoming.used_at):  # room was made or given back
            cache.copier.release(kv)
            return Refusal.HANDOFF_REFUSAL_BUDGET
        header = incoming.assembly.entry
        cache.index.insert(
            CacheEntry(incoming.key, incoming.events, dram=kv, lossy=header.lossy, from_peer=True)
        )
        protected.add(incoming.key)
        return ADMITTED

    def abort(self, incoming: Incoming) -> None:
        """Gives an incoming entry's reservation and buffer back."""
        self._give_back(incoming)
        self._drop(incoming)

    def _give_back(self, incoming: Incoming) -> None:
        tier = self.staging if incoming.staged else self.cache.dram
        if incoming.reservation in tier:
            tier.release(incoming.reservation)

    def _drop(self, incoming: Incoming) -> None:
        if not incoming.staged:  # a staging buffer is no slab: it is simply let go
            self.cache.copier.release(incoming.kv)

    def holds(self, key: PrefixKey) -> bool:
        return self.cache.index.get(key) is not None or key in self.cache.productions

    def _place(self, incoming: Incoming, protected: set[PrefixKey]) -> PrefixKV | None:
        """The DRAM copy of a verified staged entry, room made for it: its staging buffer itself, or with a
        host pool a slab it is copied into (more victims go while the pool has no contiguous range that
        large); None when the room cannot be made (nothing is evicted then, but for a fragmented pool)."""
        cache, nbytes, used_at = self.cache, incoming.kv.nbytes(), incoming.used_at
        victims = self._victims(nbytes, used_at, protected)
        if victims is None:
            return None
        for entry in victims:
            cache.moves.evict_dram(entry, "handoff")
        if not cache.copier.copies:
            return incoming.kv
        kv = cache.copier.new_dram(tuple(incoming.kv.buffer.shape))
        if kv is None:
            for key, last_used in cache.dram.by_last_use():
                if last_used >= used_at:
                    break
                entry = self._victim(key, protected)
                if entry is not None:
                    cache.moves.evict_dram(entry, "handoff")
                    kv = cache.copier.new_dram(tuple(incoming.kv.buffer.shape))
                    if kv is not None:
                        break
        if kv is not None:
            kv.buffer.copy_(incoming.kv.buffer)
            if kv.scale is not None:
                kv.scale.copy_(incoming.kv.scale)
        return kv

    def _victims(
        self, nbytes: int, used_before: float, protected: Collection[PrefixKey]
    ) -> list[CacheEntry] | None:
        """The entries to evict, oldest first, for `nbytes` to fit the DRAM tier: DRAM-only entries last
        used before `used_before` and not `protected`; None when they are not enough. Walks the tier's order
        once and stops at the first entry used at or after `used_before`: nothing after it can be a victim."""
        dram = self.cache.dram
        if nbytes > dram.budget_bytes:
            return None
        free, victims = dram.free_bytes(), []
        if free >= nbytes:
            return victims
        for key, last_used in dram.by_last_use():
            if last_used >= used_before:
                break
            entry = self._victim(key, protected)
            if entry is not None:
                victims.append(entry)
                free += dram.size(key)
                if free >= nbytes:
                    return victims
        return None

    def _victim(self, key, protected: Collection[PrefixKey]) -> CacheEntry | None:
        """The entry of a DRAM key if it may be evicted for an incoming one."""
        if key in protected:
            return None
        entry = self.cache.index.get(key)
        return entry if entry is not None and self._evictable(entry) else None

    def _evictable(self, entry: CacheEntry) -> bool:
        return (
            entry.hbm is None
            and entry.dram is not None
            and entry.lease is None
            and not entry.pinned
            and not entry.demoting
            and entry.key not in self.cache.productions
        )

    # ---- sending ----

    def resident(self) -> list[CacheEntry]:
        """Entries that can be sent, most recently used first: those resident in HBM (in use or leased, so
        the most recent), then those in DRAM by their last use."""
        cache = self.cache
        ready = [e for e in cache.index if e.key not in cache.productions and not e.demoting]
        in_hbm = [e for e in ready if e.hbm is not None]
        in_dram = [e for e in ready if e.hbm is None and e.dram is not None]
        in_dram.sort(key=lambda e: cache.dram.last_used(e.key), reverse=True)
        return in_hbm + in_dram

    def find(self, user_id: str, events: Events) -> CacheEntry | None:
        """The entry of `events` or of their longest strict prefix that can be sent (a peer's Fetch)."""
        cache = self.cache
        entry = cache.index.get(cache.key(user_id, events))
        if entry is None or entry.key in cache.productions or entry.demoting:
            entry = cache.index.extension_base(
                user_id, events, busy=lambda e: e.key in cache.productions or e.demoting
            )
        if entry is None or (entry.hbm is None and entry.dram is None):
            return None
        return entry

    def expires_at(self, entry: CacheEntry) -> float:
        """When a DRAM-only entry's TTL runs out (never for one resident in HBM)."""
        if entry.hbm is not None or entry.key not in self.cache.dram:
            return float("inf")
        return self.cache.dram.last_used(entry.key) + self.cache.dram_ttl_s

    def idle_s(self, entry: CacheEntry) -> float:
        if entry.hbm is not None or entry.key not in self.cache.dram:
            return 0.0
        return max(0.0, self.cache.clock() - self.cache.dram.last_used(entry.key))

    def nbytes(self, entry: CacheEntry) -> int:
        """Bytes the entry takes on the wire (in the DRAM dtype, with its scales in FP8)."""
        return self.cache.moves.dram_nbytes(entry.length)

    async def payload(self, entry: CacheEntry) -> tuple[handoff_pb2.HandoffEntry, memoryview] | None:
        """The entry's header and bytes as sent; None when it has lost both copies meanwhile. A device copy
        is read on the copy thread."""
        cache = self.cache
        kv, idle_s = entry.dram or entry.hbm, self.idle_s(entry)
        if kv is None:
            return None
        if kv.device.type != "cpu" or kv.dtype != cache.copier.dram_dtype:
            to_host: Callable[[], PrefixKV] = lambda: cache.copier.to_host(kv)  # noqa: E731
            host = await cache.copy_worker.submit(to_host, Priority.PRE_INFER, Op.HANDOFF)
            buffer = host.buffer
        else:  # a slab of the host pool may be reused once evicted: send a copy of its own
            host = kv.wait()
            buffer = host.buffer.clone() if cache.copier.copies else host.buffer
        data, scale = codec.as_bytes(buffer), codec.scale_bytes(host)
        header = handoff_pb2.HandoffEntry(
            user_id=entry.key.user_id,
            model_version=entry.key.model_version,
            events=codec.sequence(entry.events),
            layout=self.layout,
            nbytes=len(data),
            crc32=codec.crc32(data, scale),
            scale=scale,
            lossy=entry.lossy or cache.copier.lossy,
            idle_s=idle_s,
        )
        return header, data
