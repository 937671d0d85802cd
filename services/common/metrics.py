"""The metrics every RelayGR service shares, and the conventions each service's own `metrics.py` follows.

Standard gRPC server metrics, recorded by `services/common/interceptor.py` (the names go-grpc-prometheus
made standard, so stock dashboards work):
`grpc_server_started_total`, `grpc_server_handled_total`, `grpc_server_handling_seconds`, labelled
`grpc_type`, `grpc_service`, `grpc_method` (and `grpc_code` on the handled counter).

Relay metrics use consistent label names: `tier` (hbm, dram), `cache_source` (hbm, dram, extended,
miss, peer), `reason`, `decision`, `member`, `outcome`. All metrics live in the default registry, so services
sharing a process (as in tests) share them; `instance` labels come from the scrape.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Fine enough for a P99 anywhere in 1-100 ms, coarse beyond.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0065, 0.008, 0.01, 0.0125, 0.015, 0.0175, 0.02,
    0.025, 0.03, 0.035, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.125, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip

SERVING = Gauge(
    "relaygr_serving",
    "1 while this process's health is SERVING, 0 while it starts or drains (tells apart two on one port).",
)
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

GC_PAUSE_SECONDS = Histogram(
    "relaygr_gc_pause_seconds",
    "How long each of the process's garbage collections stopped it, by generation (2: a full collection).",
    ["generation"],
    buckets=LATENCY_BUCKETS,
)
GC_FROZEN_OBJECTS = Gauge(
    "relaygr_gc_frozen_objects",
    "Objects the process froze out of the collector's way once warm (0: --gc-freeze false, or not warm yet).",
)


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


class Children:
    """A labelled metric's series, each looked up once: `Children(METRIC)(*labels)` is
    `METRIC.labels(*labels)` without `labels`' argument checks and locking on every call (a few µs each,
    several times per request on the serving path). Safe for one event loop: two first lookups of a label
    set from two threads would both create the same series, which `labels` itself makes idempotent."""

    def __init__(self, metric) -> None:
        self._metric = metric
        self._series: dict[tuple[str, ...], object] = {}

    def __call__(self, *labels: str):
        series = self._series.get(labels)
        if series is None:
            series = self._series[labels] = self._metric.labels(*labels)
        return series
