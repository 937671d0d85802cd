"""Router settings: each is a flag with a `RELAYGR_…` environment twin (see services.common.config).

The routing settings are `AffinitySettings`, which the trigger and the retrieval stub share for direct
routing; the router always routes, so its `--rankers` has a default member.
"""

from __future__ import annotations

import dataclasses

from services.affinity.settings import AffinitySettings
from services.common.config import ServiceConfig, setting


@dataclasses.dataclass(frozen=True)
class RouterConfig(AffinitySettings, ServiceConfig):
    port: int = setting(50050, "gRPC port (0 picks a free port)")
    metrics_port: int = setting(9100, "Prometheus metrics port (0 picks a free port; -1 disables)")
    rankers: str = setting(
        "ranker-0=127.0.0.1:50051",
        "static members as name=host:port,...; each name must equal that ranker's --instance-name",
    )
    deadline_margin_ms: int = setting(
        2, "forwards get the caller's remaining time minus this margin", minimum=0
    )
    default_timeout_ms: int = setting(5000, "forward timeout when the caller sent no deadline", above=0)

    def validate(self) -> None:
        super().validate()
        if not self.routes_directly:
            raise ValueError("give --rankers or --rankers-srv")
        self.validate_affinity()
