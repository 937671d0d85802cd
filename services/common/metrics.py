"""Prometheus metrics for every RelayGR service, and the one server interceptor that records them.

Standard gRPC server metrics (the names go-grpc-prometheus made standard, so stock dashboards work):
`grpc_server_started_total`, `grpc_server_handled_total`, `grpc_server_handling_seconds`, labelled
`grpc_type`, `grpc_service`, `grpc_method` (and `grpc_code` on the handled counter).

Relay metrics use consistent label names: `tier` (hbm, dram), `cache_source` (hbm, dram, extended,
miss), `reason`, `decision`, `member`, `outcome`. All metrics live in the default registry, so services
sharing a process (as in tests) share them; `instance` labels come from the scrape.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from google.protobuf.message import DecodeError
from prometheus_client import Counter, Gauge, Histogram

from services.common.errors import InvalidArgument, RequestError

log = logging.getLogger(__name__)

# Fine enough for a P99 anywhere in 1-100 ms, coarse beyond.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0065, 0.008, 0.01, 0.0125, 0.015, 0.0175, 0.02,
    0.025, 0.03, 0.035, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.125, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip

GRPC_STARTED = Counter(
    "grpc_server_started_total", "RPCs started on the server.", ["grpc_type", "grpc_service", "grpc_method"]
)
GRPC_HANDLED = Counter(
    "grpc_server_handled_total",
    "RPCs completed on the server, regardless of success or failure.",
    ["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
)
GRPC_HANDLING_SECONDS = Histogram(
    "grpc_server_handling_seconds",
    "Response latency of RPCs handled by the server.",
    ["grpc_type", "grpc_service", "grpc_method"],
    buckets=LATENCY_BUCKETS,
)

# Ranker
RANK_REQUESTS = Counter(
    "relaygr_rank_requests_total", "Ranks served, by prefix cache source.", ["cache_source"]
)
RANK_MISSES = Counter(
    "relaygr_rank_misses_total", "Ranks that computed their whole prefix, by reason.", ["reason"]
)
RANK_LATENCY = Histogram(
    "relaygr_rank_latency_seconds",
    "Ranker-side Rank latency (queueing and model), by prefix cache source.",
    ["cache_source"],
    buckets=LATENCY_BUCKETS,
)
RANK_LOSSY = Counter(
    "relaygr_rank_lossy_total",
    "Ranks whose prefix came from a lossy (bf16) DRAM copy, by cache source: their scores equal a full "
    "recomputation only within the copy's epsilon.",
    ["cache_source"],
)
PRE_INFER_OUTCOMES = Counter("relaygr_pre_infer_total", "PreInfer signals by outcome.", ["outcome"])
MODEL_SECONDS = Histogram(
    "relaygr_model_seconds",
    "Time on the ranker's device and copy threads per job, by op: pre_infer, extend, rank, uncached "
    "(model passes), reload, demote (tier copies), profile (warm-up).",
    ["op"],
    buckets=LATENCY_BUCKETS,
)
DEVICE_QUEUE_DEPTH = Gauge(
    "relaygr_device_queue_depth", "Model jobs waiting for the device thread, by priority.", ["priority"]
)
SHED_REQUESTS = Counter(
    "relaygr_shed_requests_total",
    "Requests refused before any work, by method and reason.",
    ["method", "reason"],
)
KV_CACHE_BYTES = Gauge("relaygr_kv_cache_bytes", "Bytes of prefix KV held, per tier.", ["tier"])
KV_CACHE_CAPACITY_BYTES = Gauge(
    "relaygr_kv_cache_capacity_bytes", "Byte budget of each cache tier.", ["tier"]
)
KV_CACHE_ENTRIES = Gauge("relaygr_kv_cache_entries", "Prefix KV entries held, per tier.", ["tier"])
KV_CACHE_EVICTIONS = Counter(
    "relaygr_kv_cache_evictions_total", "Entries removed from a tier, by reason.", ["tier", "reason"]
)
LEASES_ACTIVE = Gauge("relaygr_leases_active", "HBM entries leased and not yet consumed.")
LEASE_EXPIRATIONS = Counter(
    "relaygr_lease_expirations_total", "Leases released by their deadline rather than by a consuming Rank."
)
PRODUCTIONS = Counter(
    "relaygr_productions_total",
    "Prefix productions started (compute, reload, extend); joiners do not count.",
    ["kind"],
)
PRODUCTION_JOINS = Counter(
    "relaygr_production_joins_total", "Requests that joined an in-flight production instead of starting one."
)

# Trigger
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

# Router
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

# Retrieval stub
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


def _split_method(full_method: str) -> tuple[str, str]:
    service, _, method = full_method.lstrip("/").partition("/")
    return service, method


class ServerInterceptor(grpc.aio.ServerInterceptor):
    """Records the standard gRPC server metrics with true status codes, and maps domain errors.

    `RequestError`s become their status code; errors from a downstream call (`AioRpcError`) keep their
    code, so a proxy never turns UNAVAILABLE into UNKNOWN. Requests are parsed here rather than by gRPC,
    whose own parse failure would answer UNKNOWN: bytes that are no valid request are INVALID_ARGUMENT.
    Cancellation is reported as CANCELLED, or DEADLINE_EXCEEDED when the deadline has passed.
    """

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler  # streaming RPCs (health Watch, reflection) are not instrumented
        service, method = _split_method(handler_call_details.method)
        behavior = handler.unary_unary
        parse = handler.request_deserializer

        async def instrumented(request, context: grpc.aio.ServicerContext):
            GRPC_STARTED.labels("unary", service, method).inc()
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                if parse is not None:
                    request = _parse(parse, request)
                return await behavior(request, context)
            except RequestError as exc:
                code = exc.code
                await context.abort(exc.code, exc.message)
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                await context.abort(code, exc.details() or code.name)
            except asyncio.CancelledError:
                remaining = context.time_remaining()
                expired = remaining is not None and remaining <= 0
                code = grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED
                raise
            except grpc.aio.AbortError:
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            except Exception:
                log.exception("unhandled error in %s/%s", service, method)
                code = grpc.StatusCode.INTERNAL
                await context.abort(code, "internal error")
            finally:
                set_code = context.code()
                if code == grpc.StatusCode.OK and set_code not in (None, grpc.StatusCode.OK):
                    code = set_code
                GRPC_HANDLED.labels("unary", service, method, code.name).inc()
                GRPC_HANDLING_SECONDS.labels("unary", service, method).observe(time.perf_counter() - started)

        return grpc.unary_unary_rpc_method_handler(
            instrumented,
            request_deserializer=None,
            response_serializer=handler.response_serializer,
        )


def _parse(deserialize, raw: bytes):
    try:
        return deserialize(raw)
    except DecodeError as exc:
        raise InvalidArgument("request", f"is not a valid protobuf message ({exc})") from exc


def enum_label(enum_type, value: int) -> str:
    """A protobuf enum value as a metric label: MISS_REASON_STALE_PREFIX → stale_prefix."""
    prefix = enum_type.Name(0).removesuffix("UNSPECIFIED")
    return enum_type.Name(value).removeprefix(prefix).lower()


def enum_labels(enum_type) -> list[tuple[str]]:
    """Every value of a protobuf enum but UNSPECIFIED, as one-label tuples for `precreate`."""
    return [(enum_label(enum_type, value),) for value in enum_type.values() if value != 0]


def precreate(metric, *label_sets: tuple[str, ...]) -> None:
    """Creates the series of every known label combination at zero, so dashboards and rates see them
    before their first event (a series that appears with its first increment loses that increment)."""
    for labels in label_sets:
        metric.labels(*labels)
