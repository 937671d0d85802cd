"""`python -m bench.mlperf`'s settings: one frozen dataclass, parsed from flags (`parse`).

Every flag has a default, so `python -m bench.mlperf` alone runs one Server test of RelayGR on a local
`cpu-small` fleet. The defaults and why:

- `--p99-ms 80`: MLPerf DLRMv3's Server target (P99 of each sample's latency). LoadGen times a sample from
  its scheduled issue to its completion: here the whole Recommend (retrieval, the relay window, Rank), so
  the relay window (`--relay-window-ms`, 30 ms: the stub's own default) counts against the 80 ms as an
  upstream stage would.
- `--min-query-count 1000`: LoadGen's early stopping calls a Server run at P99 VALID only with at least 459
  queries if none is over the target, 662 with one over, 838 with two, 1001 with three. 1000 queries let a
  run carry two slow ones (three with a few more queries); far below MLPerf's official minimum (270336 for
  DLRM), so a run takes seconds to minutes. Lower it for smoke runs: they then end INVALID by early
  stopping, with every figure still measured.
- `--max-error-fraction 0`: LoadGen has no notion of a failed sample (a failed call completes, fast), so a
  run with more failed calls than this share of its samples is INVALID here whatever LoadGen says.
- The workload (`--history-*`, `--growth-events-per-min`, `--visits-per-user`): see `bench.mlperf.workload`.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

SCENARIOS = ("Server", "Offline")
MODES = ("relay", "baseline")
PRESETS = ("cpu-tiny", "cpu-small", "gpu-dlrmv3")
# The offered loads the search walks (calls/s), as `python -m bench`'s throughput sweeps.
SEARCH_GRID = "1,1.5,2,3,4,6,8,11,16,23,32,45,64,90,128"


@dataclasses.dataclass(frozen=True)
class MlperfConfig:
    """One LoadGen test (or, with `search`, one search per mode). Validated by `parse`."""

    scenario: str = "Server"
    target_qps: float = 10.0
    duration_s: float = 30.0
    output: str = "bench/results/mlperf-run"
    mode: str = "relay"
    recommend: str = ""
    p99_ms: float = 80.0
    search: bool = False
    search_modes: str = "baseline,relay"
    search_grid: str = SEARCH_GRID
    search_refine: int = 1
    min_query_count: int = 1000
    max_in_flight: int = 64
    timeout_s: float = 2.0
    max_error_fraction: float = 0.0
    top_k: int = 10
    seed: int = 0
    # The local fleet (ignored with --recommend).
    preset: str = "cpu-small"
    rankers: int = 2
    torch_threads: int = 1
    relay_window_ms: float = 30.0
    hbm_budget_mb: float = 256.0
    dram_budget_mb: float = 1024.0
    startup_timeout_s: float = 300.0
    # The workload.
    visits_per_user: float = 4.0
    users: int = 0
    history_median: int = 256
    history_sigma: float = 0.75
    history_max: int = 1024
    short_term: int = 16
    growth_events_per_min: float = 60.0
    universe_seed: int = 0

    def modes(self) -> list[str]:
        """The modes a search runs, in order."""
        return [part.strip() for part in self.search_modes.split(",") if part.strip()]

    def grid(self) -> list[float]:
        """The search's offered loads, increasing."""
        return [float(part) for part in self.search_grid.split(",") if part.strip()]

    def validate(self) -> None:
        """Raises ValueError naming the first flag out of bounds."""
        positive = ("target_qps", "duration_s", "p99_ms", "min_query_count", "max_in_flight", "timeout_s",
                    "top_k", "rankers", "torch_threads", "hbm_budget_mb", "startup_timeout_s",
                    "visits_per_user", "history_median", "history_sigma", "history_max", "short_term",
                    "growth_events_per_min")  # fmt: skip
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")
        for name in ("relay_window_ms", "dram_budget_mb", "users", "search_refine"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"--{name.replace('_', '-')} must not be negative")
        if not 0 <= self.max_error_fraction < 1:
            raise ValueError("--max-error-fraction must be in [0, 1)")
        if not self.history_median < self.history_max:
            raise ValueError("--history-median must be below --history-max")
        if self.search and self.scenario != "Server":
            raise ValueError("--search needs --scenario Server: only Server has a latency bound")
        if self.search and self.recommend:
            raise ValueError("--search starts its own fleets: it does not take --recommend")
        unknown = [mode for mode in self.modes() if mode not in MODES]
        if unknown or not self.modes() or len(set(self.modes())) != len(self.modes()):
            raise ValueError(f"--search-modes must list distinct modes of {', '.join(MODES)}")
        grid = self.grid()
        if not grid or sorted(set(grid)) != grid or grid[0] <= 0:
            raise ValueError("--search-grid must list distinct positive loads in increasing order")


def parser() -> argparse.ArgumentParser:
    """The command line; every flag's help says what it sets, its default is shown."""
    d = MlperfConfig()
    p = argparse.ArgumentParser(
        prog="python -m bench.mlperf",
        description="Drive the fleet's RecommendService.Recommend with MLCommons LoadGen (Server or "
        "Offline); with --search, the highest Server target QPS LoadGen calls VALID, baseline and "
        "RelayGR. Synthetic weights and users: not an MLPerf submission.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = p.add_argument
    add("--scenario", choices=SCENARIOS, default=d.scenario, help="LoadGen scenario")
    add(
        "--target-qps",
        type=float,
        default=d.target_qps,
        help="Server: Poisson arrivals at this rate (server_target_qps); Offline: offline_expected_qps; "
        "--search: its first guess",
    )
    add(
        "--duration-s",
        type=float,
        default=d.duration_s,
        help="LoadGen's min_duration: a run lasts this long, or until --min-query-count queries",
    )
    add(
        "--output",
        default=d.output,
        help="folder for LoadGen's logs (mlperf_log_summary.txt, mlperf_log_detail.txt), result.json and "
        "summary.md; a search writes one subfolder per LoadGen run and the fleets' logs under tmp/",
    )
    add(
        "--mode",
        choices=MODES,
        default=d.mode,
        help="the local fleet: relay (RelayGR) or baseline (no Admit, no hint, no DRAM tier)",
    )
    add(
        "--recommend",
        default=d.recommend,
        metavar="HOST:PORT",
        help="drive this RecommendService instead of starting a local fleet (--mode, the fleet and "
        "universe flags then do not apply: that stub's own universe serves)",
    )
    add(
        "--p99-ms",
        type=float,
        default=d.p99_ms,
        help="Server: server_target_latency_ns at target_latency_percentile 0.99 (MLPerf DLRMv3: 80 ms)",
    )
    add(
        "--search",
        action="store_true",
        help="search the highest VALID Server target QPS for each of --search-modes on fleets of one shape",
    )
    add(
        "--search-modes",
        default=d.search_modes,
        help="modes the search measures, one LoadGen run of each "
        "in turn (a shared machine's drifting load then hits both alike)",
    )
    add(
        "--search-grid",
        default=d.search_grid,
        help="offered loads the search walks (from the grid value at "
        "or below --target-qps, galloping, then bisecting)",
    )
    add(
        "--search-refine",
        type=int,
        default=d.search_refine,
        help="bisections between the highest VALID grid load and the INVALID one above it",
    )
    add(
        "--min-query-count",
        type=int,
        default=d.min_query_count,
        help="LoadGen's min_query_count (early stopping needs >= 459 at P99 to call a Server run VALID)",
    )
    add(
        "--max-in-flight",
        type=int,
        default=d.max_in_flight,
        help="most Recommend calls in flight; later samples wait (and LoadGen counts the wait)",
    )
    add("--timeout-s", type=float, default=d.timeout_s, help="deadline of each Recommend call")
    add(
        "--max-error-fraction",
        type=float,
        default=d.max_error_fraction,
        help="a run with more failed calls than this share of its samples is INVALID whatever LoadGen says",
    )
    add("--top-k", type=int, default=d.top_k, help="top_k of each RecommendRequest")
    add(
        "--seed",
        type=int,
        default=d.seed,
        help="LoadGen's schedule, sample-index and QSL seeds (the same in every mode)",
    )
    fleet = p.add_argument_group("local fleet (without --recommend)")
    fleet.add_argument("--preset", choices=PRESETS, default=d.preset, help="every ranker's model preset")
    fleet.add_argument("--rankers", type=int, default=d.rankers, help="rankers of the fleet")
    fleet.add_argument(
        "--torch-threads", type=int, default=d.torch_threads, help="intra-op threads per ranker"
    )
    fleet.add_argument(
        "--relay-window-ms",
        type=float,
        default=d.relay_window_ms,
        help="the stub's pre-processing delay (the relay window), inside every sample's latency",
    )
    fleet.add_argument(
        "--hbm-budget-mb", type=float, default=d.hbm_budget_mb, help="HBM tier per ranker, MiB"
    )
    fleet.add_argument(
        "--dram-budget-mb",
        type=float,
        default=d.dram_budget_mb,
        help="DRAM tier per ranker, MiB (the baseline keeps none)",
    )
    fleet.add_argument(
        "--startup-timeout-s",
        type=float,
        default=d.startup_timeout_s,
        help="seconds each service gets to become healthy",
    )
    work = p.add_argument_group("workload: DLRMv3-shaped streaming users (see bench.mlperf.workload)")
    work.add_argument(
        "--visits-per-user",
        type=float,
        default=d.visits_per_user,
        help="mean visits of each user in one run: sizes the QSL (users = queries / this)",
    )
    work.add_argument(
        "--users", type=int, default=d.users, help="QSL size, users (0: from --visits-per-user)"
    )
    work.add_argument(
        "--history-median",
        type=int,
        default=d.history_median,
        help="median long-term history at a run's start (lognormal)",
    )
    work.add_argument("--history-sigma", type=float, default=d.history_sigma, help="sigma of the log length")
    work.add_argument(
        "--history-max",
        type=int,
        default=d.history_max,
        help="longest long-term history (a cap: past it a history slides, as production's do)",
    )
    work.add_argument("--short-term", type=int, default=d.short_term, help="short-term events per request")
    work.add_argument(
        "--growth-events-per-min",
        type=float,
        default=d.growth_events_per_min,
        help="mean new events per user and minute during a run (each user's rate within ±50%%)",
    )
    work.add_argument("--universe-seed", type=int, default=d.universe_seed, help="seed of the user universe")
    return p  # fmt: skip


def parse(argv: Sequence[str] | None = None) -> MlperfConfig:
    """The settings from `argv` (default: the process's arguments); exits with a usage error when invalid."""
    p = parser()
    args = p.parse_args(argv)
    config = MlperfConfig(**vars(args))
    try:
        config.validate()
    except ValueError as exc:
        p.error(str(exc))
    return config
