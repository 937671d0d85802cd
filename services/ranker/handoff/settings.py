"""Settings of the cache handoff (`services.ranker.handoff`): how long and how fast a draining ranker hands
its prefixes off, how much a receiver stages, who may call a ranker's CacheHandoffService, and for how
long a ranker reads misses through from its peers after the ring changed."""

from __future__ import annotations

import dataclasses

from services.common.config import setting


@dataclasses.dataclass(frozen=True)
class HandoffSettings:
    handoff_budget_s: float = setting(
        10.0,
        "seconds from SIGTERM that a draining ranker spends pushing its cached prefixes to each user's next "
        "owner on the ring (0: no handoff)",
        minimum=0,
    )
    handoff_rate_mb_s: float = setting(
        200.0,
        "MiB a second a drain pushes at most, to all peers together, so that the receivers keep serving",
        above=0,
    )
    handoff_staging_mb: float = setting(
        128.0,
        "MiB of host memory, beside the DRAM budget, in which a receiver stages arriving entries that need "
        "DRAM room made (0: entries are admitted only into free DRAM)",
        minimum=0,
    )
    handoff_chunk_timeout_s: float = setting(
        5.0,
        "seconds a receiver waits for the next chunk of an entry it has begun; past them the entry's "
        "reservation is given back and the Push ends with DEADLINE_EXCEEDED",
        above=0,
    )
    handoff_peer_names: str = setting(
        "*.ranker-headless.relaygr.svc.cluster.local",
        "under mutual TLS (--tls-ca), the certificate names, comma-separated, of which a caller of "
        "CacheHandoffService must carry one (the rankers')",
        items=str,
    )
    handoff_secret: str = setting(
        "",
        "without mutual TLS, the rankers' shared secret, set through the environment, that every caller of "
        "CacheHandoffService must present (empty: loopback callers only)",
        secret=True,
    )
    read_through_grace_s: float = setting(
        120.0,
        "seconds after start-up or a change of the routable rankers during which a ranker asks a user's next "
        "owner for a prefix it misses before computing it (0: never)",
        minimum=0,
    )
    read_through_timeout_ms: float = setting(
        100.0,
        "longest wait of a PreInfer's read-through for a peer's answer before it computes the prefix itself "
        "(a Rank waits at most its predicted recomputation, within its deadline)",
        above=0,
    )
    read_through_max_fetches: int = setting(
        8,
        "fetches a ranker has in flight at most; a miss beyond them computes its prefix at once",
        above=0,
    )
    read_through_backoff_s: float = setting(
        10.0,
        "seconds a peer whose fetch timed out is not asked again (its misses compute at once meanwhile)",
        minimum=0,
    )

    @property
    def hands_off(self) -> bool:
        return self.handoff_budget_s > 0

    @property
    def reads_through(self) -> bool:
        return self.read_through_grace_s > 0
