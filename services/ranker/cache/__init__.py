"""The prefix cache: where a request's prefix KV comes from, and the lifecycle of every entry.

- `prefix_cache`: `PrefixCache`, which decides for each request (lookup, produce or join, lease, consume).
- `index`: the entries by key, their miss reasons and owned pins.
- `productions`: single-flight productions (compute, reload, extension) that concurrent requests join.
- `leases`: consume-bound HBM leases.
- `moves`: the moves between tiers (demotion after consumption or lease expiry, eviction).
- `tiers`: the byte-budgeted HBM and DRAM tiers, LRU + TTL.

`PrefixLifecycle` is the whole of it as the data plane sees it: an entry's life in five calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Sequence

    from services.ranker.cache.acquired import Acquired
    from services.ranker.engine.load import LoadBook
    from services.ranker.model.events import Events


@runtime_checkable
class PrefixLifecycle(Protocol):
    """The cache's lifecycle, as the data plane drives it (`PrefixCache` is the implementation):

    1. `pre_infer` (a PreInfer): produce the prefix in HBM, or join the production already running, or renew
       the lease of the entry already there; or refuse (HBM full, backlog too long, too many pending). The
       entry stays leased in HBM until a Rank consumes it or the lease expires. `pre_infer_many` does it
       for the entries of a PreInfer batch, in order, handing their device jobs over together.
    2. `acquire` (a Rank): the prefix from HBM (the lease consumed), by joining its production, by a reload
       from DRAM, by extending an older prefix of the same user with the appended events, or by computing
       it (a miss, whose reason is recorded); pinned for the Rank. When nothing can be held, no entry: the
       Rank computes the whole sequence. A stale entry (other events, other model) is never returned.
    3. `release` (the Rank is done): unpinned; an entry neither pinned nor leased is demoted to DRAM.
    4. `sweep` (periodically, and on every call): expired leases are demoted, DRAM entries idle past their
       TTL evicted. Eviction from DRAM also happens whenever a demotion needs room (LRU).
    5. `close`: the productions in flight are cancelled.
    """

    load: LoadBook

    async def pre_infer(self, user_id: str, events: Events) -> tuple[int, int]:
        """(PreInferOutcome, HBM bytes the prefix occupies)."""

    async def pre_infer_many(self, requests: Sequence[tuple[str, Events]]) -> list[tuple[int, int]]:
        """`pre_infer` of each (user id, events) in order, each answered as alone (a PreInfer batch)."""

    def decoded(self, user_id: str, wire_digest: bytes) -> Events | None:
        """The user's events decoded from wire bytes with this digest, while the cache holds or produces
        their prefix (a Rank of a relayed history is not decoded again); None otherwise."""

    async def acquire(
        self, user_id: str, events: Events, relay_instance: str, deadline: float | None = None
    ) -> Acquired: ...

    def release(self, acquired: Acquired) -> None: ...

    def sweep(self) -> None: ...

    def leased_bytes(self) -> int:
        """HBM bytes held by leases now (what the load report tells the trigger)."""

    def budgets(self) -> tuple[int, int]:
        """(HBM, DRAM) byte budgets."""

    async def close(self) -> None: ...
