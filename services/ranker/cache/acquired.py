"""What a Rank gets from the prefix cache (`PrefixCache.acquire`): the entry it ranks against, where it came
from and, when there is none, why."""

from __future__ import annotations

import dataclasses
import enum

from opentelemetry.trace import SpanContext

from relaygr.v1 import common_pb2
from services.ranker.cache.index import CacheEntry, Pin

Miss = common_pb2.MissReason


class Source(enum.Enum):
    HBM = common_pb2.CACHE_SOURCE_HBM
    DRAM = common_pb2.CACHE_SOURCE_DRAM
    EXTENDED = common_pb2.CACHE_SOURCE_EXTENDED
    MISS = common_pb2.CACHE_SOURCE_MISS
    PEER = common_pb2.CACHE_SOURCE_PEER

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclasses.dataclass(frozen=True)
class Acquired:
    """What a Rank ranks against: a pinned entry, or nothing (compute the whole sequence)."""

    entry: CacheEntry | None
    source: Source
    miss_reason: int = Miss.MISS_REASON_UNSPECIFIED
    pin: Pin | None = None
    # It waited for a production that was already running (a pre-inference, or another Rank's miss).
    joined: bool = False
    # The sampled PreInfer whose prefix it consumes (its lease, or the production it joined).
    pre_infer: SpanContext | None = None
    # Long-term events a production this Rank started computed for it (a miss's, or an extension's
    # appended ones); 0 for a prefix found, reloaded or joined.
    computed_events: int = 0


def first_use(entry: CacheEntry, source: Source) -> Source:
    """Where a Rank served from `entry` says its prefix came from: `source`, or the peer where the entry
    arrived from one and this is its first use here (found in HBM or reloaded from DRAM)."""
    if entry.from_peer and source in (Source.HBM, Source.DRAM):
        entry.from_peer = False
        return Source.PEER
    return source
