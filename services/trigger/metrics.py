"""The trigger's metrics: Admit decisions by reason, the footprint against its budget, the load bucket."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import LATENCY_BUCKETS

TRIGGER_DECISIONS = Counter(
    "relaygr_trigger_decisions_total", "Admit decisions, by decision and reason.", ["decision", "reason"]
)
TRIGGER_FOOTPRINT_BYTES = Gauge(
    "relaygr_trigger_footprint_bytes", "Admitted-but-unconsumed prefix bytes within the lease window."
)
TRIGGER_FOOTPRINT_BUDGET_BYTES = Gauge(
    "relaygr_trigger_footprint_budget_bytes", "Bound on admitted-but-unconsumed prefix bytes."
)
TRIGGER_TOKENS_AVAILABLE = Gauge(
    "relaygr_trigger_tokens_available", "Pre-inference tokens left in the load bucket."
)
TRIGGER_PREDICTED_SECONDS = Histogram(
    "relaygr_trigger_predicted_rank_seconds",
    "Predicted ranking latency without relay, per Admit.",
    buckets=LATENCY_BUCKETS,
)
