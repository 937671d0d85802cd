"""The trigger's metrics: Admit decisions by reason, failed PreInfer calls, the PreInfers coalesced into
batches and those sent alone, the brakes' pressure and the shedding threshold."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import LATENCY_BUCKETS

TRIGGER_DECISIONS = Counter(
    "relaygr_trigger_decisions_total", "Admit decisions, by decision and reason.", ["decision", "reason"]
)
TRIGGER_PRE_INFER_FAILURES = Counter(
    "relaygr_trigger_pre_infer_failures_total",
    "PreInfer calls that failed, an RPC error or a missed --pre-infer-timeout-ms, by gRPC code: answered "
    "RANKER_REFUSED with no ranker having refused (rankers count refusals in relaygr_pre_infer_total).",
    ["code"],
)
TRIGGER_PRE_INFER_BATCH_SIZE = Histogram(
    "relaygr_trigger_pre_infer_batch_size",
    "PreInfers per call sent coalesced (for one ranker within --pre-infer-batch-window-ms): one "
    "PreInferBatch call each, or a single PreInfer for a window that closed with one.",
    buckets=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64),
)
TRIGGER_PRE_INFER_ALONE = Counter(
    "relaygr_trigger_pre_infer_alone_total",
    "PreInfers sent alone as single calls, by why: window_off (coalescing off), would_miss_rank (its "
    "pre-inference plus the window would outlast the relay window), through_router (no member known).",
    ["reason"],
)
TRIGGER_MUST_RELAY = Counter(
    "relaygr_trigger_must_relay_total",
    "Admits whose queue wait plus miss was predicted to exceed the SLO (exempt from shedding), by decision.",
    ["decision"],
)
TRIGGER_BRAKE_PRESSURE = Gauge(
    "relaygr_trigger_brake_pressure",
    "Each brake's usage over its limit at the last decision (waste: the fleet's; hbm, backlog: the target "
    "ranker's, with that request); at 1 the brake binds.",
    ["brake"],
)
TRIGGER_SHED_THRESHOLD = Gauge(
    "relaygr_trigger_shed_threshold_events",
    "Prefixes shorter than this are shed while the brakes press (0: none is).",
)
TRIGGER_PREDICTED_SECONDS = Histogram(
    "relaygr_trigger_predicted_rank_seconds",
    "Predicted ranking latency without relay, per Admit.",
    buckets=LATENCY_BUCKETS,
)
