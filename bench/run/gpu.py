"""`python -m bench run --profile gpu`: baseline against RelayGR, one ranker on a GPU, within a time budget.

A ranker with `gpu-dlrmv3` on the GPU, router, trigger and retrieval stub on the host's cores. In order:
the in-process floor on the GPU (`--floor-device`, the length sweep's first guess); RelayGR's fleet, then
the baseline's; the cached Rank through RelayGR's router at the length grid's first, middle and last
length; the length sweep (experiment 1) and the throughput sweep on the first mix (experiment 2), the
second mix only when the time left is at least 1.5x what the first took. No ablations, abandonment
shares, other relay windows or seed repeats. Every point also records how busy the GPU was over its
measured requests (`gpu`, `bench.lib.gpu_monitor`; None without a GPU).

The time budget (`--time-budget-s`, fleet starts included, less `RESERVE_S` for stopping the fleets and
writing the report) keeps the run inside one command's limit: a point that would end past it is not
measured, a running one is stopped there (`cut`). Either ends its sweep, marked `cut_short` with its
`best` None and what it had measured (`passed_up_to`, `failed_from`); later stages are skipped
(`time_budget.skipped`). A stage that fails is recorded under `errors` and the run goes on. The results
are written again after each stage (`checkpoint`), so even a run killed from outside leaves its finished
stages.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from bench.lib import probes
from bench.lib.config import BenchConfig
from bench.lib.driving import SETTLE_S, Plan
from bench.lib.fleets import BASELINE, RELAY, BenchFleet, Mode
from bench.lib.gpu_monitor import GpuMonitor
from bench.lib.points import PointSpec, run_point
from bench.lib.schema import Cost, FloorPoint, Sweep, ratio, recorded
from bench.lib.schema_gpu import (
    BudgetedSweep,
    GpuBusy,
    GpuLengthSweep,
    GpuMeasurements,
    GpuMix,
    GpuPoint,
    TimeBudget,
)
from bench.lib.sweep import SweepStopped
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


def headline(baseline: BudgetedSweep, relay: BudgetedSweep) -> dict[str, Any]:
    """Two sweeps' `ratio` when both finished (else None), whether they did (`complete`), and
    `ratio_at_least` where the baseline finished and RelayGR's cut sweep had passed somewhere."""
    complete = not (baseline.cut_short or relay.cut_short)
    at_least = None
    if not complete and not baseline.cut_short and relay.passed_up_to is not None:
        at_least = ratio(relay.passed_up_to, baseline.best)
    return {"ratio": ratio(relay.best, baseline.best) if complete else None, "complete": complete,
            "ratio_at_least": at_least}  # fmt: skip


class GpuBench(Bench):
    """The gpu profile's run (see the module's docstring); `checkpoint` receives the results so far."""

    new_sweep = BudgetedSweep
    fresh_floor = False

    def __init__(
        self, config: BenchConfig, log_dir: Path, log: Callable[[str], None], started: float,
        monitor: GpuMonitor, checkpoint: Callable[[GpuMeasurements], None] = lambda _: None,
    ) -> None:  # fmt: skip
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
        modes = {mode.name: mode for mode in (BASELINE, RELAY)}
        self.results = GpuMeasurements(modes=modes, fleet=self.shape, mix_universes=list(self.mixes))

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

    def stage(self, name: str, work: Callable[[], T], default: T, needs_s: float = 0.0, why: str = "") -> T:
        """`work()`, or `default` when the budget leaves less than `needs_s` (recorded as skipped, `why`
        or that it needs that long) or when it raises (recorded as an error)."""
        if not self.budget.fits(needs_s):
            self.skipped[name] = f"{why or f'needs about {needs_s:.0f} s'}, {self.left()}"
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
        r = self.results
        floor = r.floor = self.stage("floor", lambda: self.floor("on the GPU", self.config.length_grid()), [])
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

    def measure(self, floor: list[FloorPoint], baseline: BenchFleet, relay: BenchFleet) -> None:
        """The cached Rank, the length sweep and the throughput sweeps, on running fleets."""
        c, r = self.config, self.results
        lengths, window = c.length_grid(), c.relay_window_ms
        ends = sorted({lengths[0], lengths[len(lengths) // 2], lengths[-1]})
        r.cached_rank = self.stage("cached rank", lambda: self.cached_rank(relay, ends), [], CACHED_RANK_S)
        self.save()
        plans = [Plan(baseline, self.length_guess(floor, 0.0), window),
                 Plan(relay, self.length_guess(floor, window), window)]  # fmt: skip
        swept = self.stage("length sweep", lambda: self.length_sweeps(plans), None)
        if swept is not None:
            base, rel = swept
            r.length_sweep = GpuLengthSweep(
                rate=c.length_rate, baseline=base, relay=rel, **headline(base, rel)
            )
        self.save()
        firsts, took = self.first_loads(), 0.0
        for number, mix in enumerate(self.mixes):
            began, work = time.monotonic(), functools.partial(self.mix_sweeps, mix, baseline, relay, firsts)
            needs = 1.5 * took if number else 0.0  # the second mix: 1.5 times what the first took
            result = self.stage(
                f"throughput {mix.label}", work, None, needs, f"the first mix took {took:.0f} s"
            )
            took = time.monotonic() - began
            if result is None:
                break
            r.throughput_sweeps[mix.label] = result
            self.save()
            if result.baseline.cut_short or result.relay.cut_short:
                break
            firsts = self.next_loads(result, firsts)

    def mix_result(
        self, mix: Universe, base: Sweep, rel: Sweep, counters: dict[str, Any], capacity: dict | None
    ) -> GpuMix:
        """Both modes' load sweeps on one mix, RelayGR's wasted pre-inference over them, the headline."""
        assert isinstance(base, BudgetedSweep) and isinstance(rel, BudgetedSweep)
        return GpuMix(universe=mix.label, max_long_term=mix.max_long_term, baseline=base, relay=rel,
                      waste=waste(counters), **headline(base, rel))  # fmt: skip
