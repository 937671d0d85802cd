"""What `python -m bench mlperf` writes and reads back (`bench.lib.codec`): a `RunResult` per LoadGen run,
a `SearchResult` per search. `read_summary` reads LoadGen's verdict from its summary's `key : value` lines (a
key it did not write for the scenario reads as None) and the first entry of each key of its detail log. A
run is VALID here when LoadGen says VALID and no more of its samples failed than `max_error_fraction` allows.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, TypeVar

from bench.lib import codec, context, envelope
from bench.lib.schema import Percentiles

SUMMARY_FILE = "mlperf_log_summary.txt"
DETAIL_FILE = "mlperf_log_detail.txt"
T = TypeVar("T")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSettings:
    """What one LoadGen run was asked to do."""

    mode: str  # relay, baseline, or external (--recommend)
    target: str  # the RecommendService driven, host:port
    scenario: str
    target_qps: float
    p99_target_ms: float
    duration_s: float
    min_query_count: int
    seed: int
    max_in_flight: int
    timeout_s: float
    max_error_fraction: float
    top_k: int
    relay_window_ms: float | None  # None for an external stub (its own)
    namespace: str
    users: int  # the QSL's size


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
    issued_samples: int
    overlatency_queries: int | None  # Server: queries over the target latency
    loadgen_errors: int

    @property
    def valid(self) -> bool:
        return self.result == "VALID"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tiers:
    """Where the ranked answers' prefixes came from (`bench.mlperf.tally`)."""

    ranked: int  # answered calls that were ranked (not abandoned upstream)
    counts: dict[str, int]  # per tier: hbm, dram, extended, miss
    rates: dict[str, float]  # counts / ranked; they add up to 1 (all 0 without a ranked answer)
    later_visits: int  # ranked answers after their user's first answered visit of the run
    later_counts: dict[str, int]
    later_rates: dict[str, float]
    miss_reasons: dict[str, int]
    admitted: int  # answers whose Admit fired a pre-inference


@dataclasses.dataclass(frozen=True, kw_only=True)
class History:
    """History tokens (long-term + short-term events) of the ranked answers, and those computed on the
    Ranks' critical paths (`bench.mlperf.tally`)."""

    short_term: int  # short-term events per request
    tokens: int
    tokens_by_tier: dict[str, int]
    computed: int  # computed_prefix + computed_short_term
    computed_prefix: int  # the sum of the answers' computed_prefix_events
    computed_short_term: int  # short_term times the ranked answers
    computed_share: float  # computed / tokens
    computed_by_tier: dict[str, int]
    computed_share_by_tier: dict[str, float]  # computed_by_tier / tokens_by_tier (0 for an empty tier)
    mean_long_term: float
    extended_computed_mean: float | None  # EXTENDED: mean computed_prefix_events (0 for a joined extension)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrefixWait:
    """The Ranks' waits for their long-term prefix (`prefix_wait_ms`), ms, of the ranked answers."""

    all: Percentiles
    by_tier: dict[str, Percentiles]  # hbm: a prefix ready (about 0) or a pre-inference still running (joined)
    hbm_over_1ms: int  # HBM answers that waited over 1 ms: they joined a pre-inference still running


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunResult:
    """One LoadGen run: LoadGen's verdict and figures, the calls' outcomes, and the cache's tally."""

    settings: RunSettings
    loadgen: LoadGenSummary
    completed: int  # samples the SUT completed (answered or failed): equals loadgen.issued_samples
    failed: int
    error_codes: dict[str, int]
    valid: bool  # LoadGen's VALID and failures within max_error_fraction
    tiers: Tiers
    history: History
    prefix_wait_ms: PrefixWait
    # Of the answered calls: the Rank through the router as the stub timed it, the Recommend as the SUT did.
    rank_ms: Percentiles
    recommend_ms: Percentiles
    distinct_users: int  # users with at least one answered visit
    visits_per_user: float  # answered visits per such user
    wall_s: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModeSearch:
    """One mode's search: its runs in the order measured, and the highest VALID target QPS (None: none)."""

    mode: str
    runs: list[RunResult]
    best_qps: float | None

    def best(self) -> RunResult | None:
        """The run at `best_qps`."""
        return next((run for run in self.runs if run.settings.target_qps == self.best_qps), None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchResult:
    """A search of every mode on fleets of one shape."""

    started_at: str
    wall_s: float
    git_commit: str
    cores: int | None
    load_average_start: list[float]  # the machine's 1, 5 and 15 minute load averages at the start
    load_average_end: list[float]
    configuration: dict[str, Any]  # the command's settings (bench.mlperf.config.MlperfConfig)
    modes: dict[str, ModeSearch]
    # The host's unit u (bench.lib.floor.host_unit_ms) beside the absolute target; older searches lack it.
    host_unit_ms: float | None = dataclasses.field(default=None, metadata=codec.OMIT_NONE)


def read_summary(folder: Path) -> LoadGenSummary:
    """The verdict and figures LoadGen wrote into `folder`; ValueError when its summary has no `Result is`
    line or its detail log no query count: LoadGen did not finish the run."""
    f: dict[str, str] = {}
    for line in (folder / SUMMARY_FILE).read_text().splitlines():
        key, colon, value = line.partition(":")
        if colon and key.strip():
            f.setdefault(key.strip(), value.strip())
    detail: dict[str, Any] = {}
    for line in (folder / DETAIL_FILE).read_text().splitlines():
        if line.startswith(":::MLLOG "):
            entry = json.loads(line.removeprefix(":::MLLOG "))
            detail.setdefault(entry["key"], entry["value"])
    if "result_query_count" not in detail:
        raise ValueError("LoadGen's detail log has no result_query_count: the run did not finish")
    if "Result is" not in f:
        raise ValueError("LoadGen's summary has no 'Result is' line: the run did not finish")

    def number(key: str, ns: bool = False) -> float | None:
        try:
            return round(float(f[key]) / 1e6, 3) if ns else float(f[key])
        except (KeyError, ValueError):
            return None

    def yes(key: str) -> bool | None:
        return None if key not in f else f[key].lower() == "yes"

    overlatency = detail.get("result_overlatency_query_count")
    return LoadGenSummary(
        scenario=f.get("Scenario", ""),
        result=f["Result is"],
        performance_constraints=yes("Performance constraints satisfied"),
        min_duration=yes("Min duration satisfied"),
        min_queries=yes("Min queries satisfied"),
        early_stopping=yes("Early stopping satisfied"),
        samples_per_s=number(
            "Completed samples per second" if "Completed samples per second" in f else "Samples per second"
        ),
        scheduled_per_s=number("Scheduled samples per second"),
        p50_ms=number("50.00 percentile latency (ns)", ns=True),
        p90_ms=number("90.00 percentile latency (ns)", ns=True),
        p99_ms=number("99.00 percentile latency (ns)", ns=True),
        max_ms=number("Max latency (ns)", ns=True),
        issued_samples=int(detail["result_query_count"]) * int(detail.get("generated_samples_per_query", 1)),
        overlatency_queries=None if overlatency is None else int(overlatency),
        loadgen_errors=int(detail.get("num_errors", 0)),
    )


def _command(cls: type) -> str:
    """The envelope's command of a result: the search's, or one LoadGen run's (`bench.lib.envelope`)."""
    return "mlperf" if cls is SearchResult else "mlperf-run"


def write_json(value: RunResult | SearchResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    envelope.write(path, _command(type(value)), codec.to_json(value), **context.provenance())


def read_json(cls: type[T], path: Path) -> T:
    """A result written by `write_json`, checked field by field (`bench.lib.codec.from_json`)."""
    return codec.from_json(cls, envelope.read(path, _command(cls)), str(path))
