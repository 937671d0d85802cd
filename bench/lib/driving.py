"""Driving a benchmark's points: `Driver` starts each mode's fleet (`fleet`), waits until the other fleets
are idle (`wait_idle`), sends one point's open-loop load to a retrieval stub (`point`) and remembers every
point it measured, so that a sweep judged against another SLO reuses it (`point_once`). A point's users are
named after what it measures (`users`), so both modes and every ablation's fresh fleet see exactly the same
users and no point inherits another's cache. `bench.run.experiments.Bench` runs the experiments over it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench.lib import probes
from bench.lib.config import BenchConfig
from bench.lib.fleets import BenchFleet, FleetShape, Mode
from bench.lib.points import FIRST_SEED, Before, PointSpec, describe, describe_cost, run_point
from bench.lib.schema import Cost, Point, recorded
from bench.lib.workload import RevisitSampler, Universe, fixed_length_universe, mix_universe

SETTLE_S = 1.0  # pause between points: lets the last answers and background pre-inference finish
LEASE_TTL_MS = 3000  # the rankers' HBM lease of a pre-inferred prefix (their --lease-ttl-ms)
NUM_CANDIDATES = 128  # the stub's default retrieval size, also the rankers' profiled candidate count
# Before a point, the other fleets' processes must use at most IDLE_CORES (over IDLE_SAMPLE_S), waited for up
# to IDLE_TIMEOUT_S: a point must not share the cores with the work its neighbours' last point left behind.
IDLE_CORES = 0.1
IDLE_SAMPLE_S = 0.5
IDLE_TIMEOUT_S = 30.0


@dataclasses.dataclass(frozen=True)
class Plan:
    """One mode's sweep to run: its fleet, the grid index it measures first, the relay window, the share
    of requests abandoned after retrieval, whether requests revisit users (False: `no-revisit`), and a
    tag naming the pair of sweeps it belongs to where the same users must be measured again ('': none)."""

    fleet: BenchFleet
    first: int
    delay_ms: float
    abandon_fraction: float = 0.0
    revisits: bool = True
    tag: str = ""


class Driver:
    """Starts fleets and measures points for a benchmark run; `log` receives one line per step."""

    def __init__(self, config: BenchConfig, log_dir: Path, log: Callable[[str], None] = print) -> None:
        self.config = config
        self.log_dir = log_dir
        self._log = log
        self._started = time.monotonic()
        # Every point measured, by mode and users, with the SLO it was judged against (`point_once`).
        self._measured: dict[tuple, tuple[Point, float]] = {}
        self._live: list[BenchFleet] = []  # the fleets running now (`fleet`)
        self.shape = self.fleet_shape()
        c = config
        self.mixes = [
            mix_universe(median, c.mix_sigma, maximum, c.short_term, c.universe_seed)
            for median, maximum in ((c.mix_median, c.mix_max), (c.mix2_median, c.mix2_max))
        ]
        self.mix = self.mixes[0]

    def fleet_shape(self) -> FleetShape:
        c = self.config
        return FleetShape(
            rankers=c.rankers,
            model_preset=c.model_preset,
            hbm_budget_mb=c.hbm_budget_mb,
            dram_budget_mb=c.dram_budget_mb,
            slo_ms=c.slo_ms,
            ranker_args=(
                f"--torch-threads {c.torch_threads} --pre-infer-chunk-tokens {c.pre_infer_chunk_tokens} "
                f"--profile-lengths {c.ranker_profile_lengths} --profile-repeats {c.ranker_profile_repeats} "
                f"--profile-candidates {NUM_CANDIDATES} --profile-short-term {c.short_term} "
                f"--lease-ttl-ms {LEASE_TTL_MS}"
            ),
            max_long_term=c.longest_long_term,
            stub_args=f"--rank-timeout-ms {c.rank_timeout_ms} --num-candidates {NUM_CANDIDATES}",
            startup_timeout_s=c.startup_timeout_s,
        )

    def log(self, text: str) -> None:
        self._log(f"[{time.monotonic() - self._started:6.0f}s] {text}")

    def universe(self, length: int) -> Universe:
        c = self.config
        return fixed_length_universe(length, c.short_term, c.growth_headroom, c.universe_seed)

    def point(
        self,
        plan: Plan,
        universe: Universe,
        rate: float,
        seed_index: int = 0,
        before: Before = FIRST_SEED,
        slo_ms: float | None = None,
    ) -> Point:
        """One point's result, with its load seed and what it cost the fleet (warm-up included), its users
        named by `users`; `before` and `slo_ms` as `spec` takes them."""
        c = self.config
        fleet = plan.fleet
        address = fleet.stub(universe, plan.delay_ms, plan.abandon_fraction)
        namespace = users(universe, rate, plan, seed_index)
        spec = self.spec(plan, rate, seed_index, before, slo_ms)
        revisit = c.revisit_probability if plan.revisits else 0.0
        point = self.drive(
            fleet, address, RevisitSampler(namespace, rate, revisit, c.revisit_window_s, spec.seed), spec
        )
        time.sleep(SETTLE_S)
        self.log(f"{fleet.mode.name:<11} {namespace:<36} {rate:>6g}/s: {describe(point)}")
        self.log(f"{'':<11} cost: {describe_cost(point.cost)}")
        return point

    def point_once(
        self, plan: Plan, universe: Universe, rate: float, seed_index: int, before: Before, slo_ms: float
    ) -> Point:
        """`point`, unless a point measured before by the same mode with the same users and arrivals says
        what this one would: it ran to its end, or failed against an SLO at most `slo_ms`."""
        key = (plan.fleet.mode.name, users(universe, rate, plan, seed_index))
        if key in self._measured:
            point, judged_at = self._measured[key]
            if not point.aborted or judged_at <= slo_ms:
                return point
        point = self.point(plan, universe, rate, seed_index, before, slo_ms)
        self._measured[key] = (point, slo_ms)
        return point

    def spec(
        self, plan: Plan, rate: float, seed_index: int, before: Before, slo_ms: float | None = None
    ) -> PointSpec:
        """What load seed `seed_index` of a load sends, and when it has failed for certain: when the
        sample pooled over the earlier seeds (`before`), its own and the calls the seeds after it may add
        up to the seed cap has against `slo_ms` (None: the run's SLO; inf: never)."""
        c = self.config
        slo_ms = c.slo_ms if slo_ms is None else slo_ms
        measured = c.settings.measured_at(rate)
        judged = not math.isinf(slo_ms)
        return PointSpec(
            rate=rate,
            warmup=round(rate * c.warmup_s),
            measured=measured,
            timeout_s=(plan.delay_ms + c.rank_timeout_ms) / 1000 + 1.0,
            slo_ms=slo_ms,
            max_error_fraction=c.max_error_fraction if judged else 1.0,
            seed=c.load_seed + seed_index,
            before=before,
            later=max(c.settings.seed_cap - seed_index - 1, 0) * measured,
        )

    def drive(self, fleet: BenchFleet, address: str, sampler: RevisitSampler, spec: PointSpec) -> Point:
        """Runs one point's load against the stub at `address` once the other fleets are idle: its result,
        with its load seed and what it cost the fleet (a subclass may record more beside them)."""
        self.wait_idle(fleet)
        before = probes.snapshot(fleet.pids(), fleet.ranker_metrics())
        result = asyncio.run(run_point(address, sampler, spec))
        cost = probes.difference(before, probes.snapshot(fleet.pids(), fleet.ranker_metrics()))
        return recorded(Point, result, seed=spec.seed, cost=Cost(**cost))

    def wait_idle(self, fleet: BenchFleet | None) -> None:
        """Waits until the processes of every running fleet but `fleet` (None: every one) use at most
        `IDLE_CORES`, up to `IDLE_TIMEOUT_S` (logged when it had to wait, or gave up)."""
        pids = [pid for other in self._live if other is not fleet for pid in other.pids().values()]
        if not pids:
            return
        started = time.monotonic()
        while True:
            before = sum(probes.process_cpu_s(pid) for pid in pids)
            time.sleep(IDLE_SAMPLE_S)
            cores = (sum(probes.process_cpu_s(pid) for pid in pids) - before) / IDLE_SAMPLE_S
            waited = time.monotonic() - started
            if cores <= IDLE_CORES or waited >= IDLE_TIMEOUT_S:
                break
        if waited > IDLE_SAMPLE_S * 1.5:
            outcome = "idle" if cores <= IDLE_CORES else f"still using {cores:.2f} cores: measuring anyway"
            self.log(f"waited {waited:.1f} s for the other fleets to be idle: {outcome}")

    @contextlib.contextmanager
    def fleet(self, mode: Mode) -> Iterator[BenchFleet]:
        """`mode`'s fleet, started and counted as running until it stops."""
        self.log(f"starting the {mode.name} fleet: {mode.description}")
        c = self.config
        with BenchFleet(
            mode, self.shape, self.mix, c.relay_window_ms, self.log_dir / mode.name, c.routing
        ) as fleet:
            self._live.append(fleet)
            try:
                yield fleet
            finally:
                self._live.remove(fleet)


def users(universe: Universe, rate: float, plan: Plan, seed_index: int) -> str:
    """The users' namespace of a point: equal for every mode measuring the same thing, new otherwise."""
    parts = [
        f"{universe.label}-r{rate:g}-d{plan.delay_ms:g}",
        f"a{plan.abandon_fraction:g}" if plan.abandon_fraction else "",
        "" if plan.revisits else "p0",
        plan.tag,
        f"s{seed_index}" if seed_index else "",
    ]
    return "-".join(part for part in parts if part)
