"""`python -m bench run --profile quick|full|gpu`: run the benchmark and write bench/results/<name>/.

Writes results.json, report.md and the plots there; the services' logs go to its `tmp/` folder (not
committed). Prints one line per step and, at the end, the headline ratios: length, throughput on each
mix, and throughput at each abandonment share. The gpu profile runs `bench.run.gpu` within its time budget
and writes its own report (`bench.report.gpu`), rewritten after each of its stages.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Sequence
from pathlib import Path

from bench import report
from bench.lib.config import BenchConfig, load_config
from bench.lib.context import machine, versions
from bench.lib.gpu_monitor import GpuMonitor
from bench.lib.schema import Machine
from bench.lib.schema_gpu import GpuMeasurements, GpuRun
from bench.run.experiments import Bench
from bench.run.gpu import GpuBench
from bench.run.record import assemble, summary
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
    print(
        f"{summary(results)}; SLO P99 {results.configuration.slo_ms:g} ms; report: {out_dir / 'report.md'}",
        flush=True,
    )


def run_gpu(config: BenchConfig, out_dir: Path, started_at: str, started: float, host: Machine) -> None:
    """The gpu profile: `GpuBench` with a GPU monitor, its results written after every stage."""
    package_versions = versions()
    monitor = GpuMonitor.start()
    print(f"GPU monitor: {monitor.source or 'none (no NVML, no nvidia-smi)'}; GPU: {host.gpu}", flush=True)

    def results_of(measured: GpuMeasurements) -> GpuRun:
        return assemble(config, measured, started_at, time.monotonic() - started, host, package_versions)

    def checkpoint(measured: GpuMeasurements) -> None:
        report.write(results_of(measured), out_dir, plots=False)

    log_dir = out_dir / "tmp" / "logs"
    bench = GpuBench(config, log_dir, lambda line: print(line, flush=True), started, monitor, checkpoint)
    try:
        measured = bench.run()
    finally:
        monitor.close()
    host.load_average_at_end = list(os.getloadavg())
    results = results_of(measured)
    report.write(results, out_dir)
    ratios = ", ".join(f"{label} {ratio}" for label, ratio in results.throughput_ratios.items())
    print(
        f"length ratio {results.length_ratio}; throughput ratios {ratios or 'not measured'}; "
        f"{results.duration_s:.0f} s; report: {out_dir / 'report.md'}",
        flush=True,
    )
