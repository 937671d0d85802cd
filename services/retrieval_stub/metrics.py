"""The retrieval stub's metrics: Recommend latency (end to end, and its Rank stage), Recommends by
cache source, Recommends abandoned before ranking, and Admits that failed. An abandoned Recommend is
counted only in `relaygr_recommend_abandoned_total`: the latency and cache-source series describe
Recommends that were ranked."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from services.common.metrics import LATENCY_BUCKETS

RECOMMEND_LATENCY = Histogram(
    "relaygr_recommend_latency_seconds",
    "End-to-end Recommend latency, and the Rank stage within it.",
    ["stage"],
    buckets=LATENCY_BUCKETS,
)
RECOMMENDS = Counter(
    "relaygr_recommend_total", "Recommends served, by cache source of their ranking.", ["cache_source"]
)
RECOMMEND_ADMIT_FAILURES = Counter(
    "relaygr_recommend_admit_failures_total",
    "Admit calls that failed or timed out (the Recommend went on without relay), by gRPC code.",
    ["grpc_code"],
)
RECOMMEND_ABANDONED = Counter(
    "relaygr_recommend_abandoned_total",
    "Recommends filtered upstream after retrieval (--abandon-fraction): Admit sent, no Rank.",
)
