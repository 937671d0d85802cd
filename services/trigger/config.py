"""Trigger settings: each is a flag with a `RELAYGR_…` environment twin (see services.common.config)."""

from __future__ import annotations

import dataclasses

from services.common.config import ServiceConfig, setting

MIB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class TriggerConfig(ServiceConfig):
    port: int = setting(50052, "gRPC port (0 picks a free port)")
    metrics_port: int = setting(9102, "Prometheus metrics port (0 picks a free port; -1 disables)")
    router: str = setting("127.0.0.1:50050", "router (or single ranker) address for PreInfer and GetProfile")
    slo_ms: float = setting(50.0, "ranking latency SLO (P99) in ms", above=0)
    risk_fraction: float = setting(
        0.5,
        "at risk: ranking without relay is predicted to take more than this fraction of the SLO",
        above=0,
    )
    footprint_budget_mb: float = setting(
        512.0,
        "bound on admitted-but-unconsumed prefix KV bytes within the lease window, MiB",
        minimum=0,
    )
    lease_window_ms: int = setting(
        3000,
        "ms an admission's bytes count against the budget and its prefix counts as a duplicate",
        above=0,
    )
    pre_infer_tokens_per_s: float = setting(
        0.0,
        "pre-inferred tokens per second admitted; 0: --load-fraction of the fleet's capacity",
        minimum=0,
    )
    pre_infer_burst_tokens: float = setting(
        0.0, "depth of the token bucket; 0: one second of the rate", minimum=0
    )
    load_fraction: float = setting(
        0.5,
        "share of the fleet's measured pre-inference capacity admitted by default",
        above=0,
    )
    pre_infer_timeout_ms: float = setting(
        50.0, "ms the ranker has to accept or refuse a PreInfer signal", above=0
    )
    profile_refresh_s: float = setting(
        30.0, "seconds between GetProfile refreshes of the latency curve", above=0
    )
    profile_retry_s: float = setting(
        1.0, "seconds between GetProfile attempts until a first profile arrives", above=0
    )
    max_long_term_events: int = setting(8192, "longest long-term sequence accepted", above=0)
    max_short_term_events: int = setting(512, "largest short_term_length accepted", above=0)
    max_candidates: int = setting(1024, "largest num_candidates accepted", above=0)

    def validate(self) -> None:
        super().validate()
        if not self.router:
            raise ValueError("--router must not be empty")
        # A refused PreInfer refunds its admission; the admission must still be in the window to be refunded.
        if self.pre_infer_timeout_ms >= self.lease_window_ms:
            raise ValueError("--pre-infer-timeout-ms must be shorter than --lease-window-ms")

    @property
    def risk_threshold_ms(self) -> float:
        return self.risk_fraction * self.slo_ms

    @property
    def footprint_budget_bytes(self) -> int:
        return int(self.footprint_budget_mb * MIB)
