"""Prefixes that come from, and go to, other rankers (`services.ranker.handoff`): admission into DRAM, and
the resident entries a drain or a peer's read-through sends.

Admission is safe by construction:
- Into DRAM only, under the DRAM tier's own budget: room is made by evicting, in the tier's order, only
  entries held in DRAM alone (neither leased, pinned, resident in HBM nor being produced) and last used
  before the incoming entry was last used on its sender; what still does not fit is refused.
- Only with this ranker's model version and KV layout, and only once every byte has arrived with the
  header's size and CRC-32 (`codec.Assembly`): the bytes land in their DRAM copy as they arrive, under a
  reservation of their own (the tier can never hold more than its budget, arrived or not), and the entry
  is indexed at the last chunk. A stream torn before it admits nothing and gives the reservation back.
- Idempotently: a key this ranker holds or is producing is acknowledged (`held`), and nothing is stored.

An admitted entry is an ordinary DRAM entry from then on (reloaded by a Rank or a PreInfer, extended,
evicted by TTL or LRU), its TTL counted from its arrival.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import torch

from relaygr.v1 import handoff_pb2
from services.common import validation
from services.common.errors import InvalidArgument
from services.ranker.cache import kv_wire as codec
from services.ranker.cache.index import CacheEntry, PrefixKey
from services.ranker.engine.scheduler import Op, Priority
from services.ranker.model.events import Events
from services.ranker.model.prefix_kv import PrefixKV

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
    """An entry being received: its key and events, its DRAM copy filling up, and the reservation that
    accounts for it (`("incoming", key)` in the DRAM tier, never the key itself)."""

    key: PrefixKey
    events: Events
    kv: PrefixKV
    assembly: codec.Assembly

    @property
    def reservation(self) -> tuple[str, PrefixKey]:
        return ("incoming", self.key)


class Admission:
    """Admits entries into a `PrefixCache`'s DRAM tier and reads its resident entries out."""

    def __init__(self, cache, max_events: int, num_action_types: int) -> None:
        self.cache = cache
        self.max_events = max_events
        self.num_action_types = num_action_types
        preset = cache.runner.model.preset
        dtype = cache.copier.dram_dtype
        self.layout = codec.layout(
            preset.num_layers, preset.num_heads, preset.head_dim, dtype, preset.tokens_per_event
        )

    # ---- receiving ----

    def begin(
        self, entry: handoff_pb2.HandoffEntry, wanted: Events | None = None, now: float | None = None
    ) -> Incoming | int:
        """An `Incoming` for `entry`'s bytes, or why it is not taken: a `HandoffRefusal`, or `HELD` when this
        ranker holds the key already (an acknowledgement). With `wanted` (a read-through's events), only an
        entry of those events or of a strict prefix of them is taken."""
        cache = self.cache
        if entry.model_version != cache.runner.model_version:
            return Refusal.HANDOFF_REFUSAL_MODEL_VERSION
        if entry.layout != self.layout:
            return Refusal.HANDOFF_REFUSAL_LAYOUT
        try:
            arrays = validation.sequence_arrays(
                entry.events, "entry.events", self.max_events, self.num_action_types, allow_empty=False
            )
            validation.user_id(entry.user_id, "entry.user_id")
        except InvalidArgument:
            return Refusal.HANDOFF_REFUSAL_INVALID
        events = Events(*arrays)
        if wanted is not None and not (events.fingerprint == wanted.fingerprint or wanted.has_prefix(events)):
            return Refusal.HANDOFF_REFUSAL_INVALID
        buffer_shape = codec.shape(entry.layout, entry.nbytes, len(events))
        if buffer_shape is None:
            return Refusal.HANDOFF_REFUSAL_INVALID
        key = cache.key(entry.user_id, events)
        if self.holds(key):
            return HELD
        now = cache.clock() if now is None else now
        reservation = ("incoming", key)
        if reservation in cache.dram or not self._make_room(entry.nbytes, now - entry.idle_s):
            return Refusal.HANDOFF_REFUSAL_BUDGET
        kv = cache.copier.new_dram(buffer_shape)
        if kv is None:  # the host pool has no contiguous range that large
            return Refusal.HANDOFF_REFUSAL_BUDGET
        cache.dram.reserve(reservation, entry.nbytes, now)
        return Incoming(key, events, kv, codec.Assembly(entry, kv.buffer))

    def finish(self, incoming: Incoming) -> int:
        """Indexes a complete entry: `ADMITTED`, `HELD` (produced or admitted here meanwhile), or why it was
        refused."""
        cache = self.cache
        self.abort(incoming, keep_copy=True)
        if not incoming.assembly.complete:
            cache.copier.release(incoming.kv)
            return Refusal.HANDOFF_REFUSAL_CHECKSUM
        if self.holds(incoming.key):  # produced or admitted here while it was arriving
            cache.copier.release(incoming.kv)
            return HELD
        nbytes = incoming.kv.nbytes()
        if not cache.dram.reserve(incoming.key, nbytes, cache.clock()):  # its own bytes, just given back
            cache.copier.release(incoming.kv)
            return Refusal.HANDOFF_REFUSAL_BUDGET
        header = incoming.assembly.entry
        cache.index.insert(CacheEntry(incoming.key, incoming.events, dram=incoming.kv, lossy=header.lossy))
        return ADMITTED

    def abort(self, incoming: Incoming, keep_copy: bool = False) -> None:
        """Gives an incoming entry's reservation back (and its DRAM copy, unless `keep_copy`)."""
        if incoming.reservation in self.cache.dram:
            self.cache.dram.release(incoming.reservation)
        if not keep_copy:
            self.cache.copier.release(incoming.kv)

    def holds(self, key: PrefixKey) -> bool:
        return self.cache.index.get(key) is not None or key in self.cache.productions

    def _make_room(self, nbytes: int, used_before: float) -> bool:
        """Evicts DRAM-only entries used before `used_before`, in the tier's order, until `nbytes` fit."""
        cache, dram = self.cache, self.cache.dram
        if nbytes > dram.budget_bytes:
            return False
        for key in dram.victims():
            if dram.fits(nbytes):
                break
            entry = cache.index.get(key)
            if entry is not None and self._evictable(entry) and dram.last_used(key) < used_before:
                cache.moves.evict_dram(entry, "handoff")
        return dram.fits(nbytes)

    def _evictable(self, entry: CacheEntry) -> bool:
        return (
            entry.hbm is None
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
        """Bytes the entry takes on the wire (in the DRAM dtype)."""
        return entry.length * self.cache.moves.dram_bytes_per_token

    async def payload(self, entry: CacheEntry) -> tuple[handoff_pb2.HandoffEntry, memoryview] | None:
        """The entry's header and bytes as sent; None when it has lost both copies meanwhile. A device copy
        is read on the copy thread."""
        cache = self.cache
        kv, idle_s = entry.dram or entry.hbm, self.idle_s(entry)
        if kv is None:
            return None
        if kv.device.type != "cpu" or kv.dtype != cache.copier.dram_dtype:
            to_host: Callable[[], torch.Tensor] = lambda: cache.copier.to_host(kv)  # noqa: E731
            host = await cache.copy_worker.submit(to_host, Priority.PRE_INFER, Op.HANDOFF)
        else:  # a slab of the host pool may be reused once evicted: send a copy of its own
            host = kv.wait().buffer.clone() if cache.copier.copies else kv.wait().buffer
        data = codec.as_bytes(host)
        header = handoff_pb2.HandoffEntry(
            user_id=entry.key.user_id,
            model_version=entry.key.model_version,
            events=codec.sequence(entry.events),
            layout=self.layout,
            nbytes=len(data),
            crc32=codec.crc32(data),
            lossy=entry.lossy or cache.copier.lossy,
            idle_s=idle_s,
        )
        return header, data
