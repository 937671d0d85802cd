"""LoadGen's verdict and figures, read from the `mlperf_log_summary.txt` and `mlperf_log_detail.txt` it
wrote.

The summary is `key : value` lines; this reads the ones a result needs: the scenario, `Result is`
(VALID or INVALID), the constraints LoadGen checked (each `Yes`/`NO`), the throughput and the latency
percentiles. A key LoadGen did not write for the scenario (Offline has no performance constraint and no
early stopping) reads as None. A file without `Result is` is refused: LoadGen did not finish it. The
detail log is `:::MLLOG {json}` lines; from it come the samples LoadGen issued (`result_query_count` times
`generated_samples_per_query`), its count of queries over the latency target and of its own errors.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

SUMMARY_FILE = "mlperf_log_summary.txt"
DETAIL_FILE = "mlperf_log_detail.txt"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoadGenSummary:
    """What LoadGen concluded about one run; latencies in ms (LoadGen writes ns)."""

    scenario: str
    result: str  # VALID or INVALID, as LoadGen wrote it
    performance_constraints: bool | None  # P99 within the target (Server only)
    min_duration: bool | None
    min_queries: bool | None
    early_stopping: bool | None  # Server only
    samples_per_s: float | None  # Server: completed samples per second; Offline: samples per second
    scheduled_per_s: float | None  # Server only
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    issued_samples: int  # samples LoadGen issued (the detail log's query count times samples per query)
    overlatency_queries: int | None  # Server: queries over the target latency
    loadgen_errors: int  # errors LoadGen itself logged

    @property
    def valid(self) -> bool:
        return self.result == "VALID"


def _fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon and key.strip() and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return fields


def _yes(value: str | None) -> bool | None:
    return None if value is None else value.lower() == "yes"


def _number(value: str | None) -> float | None:
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def _ms(value: str | None) -> float | None:
    ns = _number(value)
    return None if ns is None else round(ns / 1e6, 3)


def _count(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def parse_detail(text: str) -> dict[str, object]:
    """The detail log's entries, key → value (the first of each key)."""
    entries: dict[str, object] = {}
    for line in text.splitlines():
        if line.startswith(":::MLLOG "):
            entry = json.loads(line.removeprefix(":::MLLOG "))
            entries.setdefault(entry["key"], entry["value"])
    return entries


def parse_summary(text: str, detail: dict[str, object]) -> LoadGenSummary:
    """The summary's verdict and figures with the detail log's counts (`parse_detail`); ValueError when the
    summary has no `Result is` line or the detail log no query count."""
    f = _fields(text)
    if "result_query_count" not in detail:
        raise ValueError("LoadGen's detail log has no result_query_count: the run did not finish")
    if "Result is" not in f:
        raise ValueError("LoadGen's summary has no 'Result is' line: the run did not finish")
    return LoadGenSummary(
        scenario=f.get("Scenario", ""),
        result=f["Result is"],
        performance_constraints=_yes(f.get("Performance constraints satisfied")),
        min_duration=_yes(f.get("Min duration satisfied")),
        min_queries=_yes(f.get("Min queries satisfied")),
        early_stopping=_yes(f.get("Early stopping satisfied")),
        samples_per_s=_number(f.get("Completed samples per second", f.get("Samples per second"))),
        scheduled_per_s=_number(f.get("Scheduled samples per second")),
        p50_ms=_ms(f.get("50.00 percentile latency (ns)")),
        p90_ms=_ms(f.get("90.00 percentile latency (ns)")),
        p99_ms=_ms(f.get("99.00 percentile latency (ns)")),
        max_ms=_ms(f.get("Max latency (ns)")),
        issued_samples=int(detail["result_query_count"]) * int(detail.get("generated_samples_per_query", 1)),
        overlatency_queries=_count(detail.get("result_overlatency_query_count")),
        loadgen_errors=int(detail.get("num_errors", 0)),
    )


def read_summary(folder: Path) -> LoadGenSummary:
    """The verdict LoadGen wrote into `folder`."""
    return parse_summary(
        (folder / SUMMARY_FILE).read_text(), parse_detail((folder / DETAIL_FILE).read_text())
    )
