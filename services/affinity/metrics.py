"""Routing metrics: decisions, calls in flight, member health and failures.

Named `relaygr_router_*` wherever the routing runs: in the router, or in a trigger or retrieval stub that
routes directly (their `job` label tells them apart), so one dashboard panel shows every decision.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

ROUTER_DECISIONS = Counter(
    "relaygr_router_decisions_total",
    "Routing decisions (affinity, hint, spill, failover, hint_unavailable, random), by method.",
    ["method", "decision"],
)
ROUTER_INFLIGHT = Gauge("relaygr_router_inflight", "Requests in flight to each ranker.", ["member"])
ROUTER_MEMBER_HEALTHY = Gauge("relaygr_router_member_healthy", "1 when the member is routable.", ["member"])
ROUTER_FAILURES = Counter(
    "relaygr_router_member_failures_total",
    "Failed forwards per member, by gRPC code.",
    ["member", "grpc_code"],
)
RANK_RETRIES = Counter(
    "relaygr_rank_retries_total",
    "Ranks sent through one target (--router) a second time because the server dropped them unanswered "
    "(UNAVAILABLE, or CANCELLED by a router shutting down), by the dropped attempt's gRPC code.",
    ["grpc_code"],
)
