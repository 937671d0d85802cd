"""`python -m bench mlperf`'s settings: one frozen dataclass, each a flag with a `RELAYGR_…` environment twin
(services.common.config), parsed by `parse`; alone, the command runs one Server test of RelayGR on a local
`cpu-small` fleet. `--p99-ms 80` is MLPerf DLRMv3's Server target; LoadGen times the whole Recommend, so the
relay window (30 ms, the services' default) counts against it as an upstream stage would. LoadGen's early
stopping calls a Server run VALID at P99 only with at least 459 queries if none is over the target (662 with
one, 838 with two, 1001 with three): `--min-query-count 1000`, far below MLPerf's official minimum for DLRM
(270336); shorter smoke runs end INVALID, every figure still measured. LoadGen has no failed sample, so a
run with more failed calls than `--max-error-fraction` (0) of its samples is INVALID here. The workload: see
`bench.mlperf.run`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from bench.lib.fleets import RELAY_WINDOW_HELP, FleetSettings
from services.common.config import grid, listed, load, setting

SCENARIOS = ("Server", "Offline")
MODES = ("relay", "baseline")
DESCRIPTION = (
    "Drive the fleet's RecommendService.Recommend with MLCommons LoadGen (Server or Offline); with --search, "
    "the highest Server target QPS LoadGen calls VALID, baseline and RelayGR. Synthetic weights and users: "
    "not an MLPerf submission."
)


@dataclasses.dataclass(frozen=True)
class MlperfConfig(FleetSettings):
    """One LoadGen test (or, with `search`, one search per mode). Validated by `parse`."""

    scenario: str = setting("Server", "LoadGen scenario", choices=SCENARIOS)
    target_qps: float = setting(
        10.0,
        "Server: Poisson arrivals at this rate (server_target_qps); Offline: offline_expected_qps; --search: "
        "its first guess",
        above=0,
    )
    duration_s: float = setting(
        30.0, "LoadGen's min_duration: a run lasts this long, or until --min-query-count queries", above=0
    )
    output: str = setting(
        "bench/results/mlperf-run",
        "folder for LoadGen's logs (mlperf_log_summary.txt, mlperf_log_detail.txt), result.json and "
        "summary.md; a search writes one subfolder per LoadGen run and the fleets' logs under tmp/",
    )
    mode: str = setting(
        "relay",
        "the local fleet: relay (RelayGR) or baseline (no Admit, no hint, no DRAM tier)",
        choices=MODES,
    )
    recommend: str = setting(
        "",
        "HOST:PORT of a RecommendService to drive instead of starting a local fleet (--mode, the fleet and "
        "universe settings then do not apply: that stub's own universe serves)",
    )
    p99_ms: float = setting(
        80.0,
        "Server: server_target_latency_ns at target_latency_percentile 0.99 (MLPerf DLRMv3: 80 ms)",
        above=0,
    )
    search: bool = setting(
        False, "search the highest VALID Server target QPS for each of --search-modes on fleets of one shape"
    )
    search_modes: str = setting(
        "baseline,relay",
        "modes the search measures, one LoadGen run of each in turn (a shared machine's drifting load then "
        "hits both alike)",
        items=str,
        choices=MODES,
        distinct=True,
    )
    search_grid: str = grid(
        "1,1.5,2,3,4,6,8,11,16,23,32,45,64,90,128",
        "offered loads the search walks (from the grid value at or below --target-qps, galloping, then "
        "bisecting)",
    )
    search_refine: int = setting(
        1, "bisections between the highest VALID grid load and the INVALID one above it", minimum=0
    )
    min_query_count: int = setting(
        1000,
        "LoadGen's min_query_count (early stopping needs >= 459 at P99 to call a Server run VALID)",
        above=0,
    )
    max_in_flight: int = setting(
        64, "most Recommend calls in flight; later samples wait (and LoadGen counts the wait)", above=0
    )
    timeout_s: float = setting(2.0, "deadline of each Recommend call", above=0)
    max_error_fraction: float = setting(
        0.0,
        "a run with more failed calls than this share of its samples is INVALID whatever LoadGen says",
        minimum=0,
        below=1,
    )
    top_k: int = setting(10, "top_k of each RecommendRequest", above=0)
    seed: int = setting(0, "LoadGen's schedule, sample-index and QSL seeds (the same in every mode)")
    # The local fleet (ignored with --recommend): `FleetSettings`, with the services' relay window.
    relay_window_ms: float = setting(30.0, f"{RELAY_WINDOW_HELP}, inside every sample's latency", minimum=0)
    # The workload: DLRMv3-shaped streaming users (see bench.mlperf.run).
    visits_per_user: float = setting(
        4.0, "workload: mean visits of each user in one run: sizes the QSL (users = queries / this)", above=0
    )
    users: int = setting(0, "workload: QSL size, users (0: from --visits-per-user)", minimum=0)
    history_median: int = setting(
        256, "workload: median long-term history at a run's start (lognormal)", above=0
    )
    history_sigma: float = setting(0.75, "workload: sigma of the log length", above=0)
    history_max: int = setting(
        1024,
        "workload: longest long-term history (a cap: past it a history slides, as production's do)",
        above=0,
    )
    short_term: int = setting(16, "workload: short-term events per request", above=0)
    growth_events_per_min: float = setting(
        60.0,
        "workload: mean new events per user and minute during a run (each user's rate within ±50%)",
        above=0,
    )
    universe_seed: int = setting(0, "workload: seed of the user universe")

    def modes(self) -> list[str]:
        """The modes a search runs, in order."""
        return listed(self, "search_modes")

    def validate(self) -> None:
        """The bounds that tie settings together (`check` has enforced each one's own)."""
        if not self.history_median < self.history_max:
            raise ValueError("--history-median must be below --history-max")
        if self.search and self.scenario != "Server":
            raise ValueError("--search needs --scenario Server: only Server has a latency bound")
        if self.search and self.recommend:
            raise ValueError("--search starts its own fleets: it does not take --recommend")


def parse(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> MlperfConfig:
    """The settings from `argv` (default: the process's arguments) and `RELAYGR_…` variables; exits with a
    usage error when invalid."""
    return load(MlperfConfig, argv, environ=environ, prog="python -m bench mlperf", description=DESCRIPTION)
