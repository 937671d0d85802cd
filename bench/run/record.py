"""A run's record: what `Bench.run` or `GpuBench.run` measured, with the headline ratios and the run's
context (`assemble`), and its headline in one line (`summary`). A committed run from before the host's unit
may carry checks (`Run.checks`): the report shows them; no run records new ones."""

from __future__ import annotations

from typing import Any, overload

from bench.lib.config import BenchConfig
from bench.lib.schema import Machine, Measurements, Run, Versions, ratio, ratio_interval
from bench.lib.schema_gpu import GpuMeasurements, GpuRun


@overload
def assemble(
    config: BenchConfig, measured: Measurements, started_at: str, duration_s: float, host: Machine,
    package_versions: Versions,
) -> Run: ...  # fmt: skip
@overload
def assemble(
    config: BenchConfig, measured: GpuMeasurements, started_at: str, duration_s: float, host: Machine,
    package_versions: Versions,
) -> GpuRun: ...  # fmt: skip
def assemble(
    config: BenchConfig,
    measured: Measurements | GpuMeasurements,
    started_at: str,
    duration_s: float,
    host: Machine,
    package_versions: Versions,
) -> Run:
    """The run's results: the headline ratios (from what it measured), the run's context, and what
    `Bench.run` (a `Run`) or `GpuBench.run` (a `GpuRun`) measured."""
    kind = GpuRun if isinstance(measured, GpuMeasurements) else Run
    if kind is Run and measured.host_unit is not None:  # the bounds the run measured against, in ms
        config = config.in_host_unit(measured.host_unit.u_ms)
    return kind(
        name=config.results_name,
        **headline_ratios(measured),
        started_at=started_at,
        duration_s=round(duration_s, 1),
        machine=host,
        versions=package_versions,
        configuration=config,
        profile=config.settings,
        measured=measured,
    )


def interval(bounds: list[float | None] | None) -> str:
    """A ratio's bracket-based interval as the summary writes it (` in [2.85, 3.413]`; empty without one)."""
    if bounds is None:
        return ""
    low, high = bounds
    return f" in [{low}, {'unbounded' if high is None else high}]"


def summary(results: Run) -> str:
    """The headline ratios in one line, each with its bracket-based interval where the run has one:
    length (with its relay window), each mix, each abandonment share; a flagged run says so first."""
    measured = results.measured
    length = measured.length_sweep
    window = results.configuration.relay_window_ms
    mixes = ", ".join(
        f"{label} {mix.ratio}{interval(mix.ratio_interval)} ({mix.relay.best} vs {mix.baseline.best} req/s)"
        for label, mix in measured.throughput_sweeps.items()
    )
    abandoned = ", ".join(
        f"{entry.fraction:.0%} {entry.ratio}{interval(entry.ratio_interval)}"
        for entry in measured.abandonment.fractions.values()
    )
    unit = measured.host_unit
    bounds = f"host unit u {unit.u_ms:g} ms: {unit.describe()}; " if unit else ""
    flagged = (
        f"FLAGGED ({'; '.join(results.checks.flags)}); " if results.checks and results.checks.flags else ""
    )
    return (
        flagged
        + bounds
        + (
            f"length ratio {results.length_ratio}{interval(results.length_ratio_interval)} "
            f"({length.relay.best} vs {length.baseline.best} events at {length.rate:g} req/s, relay window "
            f"{window:g} ms); throughput ratios {mixes}; "
            f"throughput ratios with requests abandoned {abandoned or 'not measured'}"
        )
    )


def headline_ratios(measured: Measurements | GpuMeasurements) -> dict[str, Any]:
    """A run's headline ratios from what it measured: the length sweep's (with its interval), each mix's
    and the first mix's."""
    length = measured.length_sweep
    ratios = {label: mix.ratio for label, mix in measured.throughput_sweeps.items()}
    headline = {
        "throughput_ratio": next(iter(ratios.values()), None),
        "throughput_ratios": ratios,
        "length_ratio": None if length is None else ratio(length.relay.best, length.baseline.best),
    }
    if isinstance(measured, Measurements):
        headline["length_ratio_interval"] = ratio_interval(length.relay, length.baseline)
    return headline
