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
        "from SIGTERM, seconds a ranker spends pushing its cached prefixes (DRAM entries and HBM entries "
        "still resident, most recently used first) to each user's next owner on the ring (--rankers or "
        "--rankers-srv), while it drains and once more after, for what the drain made; what does not fit "
        "is dropped (0: no handoff). The pod's terminationGracePeriodSeconds must cover it",
        minimum=0,
    )
    handoff_rate_mb_s: float = setting(
        200.0,
        "MiB a second a drain pushes at most, to all peers together, so that the receivers keep serving",
        above=0,
    )
    handoff_staging_mb: float = setting(
        128.0,
        "MiB of host memory, beside the DRAM budget, that a receiver holds at most in entries still arriving "
        "from peers that need DRAM room made: their victims are evicted only once the entry is whole and "
        "its checksum verified; an entry that fits the DRAM tier's free bytes arrives straight into DRAM, "
        "and one that needs room beyond this is refused (0: entries are admitted only into free DRAM)",
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
        "under mutual TLS (--tls-ca), the certificate names (a DNS name or IP of its subject alternative "
        "names, or its common name, as issued) of which a caller of CacheHandoffService must carry one: the "
        "rankers' (deploy/components/tls/certificates.yaml); comma-separated",
        items=str,
    )
    handoff_secret: str = setting(
        "",
        "without mutual TLS, a secret shared by the fleet's rankers that every caller of CacheHandoffService "
        "must present (the rankers send it); empty: only callers on loopback are served. Set it through the "
        "environment (from a Kubernetes Secret): a flag's value shows in the process list",
        secret=True,
    )
    read_through_grace_s: float = setting(
        120.0,
        "seconds after start-up or a change of the routable rankers during which a ranker that misses a "
        "user's prefix asks the user's next owner without itself (where a drain pushed it, or who served "
        "the user meanwhile) before computing; a PreInfer's ask is a prefetch off the critical path, a "
        "Rank's is made only when the transfer is predicted to beat the recomputation (0: never)",
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
