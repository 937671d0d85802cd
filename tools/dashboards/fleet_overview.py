"""The fleet overview: is the relay paying off, is ranking within its SLO, is the fleet healthy."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard

from tools.dashboards.panels import (
    SLO_LINE,
    Row,
    Target,
    build_dashboard,
    fleet_jobs,
    latency_against_slo_panel,
    p99_target,
    quantile,
    ratio,
    selector,
    stat_panel,
    summed_rate,
    timeseries_panel,
)

UID = "relaygr-fleet-overview"

RANKER = selector("ranker")
RANKER_HITS = selector("ranker", 'cache_source!="miss"')
RANKER_WITHIN_SLO = selector("ranker", 'le="$slo"')
# Every Rank ends on a ranker, whichever process routed it (the retrieval stubs route their own directly,
# external callers go through the router): the rankers' gRPC handling of Rank is what the SLO measures.
RANKER_RANK = selector("ranker", 'grpc_method="Rank"')
RANKER_RANK_WITHIN_SLO = selector("ranker", 'grpc_method="Rank"', 'le="$slo"')
FLEET = selector(fleet_jobs())
FLEET_ERRORS = selector(fleet_jobs(), 'grpc_code!="OK"')
STUB = selector("retrieval-stub")

RANKS = summed_rate("relaygr_rank_requests_total", RANKER)
HIT_RATIO = ratio(summed_rate("relaygr_rank_requests_total", RANKER_HITS), RANKS)
HIT_RATIO_BY_TIER = ratio(
    summed_rate("relaygr_rank_requests_total", RANKER_HITS, by="cache_source"),
    RANKS,
    matching="ignoring(cache_source) group_left",
)
SLO_COMPLIANCE = ratio(
    summed_rate("grpc_server_handling_seconds_bucket", RANKER_RANK_WITHIN_SLO),
    summed_rate("grpc_server_handling_seconds_count", RANKER_RANK),
)
MODEL_SLO_COMPLIANCE = ratio(
    summed_rate("relaygr_rank_latency_seconds_bucket", RANKER_WITHIN_SLO),
    summed_rate("relaygr_rank_latency_seconds_count", RANKER),
)

_PERCENT_GOOD = ((None, "red"), (0.95, "orange"), (0.99, "green"))


def build() -> dashboard.Dashboard:
    relay = Row(
        "Relay cache",
        [
            stat_panel(
                "Cache hit ratio",
                "Share of Ranks that reused a cached prefix from any tier instead of computing it.",
                "percentunit",
                Target(HIT_RATIO, "hit ratio"),
                thresholds=((None, "red"), (0.3, "orange"), (0.6, "green")),
            ),
            stat_panel(
                "Rank SLO compliance",
                "Share of Ranks the rankers answered within the SLO (their gRPC handling time), every Rank "
                "whichever process routed it.",
                "percentunit",
                Target(SLO_COMPLIANCE, "within SLO"),
                thresholds=_PERCENT_GOOD,
            ),
            stat_panel(
                "Rank P99",
                "Rank P99 on the rankers (gRPC handling time), every Rank whichever process routed it: the "
                "retrieval stubs' own and external callers' through the router. The SLO alert's measure.",
                "s",
                Target(quantile(0.99, "grpc_server_handling_seconds", RANKER_RANK), "P99"),
                thresholds=((None, "green"), (0.05, "red")),
            ),
            stat_panel(
                "Recommend QPS",
                "End-to-end requests served by the retrieval stubs.",
                "reqps",
                Target(summed_rate("relaygr_recommend_total", STUB), "QPS"),
            ),
            timeseries_panel(
                "Cache hit ratio by tier",
                "Ranks served from each tier, as a share of all Ranks: HBM (pre-inferred and leased), "
                "DRAM (reloaded) and extended (a cached prefix plus the events appended since). "
                "Stacked, they add up to the hit ratio.",
                "percentunit",
                [Target(HIT_RATIO_BY_TIER, "{{cache_source}}")],
                stacked=True,
            ),
            timeseries_panel(
                "Ranks by cache source",
                "Ranks per second by where their prefix came from.",
                "reqps",
                [
                    Target(
                        summed_rate("relaygr_rank_requests_total", RANKER, by="cache_source"),
                        "{{cache_source}}",
                    )
                ],
                stacked=True,
            ),
        ],
    )
    latency = Row(
        "Ranking latency",
        [
            latency_against_slo_panel(
                "Rank latency on the rankers",
                "P50 and P99 of Rank as the rankers serve it (gRPC handling time, from arrival to answer), "
                "against the SLO: every Rank, whichever process routed it. What the SLO alert measures.",
                "grpc_server_handling_seconds",
                RANKER_RANK,
            ),
            latency_against_slo_panel(
                "Rank queueing and model time",
                "P50 and P99 of the ranker-side Rank latency (queueing, prefix wait and model) of the Ranks "
                "the rankers ran, against the SLO; shed and failed Ranks are left out.",
                "relaygr_rank_latency_seconds",
                RANKER,
            ),
            timeseries_panel(
                "Rank P99 by cache source",
                "Ranker-side P99 per prefix source: a hit skips the long-term prefix, a miss computes it.",
                "s",
                [
                    p99_target("relaygr_rank_latency_seconds", RANKER, "{{cache_source}}", by="cache_source"),
                    SLO_LINE,
                ],
                dashed="SLO",
            ),
            timeseries_panel(
                "SLO compliance",
                "Share of Ranks within the SLO on the rankers: by their gRPC handling time (every Rank, the "
                "SLO's measure) and by their queueing and model time (the Ranks they ran).",
                "percentunit",
                [Target(SLO_COMPLIANCE, "gRPC handling"), Target(MODEL_SLO_COMPLIANCE, "queueing and model")],
            ),
        ],
    )
    traffic = Row(
        "Traffic and errors",
        [
            timeseries_panel(
                "Requests by service and method",
                "RPCs handled per second by every service of the fleet.",
                "reqps",
                [
                    Target(
                        summed_rate("grpc_server_handled_total", FLEET, by="job, grpc_method"),
                        "{{job}} {{grpc_method}}",
                    )
                ],
            ),
            timeseries_panel(
                "Errors by code",
                "RPCs that did not end OK, per second, by service, method and status code.",
                "reqps",
                [
                    Target(
                        summed_rate(
                            "grpc_server_handled_total", FLEET_ERRORS, by="job, grpc_method, grpc_code"
                        ),
                        "{{job}} {{grpc_method}} {{grpc_code}}",
                    )
                ],
            ),
            timeseries_panel(
                "Recommend latency",
                "End-to-end Recommend P50 and P99 at the retrieval stubs, and the Rank stage within it.",
                "s",
                [
                    Target(
                        quantile(0.5, "relaygr_recommend_latency_seconds", STUB, by="stage"), "P50 {{stage}}"
                    ),
                    p99_target("relaygr_recommend_latency_seconds", STUB, "P99 {{stage}}", by="stage"),
                ],
            ),
            timeseries_panel(
                "Shed requests",
                "Requests the rankers refused before doing any work, by method and reason.",
                "reqps",
                [
                    Target(
                        summed_rate("relaygr_shed_requests_total", RANKER, by="method, reason"),
                        "{{method}} {{reason}}",
                    )
                ],
            ),
            timeseries_panel(
                "Garbage-collection pauses",
                "P99 of the pauses the Python garbage collector stopped each service for, by generation (2: "
                "a full collection; every call in flight waits for it). Services freeze their warm heap "
                "(--gc-freeze), so a full collection should take milliseconds.",
                "s",
                [
                    p99_target(
                        "relaygr_gc_pause_seconds",
                        FLEET,
                        "P99 {{job}} gen {{generation}}",
                        by="job, generation",
                    )
                ],
            ),
        ],
    )
    return build_dashboard(
        UID,
        "RelayGR / Fleet overview",
        "Relay-race serving at a glance: prefix cache hit ratio by tier, ranking latency against the SLO, "
        "traffic and errors.",
        fleet_jobs(),
        [relay, latency, traffic],
    )
