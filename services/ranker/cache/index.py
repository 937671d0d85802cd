"""The prefix cache's index: its entries by key and by user, the pins that hold them, and why a user's
last prefix is gone (tombstones), from which every miss gets its reason.

A key is (user id, fingerprint of the long-term events, model version): a Rank whose long-term events
differ from an entry's never uses it, except that an entry whose events are a strict prefix of the Rank's
can be extended. A pin keeps an entry in HBM while someone uses it; it is a handle with an owner that
releases itself once, so a pin that is never released shows up in `CacheEntry.pins` with its owner and
age instead of as a counter off by one.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

from opentelemetry.trace import SpanContext

from relaygr.v1 import common_pb2
from services.ranker.model.events import Events
from services.ranker.model.prefix_kv import PrefixKV

Miss = common_pb2.MissReason


@dataclasses.dataclass(frozen=True)
class PrefixKey:
    user_id: str
    fingerprint: str
    model_version: str


@dataclasses.dataclass
class Lease:
    owner: str
    deadline: float


class Pin:
    """One holder's claim on an entry's HBM copy. `release()` gives it back; a second call does nothing."""

    __slots__ = ("entry", "owner", "taken_at")

    def __init__(self, entry: CacheEntry, owner: str) -> None:
        self.entry: CacheEntry | None = entry
        self.owner = owner
        self.taken_at = time.monotonic()

    @property
    def released(self) -> bool:
        return self.entry is None

    def release(self) -> CacheEntry | None:
        """Gives the pin back; the entry it held, or None if it was already released."""
        entry, self.entry = self.entry, None
        if entry is not None:
            entry.pins.discard(self)
        return entry

    def __repr__(self) -> str:
        state = "released" if self.entry is None else f"{time.monotonic() - self.taken_at:.3f}s"
        return f"Pin({self.owner}, {state})"


@dataclasses.dataclass(eq=False)
class CacheEntry:
    key: PrefixKey
    events: Events
    hbm: PrefixKV | None = None
    dram: PrefixKV | None = None
    lease: Lease | None = None
    pins: set[Pin] = dataclasses.field(default_factory=set)
    demoting: bool = False
    # Its KV went through a lossy (bf16 or FP8) DRAM copy, itself or the base it was extended from: its
    # scores equal a full recomputation only within that copy's epsilon, and every Rank served from it says
    # so.
    lossy: bool = False
    # It came from another ranker (`services.ranker.cache.admission`) and no Rank has used it here yet: the
    # first Rank served from it, whether it is in DRAM or was reloaded meanwhile, reports a peer hit.
    from_peer: bool = False
    # Tokens a PreInfer computed for it and their estimated device ms, until its lease ends: then they were
    # consumed by a Rank, or wasted.
    relay_tokens: int = 0
    relay_ms: float = 0.0
    # The sampled PreInfer that made or last renewed its lease: the Rank consuming that lease links to it.
    pre_infer: SpanContext | None = None

    @property
    def length(self) -> int:
        return len(self.events)

    def pin(self, owner: str) -> Pin:
        pin = Pin(self, owner)
        self.pins.add(pin)
        return pin

    @property
    def pinned(self) -> bool:
        return bool(self.pins)


class Index:
    """Entries by key and by user, and the last miss reason of users whose prefix is gone (bounded)."""

    def __init__(self, instance: str, max_tombstones: int) -> None:
        self.instance = instance
        self.max_tombstones = max_tombstones
        self.entries: dict[PrefixKey, CacheEntry] = {}
        self.by_user: dict[str, set[PrefixKey]] = {}
        self.tombstones: OrderedDict[str, int] = OrderedDict()
        # (user id, wire digest of a history) -> the key of the entry or production decoded from those bytes.
        self._wire: dict[tuple[str, bytes], PrefixKey] = {}

    def __iter__(self) -> Iterator[CacheEntry]:
        return iter(self.entries.values())

    def get(self, key: PrefixKey) -> CacheEntry | None:
        return self.entries.get(key)

    def holds(self, entry: CacheEntry) -> bool:
        """True while `entry` (this very object) is the one indexed under its key."""
        return self.entries.get(entry.key) is entry

    def insert(self, entry: CacheEntry) -> None:
        self.entries[entry.key] = entry
        self.by_user.setdefault(entry.key.user_id, set()).add(entry.key)
        self.tombstones.pop(entry.key.user_id, None)

    def drop(self, entry: CacheEntry) -> None:
        key = entry.key
        self.forget_wire(key, entry.events)
        del self.entries[key]
        users = self.by_user[key.user_id]
        users.discard(key)
        if not users:
            del self.by_user[key.user_id]

    def remember_wire(self, key: PrefixKey, events: Events) -> None:
        """Events decoded from wire bytes are found again by those bytes' digest (`wire_key`)."""
        if events.wire_digest:
            self._wire[key.user_id, events.wire_digest] = key

    def wire_key(self, user_id: str, digest: bytes) -> PrefixKey | None:
        return self._wire.get((user_id, digest))

    def forget_wire(self, key: PrefixKey, events: Events) -> None:
        if events.wire_digest and self._wire.get((key.user_id, events.wire_digest)) == key:
            del self._wire[key.user_id, events.wire_digest]

    def of_user(self, user_id: str) -> list[CacheEntry]:
        return [self.entries[k] for k in self.by_user.get(user_id, ())]

    def extension_base(
        self, user_id: str, events: Events, busy: Callable[[CacheEntry], bool]
    ) -> CacheEntry | None:
        """The longest entry of this user, not `busy`, whose events are a strict prefix of `events`."""
        best = None
        for entry in self.of_user(user_id):
            if busy(entry):
                continue
            if events.has_prefix(entry.events) and (best is None or entry.length > best.length):
                best = entry
        return best

    def stale(self, user_id: str, events: Events) -> list[CacheEntry]:
        """This user's entries that `events` can use neither as they are nor by extension."""
        return [
            e
            for e in self.of_user(user_id)
            if not events.has_prefix(e.events) and e.key.fingerprint != events.fingerprint
        ]

    def miss_reason(self, user_id: str, relay_instance: str, stale: bool) -> int:
        """Why a Rank of this user finds no usable prefix here."""
        if relay_instance and relay_instance != self.instance:
            return Miss.MISS_REASON_ROUTED_ELSEWHERE
        if stale:
            return Miss.MISS_REASON_STALE_PREFIX
        if user_id in self.tombstones:
            return self.tombstones[user_id]
        if relay_instance:
            return Miss.MISS_REASON_COLD
        return Miss.MISS_REASON_NEVER_PRE_INFERRED

    def tombstone(self, user_id: str, reason: int) -> None:
        self.tombstones[user_id] = reason
        self.tombstones.move_to_end(user_id)
        while len(self.tombstones) > self.max_tombstones:
            self.tombstones.popitem(last=False)
