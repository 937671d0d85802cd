"""Trigger settings: each is a flag with a `RELAYGR_…` environment twin (see services.common.config)."""

from __future__ import annotations

import dataclasses

from services.affinity.settings import AffinitySettings
from services.common.config import ServiceConfig, check_target, setting
from services.common.settings import RelaySettings, RequestLimits


@dataclasses.dataclass(frozen=True)
class TriggerConfig(RequestLimits, RelaySettings, AffinitySettings, ServiceConfig):
    port: int = setting(50052, "gRPC port (0 picks a free port)")
    metrics_port: int = setting(9102, "Prometheus metrics port (0 picks a free port; -1 disables)")
    router: str = setting(
        "127.0.0.1:50050",
        "gRPC target of the routers (or one ranker) for PreInfer and GetProfile: host:port, dns:///name:port "
        "or ipv4:a:p,b:q (unused with --rankers or --rankers-srv)",
    )
    slo_ms: float = setting(
        50.0,
        "ranking latency SLO (P99) in ms: a request whose queue wait plus miss would exceed it must relay "
        "(it is exempt from shedding)",
        above=0,
    )
    admit_all: bool = setting(
        False, "admit every request that is not a duplicate: no gain test, no brakes (an ablation)"
    )
    relay_overhead_ms: float = setting(
        2.0,
        "cost of relaying a prefix (the PreInfer round trip), ms: a request is admitted only when its "
        "prefix's own computation, which relay moves off the critical path, is predicted to cost more",
        minimum=0,
    )
    lease_window_ms: int = setting(
        3000, "ms an admitted prefix counts as a duplicate (the rankers' lease TTL)", above=0
    )
    waste_budget: float = setting(
        0.15,
        "brake: share of the fleet's device time that pre-inference no Rank consumed may take",
        above=0,
    )
    waste_window_s: float = setting(10.0, "seconds over which the wasted share is measured", above=0)
    hbm_lease_fraction: float = setting(
        0.5,
        "brake: share of a ranker's HBM budget that pre-inferred, unconsumed prefixes may hold",
        above=0,
    )
    replicas: int = setting(
        1,
        "trigger replicas admitting to the same rankers (with an autoscaler, its maximum): each keeps what "
        "its own admissions may hold on a ranker within 1/replicas of the --hbm-lease-fraction share",
        above=0,
    )
    max_backlog_ms: float = setting(
        1000.0,
        "brake: device ms of pre-inference queued on one ranker at which no prefix is admitted to it (as the "
        "rankers' --max-pre-infer-backlog-ms)",
        above=0,
    )
    unknown_curve_min_events: int = setting(
        256,
        "while the fleet's latency curve is provisional, histories of at least this many events are relayed, "
        "without the gain test or the backlog brake",
        above=0,
    )
    shed_high_water: float = setting(
        0.8, "brake pressure (usage over limit) at which the shedding threshold rises", above=0
    )
    shed_low_water: float = setting(
        0.5, "brake pressure at or below which the shedding threshold falls", minimum=0
    )
    shed_adjust_ms: float = setting(100.0, "ms between adjustments of the shedding threshold", above=0)
    shed_step: float = setting(1.5, "factor by which the shedding threshold rises or falls", above=1)
    shed_floor_events: int = setting(
        256, "the shedding threshold's first step; below it, the threshold is 0 (nothing shed)", above=0
    )
    pre_infer_timeout_ms: float = setting(
        50.0, "ms the ranker has to accept or refuse a PreInfer signal", above=0
    )
    pre_infer_batch_window_ms: float = setting(
        10.0,
        "routing directly, ms within which the PreInfers bound for one ranker go as one PreInferBatch call "
        "(0: each sent alone)",
        minimum=0,
    )
    pre_infer_batch_max: int = setting(
        32,
        "most PreInfers in one PreInferBatch call: a full batch is sent at once (at most the rankers' "
        "--max-pre-infer-batch)",
        above=0,
    )
    profile_refresh_s: float = setting(
        10.0, "seconds between GetProfile refreshes of the latency curve and the ring's members", above=0
    )
    profile_retry_s: float = setting(
        1.0, "seconds between GetProfile attempts until a first profile arrives", above=0
    )

    @property
    def placement_window_ms(self) -> float:
        """The window the admission places prefixes against: `relay_window_ms` where this trigger routes
        its PreInfer calls itself; 0 through a router, whose own ring places PreInfer (the trigger's view
        of the users' placement then follows that ring, without moving a prefix off its owner)."""
        return self.relay_window_ms if self.routes_directly else 0.0

    def validate(self) -> None:
        super().validate()
        self.validate_affinity()
        if not self.routes_directly:
            if not self.router:
                raise ValueError("--router must not be empty")
            check_target(self.router, "--router")
        # A refused PreInfer refunds its admission; the admission must still be in the window to be refunded.
        if self.pre_infer_timeout_ms >= self.lease_window_ms:
            raise ValueError("--pre-infer-timeout-ms must be shorter than --lease-window-ms")
        # A PreInfer waits the window before it is sent, within its own timeout.
        if self.pre_infer_batch_window_ms >= self.pre_infer_timeout_ms:
            raise ValueError("--pre-infer-batch-window-ms must be shorter than --pre-infer-timeout-ms")
        if self.shed_low_water >= self.shed_high_water:
            raise ValueError("--shed-low-water must be below --shed-high-water")
