"""The four experiments of the benchmark, baseline and RelayGR side by side, as one JSON-able result.

Order of a run:

1. the in-process floor (experiment 3, model side), before any fleet exists;
2. the RelayGR fleet, then the baseline fleet, both kept running: the cached Rank through RelayGR's
   router (experiment 3, serving side); the length sweep (experiment 1) and the throughput sweep
   (experiment 2) of both modes, one point of each mode in turn;
3. the baseline fleet stops; (full profile) RelayGR's length sweep at other relay windows;
4. the ablations (experiment 4): RelayGR and one fresh fleet per ablation, one point each at RelayGR's
   SLO-compliant load on the mix, all with the same users, new to every fleet.

A sweep finds the largest grid value that meets the SLO (`bench.stats.largest_passing`), assuming that
a longer sequence or a higher load never makes the P99 better. Its first guess comes from the floor
(lengths) or from the length sweep's rate (loads); a wrong guess costs measurements, never the answer.
Running the two modes' sweeps in turn matters on a shared machine: other users' load drifts over
minutes, and a mode measured entirely in a busy spell would be judged by it. Points use users named
after the universe, rate and window, so both modes see exactly the same users and no point inherits
another point's cache.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench import probes
from bench.config import BenchConfig
from bench.fleets import ABLATIONS, BASELINE, RELAY, BenchFleet, FleetShape, Mode
from bench.floor import cached_rank_through_router, model_floor
from bench.points import PointResult, PointSpec, run_point
from bench.stats import interleave, largest_passing
from bench.workload import RevisitSampler, Universe, fixed_length_universe, mix_universe

SETTLE_S = 1.0  # pause between points: lets the last answers and background pre-inference finish
NUM_CANDIDATES = 128  # the stub's default retrieval size, also the rankers' profiled candidate count
ABLATION_USERS = "ablations"  # new to every fleet of the ablations


@dataclasses.dataclass(frozen=True)
class Plan:
    """One mode's sweep to run: its fleet, the grid index it measures first, and the relay window."""

    fleet: BenchFleet
    first: int
    delay_ms: float


@dataclasses.dataclass
class Sweep:
    """One mode's sweep: every point measured, and the largest value that met the SLO."""

    points: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    best: float | None = None
    at_grid_top: bool = False  # the best is the grid's last value: the true limit may be higher


class Bench:
    """Runs a benchmark and collects its results; `log` receives one line per step."""

    def __init__(self, config: BenchConfig, log_dir: Path, log: Callable[[str], None] = print) -> None:
        self.config = config
        self.log_dir = log_dir
        self._log = log
        self._started = time.monotonic()
        c = config
        self.shape = FleetShape(
            rankers=c.rankers,
            model_preset=c.model_preset,
            hbm_budget_mb=c.hbm_budget_mb,
            dram_budget_mb=c.dram_budget_mb,
            slo_ms=c.slo_ms,
            ranker_args=(
                f"--torch-threads {c.torch_threads} --pre-infer-chunk-tokens {c.pre_infer_chunk_tokens} "
                f"--profile-lengths {c.ranker_profile_lengths} --profile-repeats 2 "
                f"--profile-candidates {NUM_CANDIDATES} --profile-short-term {c.short_term}"
            ),
            max_long_term=c.longest_long_term,
            stub_args=f"--rank-timeout-ms {c.rank_timeout_ms} --num-candidates {NUM_CANDIDATES}",
            startup_timeout_s=c.startup_timeout_s,
        )
        self.mix = mix_universe(c.mix_median, c.mix_sigma, c.mix_max, c.short_term, c.universe_seed)

    def log(self, text: str) -> None:
        self._log(f"[{time.monotonic() - self._started:6.0f}s] {text}")

    def universe(self, length: int) -> Universe:
        c = self.config
        return fixed_length_universe(length, c.short_term, c.growth_headroom, c.universe_seed)

    # ---- running points ----

    def point(
        self, fleet: BenchFleet, universe: Universe, rate: float, delay_ms: float, users: str = ""
    ) -> dict[str, Any]:
        """One point's result as JSON, with what it cost the fleet (`cost`, warm-up included). Its users
        are named after `users`, or after the universe, rate and window."""
        c = self.config
        address = fleet.stub(universe, delay_ms)
        namespace = users or f"{universe.label}-r{rate:g}-d{delay_ms:g}"
        sampler = RevisitSampler(namespace, rate, c.revisit_probability, c.revisit_window_s, c.load_seed)
        spec = PointSpec(
            rate=rate,
            warmup=round(rate * c.warmup_s),
            measured=c.settings.measured,
            timeout_s=(delay_ms + c.rank_timeout_ms) / 1000 + 1.0,
            slo_ms=c.slo_ms,
            max_error_fraction=c.max_error_fraction,
            seed=c.load_seed,
        )
        before = probes.snapshot(fleet.pids(), fleet.ranker_metrics())
        result = asyncio.run(run_point(address, sampler, spec))
        cost = probes.difference(before, probes.snapshot(fleet.pids(), fleet.ranker_metrics()))
        time.sleep(SETTLE_S)
        self.log(
            f"{fleet.mode.name:<15} {universe.label:<22} {rate:>6g}/s d={delay_ms:g}: {describe(result)}"
        )
        self.log(f"{'':<15} cost: {describe_cost(cost)}")
        return {**result.as_json(), "cost": cost}

    def length_sweeps(self, plans: list[Plan]) -> list[Sweep]:
        """Experiment 1 for each plan: every user at one length, at the length sweep's rate."""

        def measure(fleet: BenchFleet, length: float, delay_ms: float) -> dict[str, Any]:
            point = self.point(fleet, self.universe(int(length)), self.config.length_rate, delay_ms)
            return {"long_term": int(length), "delay_ms": delay_ms, **point}

        return self._sweeps(self.config.length_grid(), plans, measure)

    def load_sweeps(self, plans: list[Plan]) -> list[Sweep]:
        """Experiment 2 for each plan: the length mix at one offered load."""

        def measure(fleet: BenchFleet, rate: float, delay_ms: float) -> dict[str, Any]:
            return self.point(fleet, self.mix, rate, delay_ms)

        return self._sweeps(self.config.load_grid(), plans, measure)

    def _sweeps(
        self,
        grid: list[float],
        plans: list[Plan],
        measure: Callable[[BenchFleet, float, float], dict[str, Any]],
    ) -> list[Sweep]:
        """One sweep per plan over `grid`, one point of each in turn."""
        sweeps = [Sweep() for _ in plans]

        def verdicts(plan: Plan, sweep: Sweep) -> Callable[[int], bool]:
            def passes(index: int) -> bool:
                sweep.points.append(measure(plan.fleet, grid[index], plan.delay_ms))
                return sweep.points[-1]["meets_slo"]

            return passes

        searches = [
            (largest_passing(len(grid), plan.first), verdicts(plan, sweep))
            for plan, sweep in zip(plans, sweeps, strict=True)
        ]
        for sweep, best in zip(sweeps, interleave(searches), strict=True):
            sweep.best = None if best is None else grid[best]
            sweep.at_grid_top = best == len(grid) - 1
        return sweeps

    def fleet(self, mode: Mode) -> BenchFleet:
        self.log(f"starting the {mode.name} fleet: {mode.description}")
        return BenchFleet(
            mode, self.shape, self.mix, self.config.preprocess_delay_ms, self.log_dir / mode.name
        )

    # ---- the run ----

    def run(self) -> dict[str, Any]:
        c = self.config
        lengths, loads, window = c.length_grid(), c.load_grid(), c.preprocess_delay_ms
        self.log(f"in-process floor ({c.model_preset}, {c.torch_threads} thread(s)) at {lengths}")
        floor = model_floor(
            c.model_preset, c.torch_threads, lengths, c.short_term, NUM_CANDIDATES,
            c.settings.floor_repeats, c.pre_infer_chunk_tokens,
        )  # fmt: skip
        for p in floor:
            self.log(f"floor L={p.prefix_length}: full {p.full_ms:.1f} ms, "
                     f"pre-infer {p.pre_infer_ms:.1f} ms, cached rank {p.rank_ms:.1f} ms")  # fmt: skip
        # A miss computes the prefix (in chunks) and ranks against it: the baseline's critical path. RelayGR
        # takes the relay window off it. First guesses: half the SLO left for queueing and the hops.
        no_relay_ms = [p.pre_infer_ms + p.rank_ms for p in floor]

        def length_guess(window_ms: float) -> int:
            return last_within(no_relay_ms, window_ms + c.slo_ms / 2)

        # The length sweep's rate is a first guess of the baseline's load: there it ranked long sequences.
        load_guess = last_within(loads, c.length_rate)
        with self.fleet(RELAY) as relay:
            with self.fleet(BASELINE) as baseline:
                self.log("cached Rank through the router, idle fleet")
                cached = cached_rank_through_router(
                    relay.router(), lengths, c.short_term, NUM_CANDIDATES, c.settings.cached_rank_iterations
                )
                for p in cached:
                    self.log(f"cached Rank L={p.prefix_length}: P50 {p.rank_ms_p50} ms P99 {p.rank_ms_p99} "
                             f"ms ({p.request_kib} KiB, sources {p.sources})")  # fmt: skip
                base_length, relay_length = self.length_sweeps(
                    [Plan(baseline, length_guess(0.0), window), Plan(relay, length_guess(window), window)]
                )
                base_load, relay_load = self.load_sweeps(
                    [Plan(baseline, load_guess, window), Plan(relay, load_guess + 2, window)]
                )
            delays = c.settings.window_delays_ms
            windows = self.length_sweeps([Plan(relay, length_guess(delay), delay) for delay in delays])
            ablation_rate = relay_load.best or loads[0]
            ablations = {RELAY.name: self.point(relay, self.mix, ablation_rate, window, ABLATION_USERS)}
        for mode in ABLATIONS:
            with self.fleet(mode) as fleet:
                ablations[mode.name] = self.point(fleet, self.mix, ablation_rate, window, ABLATION_USERS)
        return {
            "length_ratio": ratio(relay_length.best, base_length.best),
            "throughput_ratio": ratio(relay_load.best, base_load.best),
            "floor": [dataclasses.asdict(p) for p in floor],
            "cached_rank": [dataclasses.asdict(p) for p in cached],
            "length_sweep": {
                "rate": c.length_rate,
                "baseline": dataclasses.asdict(base_length),
                "relay": dataclasses.asdict(relay_length),
            },
            "throughput_sweep": {
                "universe": self.mix.label,
                "baseline": dataclasses.asdict(base_load),
                "relay": dataclasses.asdict(relay_load),
            },
            "window_sensitivity": {
                f"{delay:g}": dataclasses.asdict(sweep) for delay, sweep in zip(delays, windows, strict=True)
            },
            "ablations": {"rate": ablation_rate, "points": ablations},
            "modes": {m.name: dataclasses.asdict(m) for m in (BASELINE, RELAY, *ABLATIONS)},
            "fleet": dataclasses.asdict(self.shape),
            "mix_universe": dataclasses.asdict(self.mix),
        }


def last_within(values: list[float], bound: float) -> int:
    """Index of the last of the increasing `values` that is at most `bound` (0 when none is)."""
    return max(int(np.searchsorted(values, bound, side="right")) - 1, 0)


def ratio(relay: float | None, baseline: float | None) -> float | None:
    """RelayGR's best over the baseline's; None when the baseline met the SLO nowhere on the grid."""
    if relay is None or not baseline:
        return None
    return round(relay / baseline, 3)


def describe(result: PointResult) -> str:
    rank, e2e = result.rank_ms, result.e2e_ms
    total = sum(result.cache_sources.values()) or 1
    sources = " ".join(f"{k} {v / total:.0%}" for k, v in sorted(result.cache_sources.items()))
    verdict = "meets SLO" if result.meets_slo else ("FAILS (stopped early)" if result.aborted else "FAILS")
    return (
        f"rank P50 {rank['p50']} P99 {rank['p99']} ms | e2e P99 {e2e['p99']} ms | "
        f"{result.measured} req, {result.errors} err | {sources} | {verdict}"
    )


def describe_cost(cost: dict[str, Any]) -> str:
    wall = cost["wall_s"] or 1.0
    cores = " ".join(f"{name} {seconds / wall:.2f}" for name, seconds in sorted(cost["cpu_s"].items()))
    rankers = cost["rankers"]
    return (
        f"cores used: {cores}, not ours {cost['foreign_cores']:.2f} | "
        f"productions {rankers.get('productions', {})} | pre_infer {rankers.get('pre_infer', {})} | "
        f"joins {rankers.get('joins', 0):g}"
    )
