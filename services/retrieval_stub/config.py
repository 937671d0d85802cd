"""Retrieval stub settings: each is a flag with a `RELAYGR_…` environment twin (see services.common.config).

The universe's settings (`UniverseConfig`) are part of them, so a stub's users are reproducible from its
flags alone; so is the relay window (`RelaySettings`), which the stub spends pre-processing between its
Admit and its Rank and the trigger places pre-inference against. `--abandon-fraction` defaults to 0: every
request is ranked unless a benchmark asks for requests that are filtered between retrieval and ranking.
"""

from __future__ import annotations

import dataclasses

from services.affinity.settings import AffinitySettings
from services.common.config import ServiceConfig, check_target, setting
from services.common.settings import RelaySettings
from services.workload.universe import UniverseConfig


@dataclasses.dataclass(frozen=True)
class RetrievalStubConfig(UniverseConfig, RelaySettings, AffinitySettings, ServiceConfig):
    port: int = setting(50053, "gRPC port (0 picks a free port)")
    metrics_port: int = setting(9103, "Prometheus metrics port (0 picks a free port; -1 disables)")
    router: str = setting(
        "127.0.0.1:50050",
        "gRPC target of the routers (or of one ranker), host:port, dns:///name:port (every address, "
        "balanced by --lb-policy) or ipv4:a:p,b:q: Rank goes there, unless --rankers or --rankers-srv "
        "route directly",
    )
    trigger: str = setting(
        "127.0.0.1:50052",
        "gRPC target of the triggers, like --router: Admit goes there when --relay is on",
    )
    relay: bool = setting(True, "run the relay (Admit, then Rank with its hint); false runs the baseline")
    admit_timeout_ms: float = setting(20.0, "Admit deadline; a late or failed Admit means no relay", above=0)
    rank_timeout_ms: float = setting(1000.0, "deadline of the Rank call", above=0)
    abandon_fraction: float = setting(
        0.0,
        "share of requests whose Rank never comes: filtered upstream after retrieval (their Admit is still "
        "sent); chosen by a hash of (universe seed, user, request time), so the same in every mode",
        minimum=0,
    )

    def validate(self) -> None:
        ServiceConfig.validate(self)
        UniverseConfig.validate(self)
        self.validate_affinity()
        if not self.routes_directly:
            if not self.router:
                raise ValueError("--router must not be empty")
            check_target(self.router, "--router")
        if self.relay and not self.trigger:
            raise ValueError("--trigger must not be empty when --relay is on")
        if self.relay:
            check_target(self.trigger, "--trigger")
        if not self.abandon_fraction < 1:
            raise ValueError("--abandon-fraction must be in [0, 1)")
