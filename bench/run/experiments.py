"""The experiments of the benchmark, baseline and RelayGR side by side, as `bench.lib.schema.Measurements`.

Order of a run:

1. the in-process floor (experiment 3, model side), timed in a fresh process before any fleet and again
   after the last one (the run's drift, recorded); its full pass at the first mix's cap is the host's
   unit u, of which the SLO and the relay window are multiples;
2. RelayGR's fleet, then the baseline's, both kept running (`bench.lib.driving.Driver`): the cached Rank
   through RelayGR's router (experiment 3, serving side); the length sweep (experiment 1); the throughput
   sweep (experiment 2) on the first mix at each SLO multiple (`capacity`), then on the second, longer
   mix; both modes on the first mix at each non-zero abandonment share (Admit sent, Rank never);
3. the baseline's fleet stops; RelayGR's length sweep at other relay windows (full profile); the
   ablations on RelayGR's own fleet (`no-revisit`, a workload variant);
4. the other ablations (experiment 4), a fresh fleet each, swept on the first mix from the grid load at
   or below RelayGR's best in turns with a RelayGR sweep on users of their own (`Ablations.relay_beside`).

Every point is judged in the u timed at the run's start (a drift-robust comparison is `bench.headline`'s).
A sweep finds the largest grid value that meets the SLO, refined and bracketed, each verdict pooled over
load seeds (`bench.lib.sweep`); the modes' sweeps take one load seed each in turn, on the same users. Its
first guess comes from the floor or earlier answers (a wrong one costs measurements, never the answer).
Wasted pre-inference is read over each pair of sweeps once the rankers' lease has run out.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from bench.lib import probes
from bench.lib.driving import LEASE_TTL_MS, NUM_CANDIDATES, SETTLE_S, Driver, Plan
from bench.lib.fleets import ABLATIONS, BASELINE, RELAY, BenchFleet
from bench.lib.floor import cached_rank_through_router, in_fresh_process, model_floor
from bench.lib.points import Before, describe_verdict
from bench.lib.schema import (
    Abandonment,
    Ablations,
    CachedRankPoint,
    Capacity,
    FloorPoint,
    Fraction,
    LengthSweep,
    Measurements,
    Mix,
    ModePair,
    Point,
    Sweep,
    Waste,
    ratio,
    ratio_interval,
)
from bench.lib.schema_context import HostUnit
from bench.lib.sweep import VerdictSteps, last_within, pooled_verdict, run_sweeps
from bench.lib.workload import Universe

# Before reading wasted pre-inference, a leased prefix no Rank consumes is counted when its lease expires.
LEASE_SETTLE_S = LEASE_TTL_MS / 1000 + SETTLE_S
T = TypeVar("T")


class Bench(Driver):
    """Runs a benchmark and collects its results (`run`); `log` receives one line per step."""

    host_unit: HostUnit | None = None  # the run's unit and bounds, once `measure_host_unit` has run
    new_sweep: Callable[[], Sweep] = Sweep  # what a sweep records (the gpu profile's: `BudgetedSweep`)
    fresh_floor = True  # time the floor in a fresh process (False: in this one)

    # ---- the floor and the host's unit ----

    def floor(self, when: str, lengths: Sequence[int]) -> list[FloorPoint]:
        """The in-process floor at `lengths`, logged a line a length."""
        c = self.config
        self.log(f"in-process floor {when} ({c.model_preset}, {c.torch_threads} thread(s))")
        args = (c.model_preset, c.torch_threads, lengths, c.short_term, NUM_CANDIDATES,
                c.settings.floor_repeats, c.pre_infer_chunk_tokens, c.floor_device)  # fmt: skip
        floor = in_fresh_process(model_floor, *args) if self.fresh_floor else model_floor(*args)
        for p in floor:
            self.log(f"floor L={p.prefix_length}: full {p.full_ms:.1f} ms, "
                     f"pre-infer {p.pre_infer_ms:.1f} ms, cached rank {p.rank_ms:.1f} ms")  # fmt: skip
        return floor

    def measure_host_unit(self, floor: list[FloorPoint]) -> HostUnit:
        """The host's unit u from the run's first floor, and the run's settings in ms from now on
        (`BenchConfig.in_host_unit`)."""
        c = self.config
        (unit,) = [point for point in floor if point.prefix_length == c.unit_length]
        resolved = c.in_host_unit(unit.full_ms)
        self.host_unit = HostUnit(
            u_ms=unit.full_ms, length=c.unit_length, model_preset=c.model_preset,
            slo_u=None if c.slo_ms else c.slo_u,
            relay_window_u=None if c.relay_window_ms else c.relay_window_u,
            slo_ms=resolved.slo_ms, relay_window_ms=resolved.relay_window_ms,
            slo_multiples=c.slo_multiple_grid() if not c.slo_ms else [],
        )  # fmt: skip
        self.config = resolved
        self.shape = self.fleet_shape()
        self.log(f"host unit u = {unit.full_ms:g} ms (the full pass at {c.unit_length} events): "
                 f"{self.host_unit.describe()}")  # fmt: skip
        return self.host_unit

    # ---- sweeps ----

    def cached_rank(self, relay: BenchFleet, lengths: Sequence[int]) -> list[CachedRankPoint]:
        """The cached Rank through RelayGR's idle router at `lengths` (none without iterations)."""
        c = self.config
        if not c.settings.cached_rank_iterations:
            return []
        self.log("cached Rank through the router, idle fleet")
        cached = cached_rank_through_router(
            relay.router(), lengths, c.short_term, NUM_CANDIDATES, c.settings.cached_rank_iterations
        )
        for p in cached:
            self.log(f"cached Rank L={p.prefix_length}: P50 {p.rank_ms_p50} ms P99 {p.rank_ms_p99} "
                     f"ms ({p.request_kib} KiB, sources {p.sources})")  # fmt: skip
        return cached

    def length_guess(self, floor: list[FloorPoint], window_ms: float) -> int:
        """A length sweep's first grid index: where a miss (pre-infer + rank, the baseline's critical path,
        which RelayGR takes the relay window off) leaves half the SLO for queueing and the hops (the grid's
        middle without a floor)."""
        if not floor:
            return len(self.config.length_grid()) // 2
        return last_within([p.pre_infer_ms + p.rank_ms for p in floor], window_ms + self.config.slo_ms / 2)

    def length_sweeps(self, plans: list[Plan]) -> list[Sweep]:
        """Experiment 1 for each plan: every user at one length, at the length sweep's rate."""

        def measure(plan: Plan, length: float, seed_index: int, before: Before) -> Point:
            point = self.point(plan, self.universe(int(length)), self.config.length_rate, seed_index, before)
            return dataclasses.replace(point, long_term=int(length), delay_ms=plan.delay_ms)

        return self._sweeps(self.config.length_grid(), plans, measure, refine_steps=0)

    def load_sweeps(
        self, universe: Universe, plans: list[Plan], slo_ms: float | None = None, refine: bool = True,
        grid: list[float] | None = None,
    ) -> list[Sweep]:  # fmt: skip
        """Experiment 2 for each plan: a length mix at one offered load, refined between grid values
        (unless not `refine`), judged against `slo_ms` (None: the run's SLO), over `grid` (None: the load
        grid; each plan's `first` is an index into it)."""
        slo_ms = self.config.slo_ms if slo_ms is None else slo_ms

        def measure(plan: Plan, rate: float, seed_index: int, before: Before) -> Point:
            return self.point_once(plan, universe, rate, seed_index, before, slo_ms)

        steps = self.config.settings.refine_steps if refine else 0
        return self._sweeps(grid or self.config.load_grid(), plans, measure, steps, slo_ms)

    def capacity(self, universe: Universe, plans: list[Plan]) -> tuple[list[Sweep], dict[str, Capacity]]:
        """Both modes' load sweeps on the first mix at each SLO multiple of the host's unit
        (`--slo-multiples`), the largest first, each starting where the one before found its answers and
        reusing every point measured (`Driver.point_once`): the sweeps at the headline's multiple
        (`--slo-u`, refined between grid values) and a `Capacity` for every other one (grid values only,
        none below the lowest load measured before it). A run whose SLO is absolute has one multiple: its
        own."""
        c, unit = self.config, self.host_unit
        if unit is None or unit.slo_u is None:
            return self.load_sweeps(universe, plans), {}
        loads = c.load_grid()
        headline: list[Sweep] = []
        others: dict[str, Capacity] = {}
        measured: list[float] = []  # every load the sweeps so far measured
        for multiple in sorted(unit.slo_multiples, reverse=True):
            is_headline = multiple == unit.slo_u
            slo_ms = c.slo_ms if is_headline else round(multiple * unit.u_ms, 1)
            grid = loads if is_headline or not measured else [x for x in loads if x >= min(measured)]
            plans = [dataclasses.replace(plan, first=last_within(grid, loads[plan.first])) for plan in plans]
            self.log(f"capacity at SLO {multiple:g} u = {slo_ms:g} ms")
            base, rel = self.load_sweeps(universe, plans, slo_ms, refine=is_headline, grid=grid)
            measured += [point.rate for sweep in (base, rel) for point in sweep.points]
            if is_headline:
                headline = [base, rel]
            else:
                others[f"{multiple:g}"] = Capacity(
                    multiple=multiple, slo_ms=slo_ms, baseline=base, relay=rel,
                    ratio=ratio(rel.best, base.best), ratio_interval=ratio_interval(rel, base),
                )  # fmt: skip
            plans = [dataclasses.replace(plan, first=last_within(loads, sweep.best or min(measured)))
                     for plan, sweep in zip(plans, (base, rel), strict=True)]  # fmt: skip
        return headline, others

    def _sweeps(
        self, grid: list[float], plans: list[Plan], measure: Callable[[Plan, float, int, Before], Point],
        refine_steps: int, slo_ms: float | None = None,
    ) -> list[Sweep]:  # fmt: skip
        """One sweep per plan over `grid`, one load seed of each in turn (refinements included):
        `measure(plan, value, seed_index, before)` measures one seed, `pooled_verdict` decides how many a
        load takes."""
        c = self.config
        slo_ms = c.slo_ms if slo_ms is None else slo_ms

        def verdict(number: int, value: float) -> VerdictSteps:
            plan = plans[number]
            seeds = functools.partial(measure, plan, value)
            point = yield from pooled_verdict(seeds, c.settings.seed_cap, slo_ms, c.max_error_fraction)
            if point.verdict is not None and c.settings.seed_cap > 1:
                self.log(f"{plan.fleet.mode.name:<11} {value:g}: {describe_verdict(point.verdict)}")
            return point

        sweeps, stopped = run_sweeps(
            grid, [plan.first for plan in plans], verdict, refine_steps, self.new_sweep
        )
        if stopped is not None:
            self.log(f"time budget: {stopped}; the sweep is cut short")
        return sweeps

    def ranker_counters(self, fleet: BenchFleet, work: Callable[[], T]) -> tuple[T, dict[str, Any]]:
        """`work()`'s result and the change of the fleet's ranker counters over it, read after the
        rankers' lease has run out, so that every prefix no Rank consumed is counted as wasted."""
        before = probes.snapshot({}, fleet.ranker_metrics())
        result = work()
        time.sleep(LEASE_SETTLE_S)
        after = probes.snapshot({}, fleet.ranker_metrics())
        return result, probes.difference(before, after)["rankers"]

    def first_loads(self) -> tuple[int, int]:
        """The first mix's first grid indexes, the baseline's and RelayGR's: the length sweep's rate, where
        the baseline ranked long sequences, and two grid steps above it."""
        first = last_within(self.config.load_grid(), self.config.length_rate)
        return first, first + 2

    def next_loads(self, mix: Mix, firsts: tuple[int, int]) -> tuple[int, int]:
        """The next, longer mix's first grid indexes: one step below this mix's answers (or its first
        guesses, where a mode met the SLO nowhere)."""
        loads = self.config.load_grid()
        base, rel = (max((first if s.best is None else last_within(loads, s.best)) - 1, 0)
                     for first, s in zip(firsts, (mix.baseline, mix.relay), strict=True))  # fmt: skip
        return base, rel

    def mix_sweeps(
        self, mix: Universe, baseline: BenchFleet, relay: BenchFleet, firsts: tuple[int, int]
    ) -> Mix:
        """Experiment 2 on one mix (the first: at each SLO multiple, `capacity`), RelayGR's wasted
        pre-inference over it."""
        window = self.config.relay_window_ms
        plans = [Plan(baseline, firsts[0], window), Plan(relay, firsts[1], window)]
        ((base, rel), capacity), counters = self.ranker_counters(
            relay,
            lambda: self.capacity(mix, plans) if mix is self.mix else (self.load_sweeps(mix, plans), {}),
        )
        return self.mix_result(mix, base, rel, counters, capacity or None)

    def mix_result(
        self, mix: Universe, base: Sweep, rel: Sweep, counters: dict[str, Any], capacity: dict | None
    ) -> Mix:
        return Mix(
            universe=mix.label, max_long_term=mix.max_long_term, baseline=base, relay=rel,
            ratio=ratio(rel.best, base.best), ratio_interval=ratio_interval(rel, base), waste=waste(counters),
            capacity=capacity,
        )  # fmt: skip

    # ---- the run ----

    def run(self) -> Measurements:
        """The run (see the module's docstring)."""
        floor_lengths = sorted({*self.config.length_grid(), self.config.unit_length})
        floor = self.floor("before the fleets", floor_lengths)
        unit = self.measure_host_unit(floor)
        c = self.config
        loads, window = c.load_grid(), c.relay_window_ms
        chosen = [mode for mode in ABLATIONS if mode.name in c.ablation_names()]
        shared = [mode for mode in chosen if mode.fleet == RELAY.fleet]
        delays = c.settings.window_delays_ms
        throughput: dict[str, Mix] = {}
        with self.fleet(RELAY) as relay:
            with self.fleet(BASELINE) as baseline:
                cached = self.cached_rank(relay, c.length_grid())
                base_length, relay_length = self.length_sweeps([
                    Plan(baseline, self.length_guess(floor, 0.0), window),
                    Plan(relay, self.length_guess(floor, window), window),
                ])  # fmt: skip
                firsts = self.first_loads()
                for mix in self.mixes:
                    throughput[mix.label] = self.mix_sweeps(mix, baseline, relay, firsts)
                    firsts = self.next_loads(throughput[mix.label], firsts)
                first_mix = throughput[self.mix.label]
                abandonment = {f"{fraction:g}": self.abandonment(fraction, baseline, relay, first_mix)
                               for fraction in c.abandon_grid()}  # fmt: skip
            plans = [Plan(relay, self.length_guess(floor, delay), delay) for delay in delays]
            windows = self.length_sweeps(plans) if delays else []
            # The ablations start from the grid load at or below RelayGR's best: RelayGR measured it too.
            first = last_within(loads, first_mix.relay.best or loads[0])
            ablations: dict[str, Sweep] = {}
            if shared:
                plans = [Plan(relay, first, window, revisits=mode.revisits) for mode in shared]
                ablations.update(
                    zip([mode.name for mode in shared], self.load_sweeps(self.mix, plans), strict=True)
                )
            beside: dict[str, Sweep] = {}
            for mode in (mode for mode in chosen if mode not in shared):
                with self.fleet(mode) as fleet:
                    pair = [Plan(relay, first, window, tag=mode.name),  # RelayGR again, in turns with it
                            Plan(fleet, first, window, revisits=mode.revisits, tag=mode.name)]  # fmt: skip
                    beside[mode.name], ablations[mode.name] = self.load_sweeps(self.mix, pair)
        return Measurements(
            floor=floor, cached_rank=cached, throughput_sweeps=throughput,
            length_sweep=LengthSweep(rate=c.length_rate, baseline=base_length, relay=relay_length),
            abandonment=Abandonment(universe=self.mix.label, fractions=abandonment),
            window_sensitivity={f"{delay:g}": sweep for delay, sweep in zip(delays, windows, strict=True)},
            ablations=Ablations(universe=self.mix.label, rate=loads[first], sweeps=ablations,
                                relay_beside=beside),
            modes={m.name: m for m in (BASELINE, RELAY, *chosen)}, fleet=self.shape,
            mix_universes=list(self.mixes), floor_end=self.floor("after the fleets", floor_lengths),
            host_unit=unit,
        )  # fmt: skip

    def abandonment(
        self, fraction: float, baseline: BenchFleet, relay: BenchFleet, first_mix: Mix
    ) -> Fraction:
        """Both modes' load sweeps on the first mix with `fraction` of requests abandoned after retrieval,
        and RelayGR's wasted pre-inference over them; share 0 is the first mix's throughput sweep."""
        if fraction == 0:
            return Fraction(
                fraction=0.0, sweeps=None, baseline_best=first_mix.baseline.best,
                relay_best=first_mix.relay.best, ratio=first_mix.ratio,
                ratio_interval=first_mix.ratio_interval, waste=first_mix.waste,
            )  # fmt: skip
        loads, window = self.config.load_grid(), self.config.relay_window_ms
        plans = [Plan(fleet, last_within(loads, mode.best or loads[0]), window, fraction)
                 for fleet, mode in ((baseline, first_mix.baseline), (relay, first_mix.relay))]  # fmt: skip
        (base, rel), counters = self.ranker_counters(relay, lambda: self.load_sweeps(self.mix, plans))
        return Fraction(
            fraction=fraction, sweeps=ModePair(baseline=base, relay=rel), baseline_best=base.best,
            relay_best=rel.best, ratio=ratio(rel.best, base.best), ratio_interval=ratio_interval(rel, base),
            waste=waste(counters),
        )  # fmt: skip


def waste(counters: dict[str, Any]) -> Waste:
    """RelayGR's rankers' wasted pre-inference (device seconds of prefixes no Rank consumed), their
    device-thread seconds, the wasted share of them, and pre-inferred tokens by fate (0 when the rankers
    do not export these counters)."""
    device_s = sum(counters.get("device_s", {}).values())
    wasted_s = counters.get("pre_infer_wasted_s", 0.0)
    return Waste(
        wasted_pre_infer_s=round(wasted_s, 3), device_s=round(device_s, 3),
        wasted_share=round(wasted_s / device_s, 4) if device_s else None,
        pre_infer_tokens=counters.get("pre_infer_tokens", {}),
    )  # fmt: skip
