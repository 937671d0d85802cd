"""The trigger and the routing: why pre-inference was admitted or refused, and where traffic went.

Routing runs in every process that calls the rankers: the trigger routes its PreInfers, the retrieval
stub its Ranks, and the router the calls of callers from outside the fleet. Each exports the same
`relaygr_router_*` series, told apart by `job`, so the routing panels read all three.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard

from tools.dashboards.panels import (
    Row,
    Target,
    build_dashboard,
    fleet_jobs,
    latency_against_slo_panel,
    p99_target,
    ratio,
    selector,
    summed_rate,
    timeseries_panel,
)

UID = "relaygr-trigger-router"

TRIGGER = selector("trigger")
TRIGGER_ADMITTED = selector("trigger", 'decision="admit"')
ROUTING_JOBS = fleet_jobs("trigger", "retrieval-stub", "router")
ROUTING = selector(ROUTING_JOBS)
RANKER = selector("ranker")

ADMISSION_RATIO = ratio(
    summed_rate("relaygr_trigger_decisions_total", TRIGGER_ADMITTED),
    summed_rate("relaygr_trigger_decisions_total", TRIGGER),
)


def build() -> dashboard.Dashboard:
    trigger = Row(
        "Trigger",
        [
            timeseries_panel(
                "Admit decisions by reason",
                "Admit calls per second by decision and reason: admitted, no gain, a brake (waste, hbm or "
                "backlog limit), shed short, duplicate, or refused by the ranker.",
                "reqps",
                [
                    Target(
                        summed_rate("relaygr_trigger_decisions_total", TRIGGER, by="decision, reason"),
                        "{{decision}} {{reason}}",
                    )
                ],
                stacked=True,
            ),
            timeseries_panel(
                "Admission ratio",
                "Share of Admit calls that fired pre-inference.",
                "percentunit",
                [Target(ADMISSION_RATIO, "admitted")],
            ),
            timeseries_panel(
                "Brake pressure",
                "Each brake's usage over its limit at the last decision: waste (the fleet's unconsumed "
                "pre-inference against its budget), hbm and backlog (the target ranker's). At 1 it binds; "
                "above the high water (0.8) the shedding threshold rises.",
                "short",
                [
                    Target(
                        f"max by (brake) (relaygr_trigger_brake_pressure{TRIGGER})",
                        "{{brake}}",
                    )
                ],
            ),
            timeseries_panel(
                "Shedding threshold",
                "Prefixes shorter than this many events are shed while the brakes press (0: none is).",
                "short",
                [Target(f"max by (pod) (relaygr_trigger_shed_threshold_events{TRIGGER})", "{{pod}}")],
            ),
            latency_against_slo_panel(
                "Predicted ranking latency without relay",
                "P50 and P99 of the trigger's prediction, from the rankers' measured latency curve; a "
                "request whose queue wait plus this exceeds the SLO must relay (it is never shed).",
                "relaygr_trigger_predicted_rank_seconds",
                TRIGGER,
            ),
            timeseries_panel(
                "Admit latency",
                "P99 of Admit as the trigger serves it, including the PreInfer signal it fires.",
                "s",
                [p99_target("grpc_server_handling_seconds", selector("trigger", 'grpc_method="Admit"'))],
            ),
        ],
    )
    routing = Row(
        "Routing",
        [
            timeseries_panel(
                "Routing decisions (trigger, stub, router)",
                "Calls routed per second by the process that routed them, method and routing decision: "
                "affinity (the hash ring), hint (the relay hint), spill (bounded load), failover, "
                "hint_unavailable, random. The trigger routes PreInfer, the retrieval stub Rank, the router "
                "the calls of callers from outside the fleet.",
                "reqps",
                [
                    Target(
                        summed_rate("relaygr_router_decisions_total", ROUTING, by="job, method, decision"),
                        "{{job}} {{method}} {{decision}}",
                    )
                ],
                stacked=True,
            ),
            timeseries_panel(
                "In flight per member (trigger, stub, router)",
                "Calls each kind of routing process (its pods summed) has in flight to each ranker. Each "
                "process balances its own calls with the bounded-load ring.",
                "short",
                [Target(f"sum by (job, member) (relaygr_router_inflight{ROUTING})", "{{job}} → {{member}}")],
            ),
            timeseries_panel(
                "Routable members (trigger, stub, router)",
                "1 while a routing process (a trigger, retrieval stub or router pod) may route to a ranker; "
                "0 after failed health checks or an open circuit. Each process keeps its own view.",
                "short",
                [
                    Target(
                        f"min by (job, pod, member) (relaygr_router_member_healthy{ROUTING})",
                        "{{pod}} → {{member}}",
                    )
                ],
            ),
            timeseries_panel(
                "Requests per ranker",
                "Requests per second each ranker handled, as the rankers count them.",
                "reqps",
                [
                    Target(
                        summed_rate("grpc_server_handled_total", RANKER, by="pod, grpc_method"),
                        "{{pod}} {{grpc_method}}",
                    )
                ],
            ),
        ],
    )
    return build_dashboard(
        UID,
        "RelayGR / Trigger and router",
        "Admission of pre-inference by reason, the trigger's footprint and load bounds, and the routing "
        "of every process that routes to the rankers (trigger, retrieval stub, router): decisions, "
        "per-member load and health.",
        fleet_jobs("trigger", "retrieval-stub", "router", "ranker"),
        [trigger, routing],
    )
