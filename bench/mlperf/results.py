"""What `python -m bench mlperf` writes: one `RunResult` per LoadGen run (its folder's result.json), and
for `--search` one `SearchResult` (the output folder's result.json), as dataclasses that `bench.lib.codec`
writes and reads back.

A run is VALID here when LoadGen's summary says `Result is : VALID` and no more of its samples failed
than `max_error_fraction` allows (LoadGen completes a failed call like an answer and cannot tell).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, TypeVar

from bench.lib import codec
from bench.mlperf.summary import LoadGenSummary
from bench.mlperf.tally import History, Latencies, PrefixWait, Tiers

RESULT_FILE = "result.json"
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
class RunResult:
    """One LoadGen run: LoadGen's verdict and figures, the calls' outcomes, and the cache's tally."""

    settings: RunSettings
    loadgen: LoadGenSummary
    completed: int  # samples the SUT completed (answered or failed): equals loadgen.issued_samples
    failed: int
    error_codes: dict[str, int]
    valid: bool  # LoadGen's VALID and failures within max_error_fraction
    tiers: Tiers
    history: History  # history tokens, and those computed on the Ranks' critical paths (exact)
    prefix_wait_ms: PrefixWait  # the Ranks' waits for their long-term prefix, overall and per tier
    rank_ms: Latencies  # the Rank through the router, as the stub timed it
    recommend_ms: Latencies  # the whole Recommend, issue to answer, as the SUT timed it
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
    # The host's unit u (`bench.lib.floor.host_unit_ms`), stated beside LoadGen's absolute P99 target;
    # absent from searches before it was timed.
    host_unit_ms: float | None = dataclasses.field(default=None, metadata=codec.OMIT_NONE)


def write_json(value: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(codec.to_json(value), indent=1) + "\n")


def read_json(cls: type[T], path: Path) -> T:
    """A result written by `write_json`, checked field by field (`bench.lib.codec.from_json`)."""
    return codec.from_json(cls, json.loads(path.read_text()))
