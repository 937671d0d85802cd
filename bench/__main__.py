"""`python -m bench --profile quick|full|gpu`: run the benchmark and write bench/results/<name>/.

Writes results.json, report.md and the plots there; the services' logs go to its `tmp/` folder (not
committed). Prints one line per step and, at the end, the headline ratios: length, throughput on each
mix, and throughput at each abandonment share. The gpu profile runs `bench.gpu` within its time budget
and writes its own report (`bench.report.gpu`), rewritten after each of its stages.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import overload

from bench import report
from bench.config import BenchConfig, load_config
from bench.context import machine, versions
from bench.experiments import Bench
from bench.gpu import GpuBench
from bench.gpu_monitor import GpuMonitor
from bench.report import gpu as gpu_report
from bench.schema import GpuMeasurements, GpuRun, Machine, Measurements, Run, Versions, headline_ratios
from services.launcher.procs import REPO_ROOT

RESULTS_DIR = REPO_ROOT / "bench" / "results"


def main(argv: Sequence[str] | None = None) -> None:
    config = load_config(argv, description=__doc__)
    out_dir = RESULTS_DIR / config.results_name
    started_at = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    started = time.monotonic()
    host = machine()
    if config.profile == "gpu":
        run_gpu(config, out_dir, started_at.isoformat(), started, host)
        return
    bench = Bench(config, out_dir / "tmp" / "logs", log=lambda line: print(line, flush=True))
    measured = bench.run()
    host.load_average_at_end = list(os.getloadavg())
    results = assemble(config, measured, started_at.isoformat(), time.monotonic() - started, host, versions())
    report.write(results, out_dir)
    print(f"{summary(results)}; SLO P99 {config.slo_ms:g} ms; report: {out_dir / 'report.md'}", flush=True)


def run_gpu(config: BenchConfig, out_dir: Path, started_at: str, started: float, host: Machine) -> None:
    """The gpu profile: `GpuBench` with a GPU monitor, its results written after every stage."""
    package_versions = versions()
    monitor = GpuMonitor.start()
    print(f"GPU monitor: {monitor.source or 'none (no NVML, no nvidia-smi)'}; GPU: {host.gpu}", flush=True)

    def results_of(measured: GpuMeasurements) -> GpuRun:
        return assemble(config, measured, started_at, time.monotonic() - started, host, package_versions)

    def checkpoint(measured: GpuMeasurements) -> None:
        gpu_report.write(results_of(measured), out_dir, plots=False)

    log_dir = out_dir / "tmp" / "logs"
    bench = GpuBench(config, log_dir, lambda line: print(line, flush=True), started, monitor, checkpoint)
    try:
        measured = bench.run()
    finally:
        monitor.close()
    host.load_average_at_end = list(os.getloadavg())
    results = results_of(measured)
    gpu_report.write(results, out_dir)
    ratios = ", ".join(f"{label} {ratio}" for label, ratio in results.throughput_ratios.items())
    print(
        f"length ratio {results.length_ratio}; throughput ratios {ratios or 'not measured'}; "
        f"{results.duration_s:.0f} s; report: {out_dir / 'report.md'}",
        flush=True,
    )


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


def summary(results: Run) -> str:
    """The headline ratios in one line: length (with its relay window), each mix, each abandonment share."""
    measured = results.measured
    length = measured.length_sweep
    window = results.configuration.relay_window_ms
    mixes = ", ".join(
        f"{label} {mix.ratio} ({mix.relay.best} vs {mix.baseline.best} req/s)"
        for label, mix in measured.throughput_sweeps.items()
    )
    abandoned = ", ".join(
        f"{entry.fraction:.0%} {entry.ratio}" for entry in measured.abandonment.fractions.values()
    )
    return (
        f"length ratio {results.length_ratio} ({length.relay.best} vs {length.baseline.best} "
        f"events at {length.rate:g} req/s, relay window {window:g} ms); throughput ratios {mixes}; "
        f"throughput ratios with requests abandoned {abandoned or 'not measured'}"
    )


if __name__ == "__main__":
    main()
