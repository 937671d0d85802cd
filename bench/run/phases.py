"""The phases of a CPU run and the host's unit in each (`Phased`, which `bench.run.experiments.Bench` runs
its experiments on).

A run's bounds are multiples of the host's unit u (`bench.lib.config.BenchConfig.slo_u`): the in-process full
pass of the fleet's preset at the first mix's cap, timed in a fresh process. The host's speed drifts within a
run on a shared VM, though (by a sixth from a run's start to its end on an idle 2-core VM), and an SLO fixed
in ms at the start is then another multiple of u by the end. So a run goes in phases, one experiment each (the
length sweep, a mix's load sweeps, an abandoned share, an ablation with RelayGR beside it). Each phase

- waits for the rankers' leases on the last point's prefixes to run out and every running fleet to be
  idle, and times u again (`bench.lib.floor.host_unit_ms`);
- judges its points against the run's SLO multiples of that u (`slo_at`). The fleets keep what they
  started with: the trigger's SLO and the relay window, multiples of the run's first u;
- times u again at its end (the next phase reuses that timing where it starts within `REUSE_S`). A
  phase whose u moved more than `--floor-drift-limit` between its start and its end flags the run and
  is named in the flag (`bench.lib.checks`): its points were judged in a unit the host no longer had.

A timing more than `RECHECK_SHARE` from the one before is timed twice more, and the median of the three
counts: a slower host is slower three times, a disturbed timing seldom twice. A phase's u is its own
timing, never a running minimum over the run's (which can only fall, and tightens an SLO in u as a run goes
on). The host's drift within a phase is recorded, not waited out; the headline's own experiment
(`bench.headline`) measures drift beside every trial instead.

Each phase is recorded (`bench.lib.schema.Phase`) and logged with its place in the run and the time left,
estimated from the phase times of the latest other run of the profile (`estimate`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.lib.driving import LEASE_TTL_MS, NUM_CANDIDATES, SETTLE_S, Driver
from bench.lib.floor import host_unit_ms, in_fresh_process, model_floor
from bench.lib.schema import FloorPoint
from bench.lib.schema_context import HostUnit, Phase

REUSE_S = 30.0  # a unit timed this recently (at the previous phase's end) serves as the next one's start
# A timing this far from the last one is timed twice more and the median of the three counts: one timing of
# three passes read u 45 % slower at a phase's end while the points before and after it ranked as fast as
# ever, and flagged its run.
RECHECK_SHARE = 0.05
# Before u is timed: the rankers' lease on the last point's unconsumed prefixes runs out, and their spills
# to DRAM (copies on the copy thread) are done, so they do not fall in the fraction of a second it takes.
UNIT_SETTLE_S = LEASE_TTL_MS / 1000 + SETTLE_S


class Phased(Driver):
    """A `Driver` whose experiments run in phases, each in the host's unit as timed at its start."""

    host_unit: HostUnit | None = None  # the run's unit and bounds, once `measure_host_unit` has run
    phases: list[Phase]
    planned: list[str]  # every phase's name, in order (`plan_phases`)
    _estimates: dict[str, float]  # seconds each phase took in an earlier run of the profile
    _estimated_total: float | None  # that run's duration, where it recorded no phases
    _last_unit: tuple[float, float] | None = None  # (monotonic time, u ms) of the latest timing

    def floor(self, when: str) -> list[FloorPoint]:
        """The in-process floor at every length of the grid and the host unit's, logged."""
        c = self.config
        self.log(f"in-process floor {when} ({c.model_preset}, {c.torch_threads} thread(s))")
        lengths = sorted({*c.length_grid(), c.unit_length})
        floor = in_fresh_process(
            model_floor, c.model_preset, c.torch_threads, lengths, c.short_term, NUM_CANDIDATES,
            c.settings.floor_repeats, c.pre_infer_chunk_tokens, c.floor_device,
        )  # fmt: skip
        self.log_floor(floor)
        return floor

    def log_floor(self, floor: list[FloorPoint]) -> None:
        """One line a length of a floor: its full pass, pre-inference and cached rank."""
        for p in floor:
            self.log(f"floor L={p.prefix_length}: full {p.full_ms:.1f} ms, "
                     f"pre-infer {p.pre_infer_ms:.1f} ms, cached rank {p.rank_ms:.1f} ms")  # fmt: skip

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

    def plan_phases(self, names: Sequence[str], results_dir: Path | None) -> None:
        """The run's phases, in order, and the time each took in the latest other run of this profile
        under `results_dir` (`estimate`; None: none)."""
        self.phases, self.planned = [], list(names)
        found = estimate(results_dir, self.config.profile) if results_dir else ({}, None)
        self._estimates, self._estimated_total = found

    _current: float | None = None  # u in the phase now running

    def slo_at(self, multiple: float) -> float:
        """The SLO `multiple` u in ms, in the phase now running, else in the run's u (a run with an
        absolute SLO: its own)."""
        run = self.host_unit
        if run is None or run.slo_u is None:
            return self.config.slo_ms
        return round(multiple * (self._current or run.u_ms), 1)

    def time_unit(self, reuse: bool) -> float:
        """u timed now in a fresh process, once every running fleet is idle (`wait_idle`); with `reuse`,
        the latest timing instead where it is at most `REUSE_S` old (a phase's start after another's end)."""
        last = self._last_unit
        if reuse and last is not None and time.monotonic() - last[0] <= REUSE_S:
            return last[1]
        known = last[1] if last is not None else self.host_unit.u_ms if self.host_unit else None
        unit = self._timed_unit()
        if known is not None and abs(unit / known - 1) > RECHECK_SHARE:
            again = [self._timed_unit(), self._timed_unit()]
            self.log(f"u timed {unit:g} ms, {unit / known - 1:+.1%} from the last timing ({known:g} ms); "
                     f"timed twice more: {again[0]:g}, {again[1]:g} ms; the median counts")  # fmt: skip
            unit = statistics.median([unit, *again])
        self._last_unit = (time.monotonic(), unit)
        return unit

    def _timed_unit(self) -> float:
        time.sleep(UNIT_SETTLE_S)
        self.wait_idle(None)
        c = self.config
        return host_unit_ms(c.model_preset, c.torch_threads, c.short_term, c.pre_infer_chunk_tokens,
                            c.unit_length, c.settings.floor_repeats)  # fmt: skip

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Runs the block as the phase `name`: u timed at its start and end, its points judged against
        the run's SLO in that u (`slo_at`, and `config.slo_ms` at the headline's multiple)."""
        c, run = self.config, self.host_unit
        started = time.monotonic()
        unit = self.time_unit(reuse=True)
        self._current = unit
        slo_ms = self.slo_at(run.slo_u) if run is not None and run.slo_u is not None else c.slo_ms
        self.config = dataclasses.replace(c, slo_ms=slo_ms)
        index = len(self.phases)
        moved = f" ({unit / run.u_ms - 1:+.1%} from the run's)" if run else ""
        judged = f"SLO {run.slo_u:g} u = {slo_ms:g} ms" if run and run.slo_u else f"SLO {slo_ms:g} ms"
        self.log(f"phase {index + 1} of {len(self.planned)}: {name}: u = {unit:g} ms{moved}, {judged}; "
                 f"{self.time_left(index)}")  # fmt: skip
        try:
            yield
        finally:
            self.config = dataclasses.replace(self.config, slo_ms=c.slo_ms)
            self._current = None
        end = self.time_unit(reuse=False)
        phase = Phase(
            name=name, started_s=round(started - self._started, 1),
            duration_s=round(time.monotonic() - started, 1), u_ms=round(unit, 4), u_end_ms=round(end, 4),
            slo_ms=slo_ms,
        )  # fmt: skip
        self.phases.append(phase)
        self.log(f"phase {index + 1} done in {phase.duration_s / 60:.1f} min: u {unit:g} -> {end:g} ms "
                 f"({phase.change:+.1%})")  # fmt: skip

    def time_left(self, index: int) -> str:
        """The estimated time left from the start of phase `index`, by the earlier run's phase times (or,
        where it recorded none, by its duration)."""
        remaining = self.planned[index:]
        if remaining and all(name in self._estimates for name in remaining):
            minutes = sum(self._estimates[name] for name in remaining) / 60
            return f"about {minutes:.0f} min left (by the phase times of the last run of this profile)"
        if self._estimated_total is not None:
            left = max(self._estimated_total - (time.monotonic() - self._started), 0) / 60
            return f"about {left:.0f} min left (by the duration of the last run of this profile)"
        return "time left unknown (no earlier run of this profile to estimate from)"


def estimate(results_dir: Path, profile: str) -> tuple[dict[str, float], float | None]:
    """The phase times (seconds by name) of the latest run of `profile` under `results_dir` that recorded
    them, and the duration of the latest run of it at all (None: none); unreadable files are skipped."""
    runs: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(results_dir.glob("*/results.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("configuration", {}).get("profile") == profile:
            runs.append((str(data.get("started_at", "")), data))
    runs.sort(key=lambda run: run[0])
    phased = [data for _, data in runs if data.get("phases")]
    phases = {p["name"]: float(p["duration_s"]) for p in phased[-1]["phases"]} if phased else {}
    total = float(runs[-1][1]["duration_s"]) if runs else None
    return phases, total
