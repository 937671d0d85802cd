"""results.json of the gpu profile (`python -m bench run --profile gpu`, `bench.run.gpu.GpuBench`): a
`GpuRun` is a `bench.lib.schema.Run` whose sweeps (`BudgetedSweep`) the time budget may cut short and whose
points (`GpuPoint`) say how busy the GPU was."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bench.lib import envelope
from bench.lib.codec import FLAT
from bench.lib.fleets import FleetShape, Mode
from bench.lib.schema import LengthSweep, Mix, Point, Run, Sweep, schema
from bench.lib.schema_context import CachedRankPoint, FloorPoint
from bench.lib.workload import Universe


@dataclasses.dataclass(frozen=True, kw_only=True)
class GpuBusy:
    """How busy the GPUs were over a point's measured requests (`bench.lib.gpu_monitor.GpuMonitor.busy`)."""

    source: str
    busy: float | None  # the busiest GPU's mean utilization; None when no sample fell in the window
    per_gpu: dict[str, float]
    samples: int
    memory_used_mib_max: float | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class GpuPoint(Point):
    gpu: GpuBusy | None  # None: no GPU monitor


@schema
class BudgetedSweep(Sweep):
    """A sweep that the time budget may cut short: then `best` is None and the bounds say what was seen."""

    points: list[GpuPoint] = dataclasses.field(default_factory=list)  # type: ignore[assignment]
    cut_short: bool = False
    cut_reason: str | None = None
    passed_up_to: float | None = None  # the largest value that met the SLO (a lower bound when cut)
    failed_from: float | None = None  # the smallest value above it that failed


@schema
class GpuLengthSweep(LengthSweep):
    baseline: BudgetedSweep
    relay: BudgetedSweep
    ratio: float | None  # None unless both sweeps finished
    complete: bool
    ratio_at_least: float | None  # RelayGR cut short after passing somewhere: the ratio is at least this


@schema
class GpuMix(Mix):
    baseline: BudgetedSweep
    relay: BudgetedSweep
    complete: bool
    ratio_at_least: float | None


@schema
class TimeBudget:
    seconds: float
    reserve_s: float
    used_s: float
    skipped: dict[str, str]  # stage: why


@schema
class GpuMeasurements:
    """What `GpuBench.run` measured so far (see `bench.run.gpu`): every stage fills its part."""

    floor: list[FloorPoint] = dataclasses.field(default_factory=list)
    cached_rank: list[CachedRankPoint] = dataclasses.field(default_factory=list)
    length_sweep: GpuLengthSweep | None = None
    throughput_sweeps: dict[str, GpuMix] = dataclasses.field(default_factory=dict)
    modes: dict[str, Mode]
    fleet: FleetShape
    mix_universes: list[Universe]
    time_budget: TimeBudget | None = None
    errors: list[str] = dataclasses.field(default_factory=list)  # `stage: error` of each failed stage


@schema
class GpuRun(Run):
    measured: GpuMeasurements = dataclasses.field(metadata=FLAT)


def load_run(path: Path) -> Run:
    """A committed `python -m bench run`'s results: a `GpuRun` for the gpu profile's, else a `Run`."""
    record = envelope.read(path, "run")
    kind = GpuRun if record["configuration"].get("profile") == "gpu" else Run
    return kind.from_json(record)
