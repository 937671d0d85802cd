"""ghz's JSON report, computed from open-loop call records, so ghz tooling can read our runs.

Shape, types and rules follow ghz's reporter (runner/reporter.go, v0.120), so that ghz's own Go types
(and ghz-web, which decodes into them) read it: durations are integer nanoseconds (time.Duration), in
`options` too (`ghz_config.ghz_options`); `date` and each detail's `timestamp` are RFC 3339; `average` is
over every result, `fastest`, `slowest`, `latencyDistribution` and `histogram` over the successful ones;
percentiles are ghz's nearest-rank ones at 10, 25, 50, 75, 90, 95, 99; the histogram has ten equal
buckets between the fastest and the slowest plus one at the slowest, marks in seconds; status codes use
Go's names and errors ghz's "rpc error: code = … desc = …" text; `name` and `tags` are top-level. One
addition, `sendLag` (which Go's decoder skips as an unknown field), tells how late the generator itself
sent requests (already included in every latency, since latencies count from the intended send time).
"""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from services.loadgen.openloop import CallRecord

PERCENTAGES = (10, 25, 50, 75, 90, 95, 99)
HISTOGRAM_BUCKETS = 10
_NS = 1e9


def go_code_name(code: grpc.StatusCode) -> str:
    """The status code as Go's `codes.Code.String()` spells it (ghz's statusCodeDistribution keys)."""
    if code == grpc.StatusCode.OK:
        return "OK"
    if code == grpc.StatusCode.CANCELLED:
        return "Canceled"
    return "".join(word.capitalize() for word in code.name.split("_"))


def _ns(seconds: float) -> int:
    return round(seconds * _NS)


def latency_distribution(sorted_latencies_s: Sequence[float]) -> list[dict[str, int]]:
    """ghz's nearest-rank percentiles of ascending latencies."""
    count = len(sorted_latencies_s)
    distribution = []
    for percentage in PERCENTAGES:
        rank = percentage / 100 * count
        index = max(int(rank) - 1 if rank == int(rank) else int(rank), 0)
        distribution.append({"percentage": percentage, "latency": _ns(sorted_latencies_s[index])})
    return distribution


def histogram(sorted_latencies_s: Sequence[float]) -> list[dict[str, float]]:
    fastest, slowest = sorted_latencies_s[0], sorted_latencies_s[-1]
    width = (slowest - fastest) / HISTOGRAM_BUCKETS
    marks = np.array([fastest + width * i for i in range(HISTOGRAM_BUCKETS)] + [slowest])
    # Each latency falls in the first bucket whose mark is at or above it.
    counts = np.bincount(np.searchsorted(marks, sorted_latencies_s, side="left"), minlength=len(marks))
    total = len(sorted_latencies_s)
    return [
        {"mark": float(mark), "count": int(n), "frequency": float(n) / total}
        for mark, n in zip(marks, counts[: len(marks)], strict=True)
    ]


def rfc3339(moment: datetime.datetime, fraction: bool = True) -> str:
    """`moment` as Go writes a time.Time in JSON (RFC 3339, "Z" for UTC); whole seconds for ghz's `date`."""
    text = moment.astimezone(datetime.UTC).isoformat(timespec="microseconds" if fraction else "seconds")
    return text.replace("+00:00", "Z")


def _error_text(record: CallRecord) -> str:
    return f"rpc error: code = {go_code_name(record.code)} desc = {record.details}"


def ghz_report(
    records: Sequence[CallRecord],
    total_s: float,
    started_at: datetime.datetime,
    options: Mapping[str, Any],
    end_reason: str = "normal",
    skip_first: int = 0,
    name: str = "",
    tags: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The ghz JSON report of a run that began at `started_at` and lasted `total_s` seconds; `options` are
    ghz's (`ghz_config.ghz_options`), `name` and `tags` the config's."""
    kept = sorted(records, key=lambda record: record.index)[skip_first:]
    ok_latencies = sorted(record.latency_s for record in kept if record.ok)
    report: dict[str, Any] = {
        "date": rfc3339(datetime.datetime.now(datetime.UTC), fraction=False),
        "endReason": end_reason,
        "options": dict(options),
        "count": len(kept),
        "total": _ns(total_s),
        "average": _ns(float(np.mean([record.latency_s for record in kept]))) if kept else 0,
        "fastest": _ns(ok_latencies[0]) if ok_latencies else 0,
        "slowest": _ns(ok_latencies[-1]) if ok_latencies else 0,
        "rps": len(kept) / total_s if total_s > 0 else 0.0,
        "errorDistribution": dict(Counter(_error_text(record) for record in kept if not record.ok)),
        "statusCodeDistribution": dict(Counter(go_code_name(record.code) for record in kept)),
        "latencyDistribution": latency_distribution(ok_latencies) if ok_latencies else None,
        "histogram": histogram(ok_latencies) if ok_latencies else None,
        "details": [
            {
                "timestamp": rfc3339(started_at + datetime.timedelta(seconds=record.intended_s)),
                "latency": _ns(record.latency_s),
                "error": "" if record.ok else _error_text(record),
                "status": go_code_name(record.code),
            }
            for record in kept
        ],
    }
    if kept:
        lags = np.array([record.send_lag_s for record in kept])
        report["sendLag"] = {
            "p50": _ns(float(np.percentile(lags, 50))),
            "p99": _ns(float(np.percentile(lags, 99))),
            "max": _ns(float(lags.max())),
        }
    if name:
        report["name"] = name
    if tags:
        report["tags"] = dict(tags)
    return report
