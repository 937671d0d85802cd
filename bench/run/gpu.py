"""`python -m bench run --profile gpu`: baseline against RelayGR, one ranker on a GPU, within a time budget.

The fleet on a GPU: a ranker with `gpu-dlrmv3` on the GPU, router, trigger and retrieval stub
on the host's cores. The run measures only what that question needs, in this order:

1. the in-process floor on the GPU (`--floor-device`), for the length sweep's first guess;
2. RelayGR's fleet, then the baseline's (one start each), the cached Rank through RelayGR's router at the
   length grid's first, middle and last length;
3. the length sweep at `--length-rate` (experiment 1) and the throughput sweep on the first mix
   (experiment 2), each mode's points in turn; the second mix only when the time left is at least 1.5x
   what the first mix took. No ablations, abandonment shares, other relay windows or seed repeats.

Every point records, beside its ranking latencies and its CPU seconds by process (`cost`), how busy the
GPU was over its measured requests (`gpu`, `bench.lib.gpu_monitor`; None on a machine without a GPU).

The time budget (`--time-budget-s`, fleet starts included) keeps the whole run inside one command's
limit: a point whose warm-up and measured requests would end past the budget (less `RESERVE_S` for
stopping the fleets and writing the report) is not measured; a running point is stopped there (`cut`).
Either ends its sweep: the sweep is marked `cut_short`, its `best` is None, and `passed_up_to` /
`failed_from` say what it had measured, so a cut sweep is never reported as a full answer; later stages
are skipped (`time_budget.skipped`). A stage that fails (a fleet that does not start) is recorded under
`errors` and the run goes on to write what it has. After each stage results.json and report.md are
written again (`checkpoint`), so even a run killed from outside leaves its finished stages.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from bench.lib import probes
from bench.lib.config import BenchConfig
from bench.lib.driving import NUM_CANDIDATES, SETTLE_S, Plan
from bench.lib.fleets import BASELINE, RELAY, BenchFleet, Mode
from bench.lib.floor import cached_rank_through_router, model_floor
from bench.lib.gpu_monitor import GpuMonitor
from bench.lib.points import PointSpec, run_point
from bench.lib.schema import CachedRankPoint, Cost, FloorPoint, ratio, recorded
from bench.lib.schema_gpu import (
    BudgetedSweep,
    GpuBusy,
    GpuLengthSweep,
    GpuMeasurements,
    GpuMix,
    GpuPoint,
    TimeBudget,
)
from bench.lib.sweep import SweepStopped, last_within
from bench.lib.workload import RevisitSampler, Universe
from bench.run.experiments import Bench, waste

RESERVE_S = 25.0  # kept at the end of the budget: stopping two fleets (grace included) and the report
POINT_OVERHEAD_S = 2.0  # beyond a point's requests: the probes, an extra stub's start
CACHED_RANK_S = 20.0  # the least time left for the cached Rank through the router
T = TypeVar("T")


class BudgetExhausted(SweepStopped):
    """The time budget leaves no room for the next measurement."""


@dataclasses.dataclass
class Budget:
    """Wall-clock seconds of a run from `started` (`time.monotonic()`); 0 seconds: no budget."""

    started: float
    seconds: float
    reserve_s: float = RESERVE_S

    @property
    def deadline(self) -> float | None:
        return self.started + self.seconds - self.reserve_s if self.seconds else None

    def left(self, now: float | None = None) -> float:
        """Seconds until the deadline (infinite without a budget; negative once past it)."""
        deadline = self.deadline
        return float("inf") if deadline is None else deadline - (time.monotonic() if now is None else now)

    def fits(self, seconds: float, now: float | None = None) -> bool:
        return seconds <= self.left(now)


@dataclasses.dataclass(frozen=True)
class Headline:
    """The ratio of two sweeps when both finished, else None; `ratio_at_least` where the baseline finished
    and RelayGR's cut sweep had passed somewhere (its answer is at least that)."""

    ratio: float | None
    complete: bool
    ratio_at_least: float | None


def headline(baseline: BudgetedSweep, relay: BudgetedSweep) -> Headline:
    """Two sweeps' `Headline`."""
    complete = not (baseline.cut_short or relay.cut_short)
    at_least = None
    if not complete and not baseline.cut_short and relay.passed_up_to is not None:
        at_least = ratio(relay.passed_up_to, baseline.best)
    return Headline(ratio(relay.best, baseline.best) if complete else None, complete, at_least)


class GpuBench(Bench):
    """The gpu profile's run (see the module's docstring); `checkpoint` receives the results so far."""

    new_sweep = BudgetedSweep

    def __init__(
        self,
        config: BenchConfig,
        log_dir: Path,
        log: Callable[[str], None],
        started: float,
        monitor: GpuMonitor,
        checkpoint: Callable[[GpuMeasurements], None] = lambda _: None,
    ) -> None:
        super().__init__(config, log_dir, log)
        self._started = started
        self.budget = Budget(started, config.time_budget_s)
        self.monitor = monitor
        self.checkpoint = checkpoint
        # Room for the longest sequence a preset has positions for: short-term histories are fixed here.
        args = f"{self.shape.ranker_args} --max-short-term-events {config.short_term}"
        self.shape = dataclasses.replace(self.shape, ranker_args=args)
        self.skipped: dict[str, str] = {}
        self.errors: list[str] = []
        self.results = GpuMeasurements(
            modes={mode.name: mode for mode in (BASELINE, RELAY)},
            fleet=self.shape,
            mix_universes=list(self.mixes),
        )

    # ---- points and sweeps within the budget ----

    def drive(self, fleet: BenchFleet, address: str, sampler: RevisitSampler, spec: PointSpec) -> GpuPoint:
        warmup_s = spec.warmup / spec.rate
        needed = warmup_s + spec.measured / spec.rate + SETTLE_S + POINT_OVERHEAD_S
        if not self.budget.fits(needed):
            raise BudgetExhausted(f"a point at {spec.rate:g}/s needs about {needed:.0f} s, {self.left()}")
        before = probes.snapshot(fleet.pids(), fleet.ranker_metrics())
        start = time.monotonic()
        result = asyncio.run(run_point(address, sampler, spec, stop_at=self.budget.deadline))
        end = time.monotonic()
        cost = probes.difference(before, probes.snapshot(fleet.pids(), fleet.ranker_metrics()))
        # The measured requests start after the warm-up's, about warmup / rate seconds in.
        busy = self.monitor.busy(start + warmup_s, end)
        gpu = None if busy is None else GpuBusy(**busy)
        return recorded(GpuPoint, result, seed=spec.seed, cost=Cost(**cost), gpu=gpu)

    # ---- stages ----

    def stage(self, name: str, work: Callable[[], T], default: T, needs_s: float = 0.0) -> T:
        """`work()`, or `default` when the budget leaves less than `needs_s` (recorded as skipped) or when
        it raises (recorded as an error); the results so far are checkpointed after it."""
        if not self.budget.fits(needs_s):
            self.skipped[name] = f"needs about {needs_s:.0f} s, {self.left()}"
            self.log(f"skipping {name}: {self.skipped[name]}")
            return default
        try:
            return work()
        except Exception as exc:
            self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            self.log(f"{name} failed:\n{traceback.format_exc()}")
            return default

    def left(self) -> str:
        return f"{max(self.budget.left(), 0):.0f} s of the budget left"

    def fleet(self, mode: Mode) -> BenchFleet:
        left = self.budget.left()
        timeout = max(min(self.config.startup_timeout_s, left), 10.0)
        self.log(f"starting the {mode.name} fleet ({self.left()}): {mode.description}")
        shape = dataclasses.replace(self.shape, startup_timeout_s=timeout)
        c = self.config
        return BenchFleet(mode, shape, self.mix, c.relay_window_ms, self.log_dir / mode.name, c.routing)

    def save(self) -> None:
        self.results.time_budget = TimeBudget(
            seconds=self.config.time_budget_s, reserve_s=self.budget.reserve_s,
            used_s=round(time.monotonic() - self.budget.started, 1), skipped=dict(self.skipped),
        )  # fmt: skip
        self.results.errors = list(self.errors)
        self.checkpoint(self.results)

    def run(self) -> GpuMeasurements:
        c = self.config
        lengths = c.length_grid()
        r = self.results
        self.log(f"in-process floor ({c.model_preset} on {c.floor_device}) at {lengths}")
        floor = self.stage("floor", self.floor, [])
        r.floor = floor
        self.save()
        with contextlib.ExitStack() as fleets:
            relay = self.stage("relay fleet", lambda: fleets.enter_context(self.fleet(RELAY)), None, 30.0)
            baseline = None
            if relay is not None:
                self.save()
                start = lambda: fleets.enter_context(self.fleet(BASELINE))  # noqa: E731
                baseline = self.stage("baseline fleet", start, None, 30.0)
            self.save()
            if relay is not None and baseline is not None:
                self.measure(floor, baseline, relay)
        self.save()
        return r

    def floor(self) -> list[FloorPoint]:
        c = self.config
        floor = model_floor(
            c.model_preset, c.torch_threads, c.length_grid(), c.short_term, NUM_CANDIDATES,
            c.settings.floor_repeats, c.pre_infer_chunk_tokens, c.floor_device,
        )  # fmt: skip
        self.log_floor(floor)
        return floor

    def measure(self, floor: list[FloorPoint], baseline: BenchFleet, relay: BenchFleet) -> None:
        """The cached Rank, the length sweep and the throughput sweeps, on running fleets."""
        c, r = self.config, self.results
        lengths, loads, window = c.length_grid(), c.load_grid(), c.relay_window_ms
        self.log("cached Rank through the router, idle fleet")
        ends = sorted({lengths[0], lengths[len(lengths) // 2], lengths[-1]})
        ranks = c.settings.cached_rank_iterations
        router = relay.router()
        work = lambda: cached_rank_through_router(router, ends, c.short_term, NUM_CANDIDATES, ranks)  # noqa: E731
        cached: list[CachedRankPoint] = self.stage("cached rank", work, [], CACHED_RANK_S)
        for p in cached:
            self.log(f"cached Rank L={p.prefix_length}: P50 {p.rank_ms_p50} ms P99 {p.rank_ms_p99} ms")
        r.cached_rank = cached
        self.save()

        # First guesses as `Bench.run` makes them: from the floor (half the SLO left for queueing and the
        # hops; the grid's middle without a floor), and the length sweep's rate for the loads.
        no_relay_ms = [p.pre_infer_ms + p.rank_ms for p in floor]

        def length_guess(window_ms: float) -> int:
            return last_within(no_relay_ms, window_ms + c.slo_ms / 2) if floor else len(lengths) // 2

        plans = [Plan(baseline, length_guess(0.0), window), Plan(relay, length_guess(window), window)]
        swept = self.stage("length sweep", lambda: self.length_sweeps(plans), None)
        if swept is not None:
            base, rel = swept
            line = headline(base, rel)
            r.length_sweep = GpuLengthSweep(
                rate=c.length_rate, baseline=base, relay=rel, ratio=line.ratio, complete=line.complete,
                ratio_at_least=line.ratio_at_least,
            )  # fmt: skip
        self.save()
        first_base = last_within(loads, c.length_rate)
        first_relay = first_base + 2
        took = 0.0
        for number, mix in enumerate(self.mixes):
            name = f"throughput {mix.label}"
            if number and not self.budget.fits(1.5 * took):
                self.skipped[name] = f"the first mix took {took:.0f} s, {self.left()}"
                self.log(f"skipping {name}: {self.skipped[name]}")
                break
            began = time.monotonic()
            guesses = (first_base, first_relay)
            work = lambda mix=mix, g=guesses: self.mix_sweeps(mix, baseline, relay, *g)  # noqa: E731
            result = self.stage(name, work, None)
            took = time.monotonic() - began
            if result is None:
                break
            r.throughput_sweeps[mix.label] = result
            self.save()
            if result.baseline.cut_short or result.relay.cut_short:
                break
            # The next mix is longer: one grid step below this one's answers.
            first_base = max(last_within(loads, result.baseline.best or loads[0]) - 1, 0)
            first_relay = max(last_within(loads, result.relay.best or loads[0]) - 1, 0)

    def mix_sweeps(
        self, mix: Universe, baseline: BenchFleet, relay: BenchFleet, first_base: int, first_relay: int
    ) -> GpuMix:
        """Both modes' load sweeps on one mix, RelayGR's wasted pre-inference over them, the headline."""
        window = self.config.relay_window_ms
        plans = [Plan(baseline, first_base, window), Plan(relay, first_relay, window)]
        (base, rel), counters = self.ranker_counters(relay, lambda: self.load_sweeps(mix, plans))
        assert isinstance(base, BudgetedSweep) and isinstance(rel, BudgetedSweep)
        line = headline(base, rel)
        return GpuMix(
            universe=mix.label, max_long_term=mix.max_long_term, baseline=base, relay=rel, ratio=line.ratio,
            waste=waste(counters), complete=line.complete, ratio_at_least=line.ratio_at_least,
        )  # fmt: skip
