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
    quantile,
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


COALESCED_CALLS = summed_rate("relaygr_trigger_pre_infer_batch_size_count", TRIGGER)
COALESCED_PRE_INFERS = summed_rate("relaygr_trigger_pre_infer_batch_size_sum", TRIGGER)


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
                "PreInfer calls to the rankers",
                "How the trigger's PreInfers reach the rankers, per second: the coalescer's calls (one a "
                "window: a PreInferBatch, or a single PreInfer for a window that closed with one) and the "
                "PreInfers in them; the PreInfers sent alone at once, by why (window_off: coalescing off; "
                "would_miss_rank: its pre-inference plus the window would outlast the relay window; "
                "through_router); and the PreInferBatch calls the rankers scheduled. Fewer calls than "
                "PreInfers is the ranker CPU coalescing saves.",
                "reqps",
                [
                    Target(COALESCED_CALLS, "coalescer's calls"),
                    Target(COALESCED_PRE_INFERS, "PreInfers in them"),
                    Target(
                        summed_rate("relaygr_trigger_pre_infer_alone_total", TRIGGER, by="reason"),
                        "alone: {{reason}}",
                    ),
                    Target(
                        summed_rate("relaygr_pre_infer_batch_size_count", RANKER),
                        "PreInferBatch calls the rankers scheduled",
                    ),
                ],
            ),
            timeseries_panel(
                "PreInfers per coalesced call",
                "Mean and P99 of the PreInfers in each of the coalescer's calls (a window of one counts "
                "1). Near 1 at a quiet ranker, whose PreInfers go at once; grows with each ranker's "
                "PreInfer rate times --pre-infer-batch-window-ms, up to --pre-infer-batch-max.",
                "short",
                [
                    Target(ratio(COALESCED_PRE_INFERS, COALESCED_CALLS), "mean"),
                    Target(quantile(0.99, "relaygr_trigger_pre_infer_batch_size", TRIGGER), "P99"),
                ],
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
