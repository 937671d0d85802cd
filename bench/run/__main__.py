"""`python -m bench run --profile quick|full|gpu`: run the benchmark and write bench/results/<name>/.

Writes results.json, report.md and the plots there; the services' logs go to its `tmp/` folder (not
committed). Prints one line per step and, at the end, the headline ratios: length, throughput on each
mix, and throughput at each abandonment share. The gpu profile runs `bench.run.gpu` within its time budget
and writes its own report (`bench.report.gpu`), rewritten after each of its stages.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from bench import report
from bench.lib.config import BenchConfig, load_config
from bench.lib.context import machine, versions
from bench.lib.gpu_monitor import GpuMonitor
from bench.lib.schema import Machine, Measurements, Run, Versions, ratio, ratio_interval
from bench.lib.schema_gpu import GpuMeasurements, GpuRun
from bench.run.experiments import Bench
from bench.run.gpu import GpuBench
from services.launcher.procs import REPO_ROOT

RESULTS_DIR = REPO_ROOT / "bench" / "results"
R = TypeVar("R", bound=Run)


def assemble(
    kind: type[R], config: BenchConfig, measured: Measurements | GpuMeasurements, started_at: str,
    duration_s: float, host: Machine, package_versions: Versions,
) -> R:  # fmt: skip
    """A run's results (`kind`: a `Run` of what `Bench.run` measured, a `GpuRun` of `GpuBench.run`'s): the
    headline ratios, the run's context (its bounds in ms, where they were multiples of its host's unit) and
    what it measured."""
    if isinstance(measured, Measurements) and measured.host_unit is not None:
        config = config.in_host_unit(measured.host_unit.u_ms)
    length = measured.length_sweep
    ratios = {label: mix.ratio for label, mix in measured.throughput_sweeps.items()}
    interval = {"length_ratio_interval": ratio_interval(length.relay, length.baseline)} if kind is Run else {}
    return kind(
        name=config.results_name, throughput_ratio=next(iter(ratios.values()), None),
        throughput_ratios=ratios, **interval,
        length_ratio=None if length is None else ratio(length.relay.best, length.baseline.best),
        started_at=started_at, duration_s=round(duration_s, 1), machine=host, versions=package_versions,
        configuration=config, profile=config.settings, measured=measured,
    )  # fmt: skip


def summary(results: Run) -> str:
    """The headline ratios in one line, each with its bracket-based interval (` in [2.85, 3.413]`): length
    (with its relay window), each mix, each abandonment share; the host's unit and the bounds first."""

    def interval(bounds: list[float | None] | None) -> str:
        return (
            "" if bounds is None else f" in [{bounds[0]}, {'unbounded' if bounds[1] is None else bounds[1]}]"
        )

    measured = results.measured
    length, unit = measured.length_sweep, measured.host_unit
    mixes = ", ".join(
        f"{label} {mix.ratio}{interval(mix.ratio_interval)} ({mix.relay.best} vs {mix.baseline.best} req/s)"
        for label, mix in measured.throughput_sweeps.items()
    )
    abandoned = ", ".join(f"{entry.fraction:.0%} {entry.ratio}{interval(entry.ratio_interval)}"
                          for entry in measured.abandonment.fractions.values())  # fmt: skip
    return (
        (f"host unit u {unit.u_ms:g} ms: {unit.describe()}; " if unit else "")
        + f"length ratio {results.length_ratio}{interval(results.length_ratio_interval)} "
        f"({length.relay.best} vs {length.baseline.best} events at {length.rate:g} req/s, relay window "
        f"{results.configuration.relay_window_ms:g} ms); throughput ratios {mixes}; "
        f"throughput ratios with requests abandoned {abandoned or 'not measured'}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    config = load_config(argv, description=__doc__)
    out_dir, log_dir = RESULTS_DIR / config.results_name, RESULTS_DIR / config.results_name / "tmp" / "logs"
    started_at = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
    started, host, package_versions = time.monotonic(), machine(), versions()
    kind = GpuRun if config.profile == "gpu" else Run

    def log(line: str) -> None:
        print(line, flush=True)

    def results_of(measured: Any) -> Run:
        return assemble(
            kind, config, measured, started_at, time.monotonic() - started, host, package_versions
        )

    if kind is Run:
        measured = Bench(config, log_dir, log).run()
    else:
        with contextlib.closing(GpuMonitor.start()) as monitor:
            log(f"GPU monitor: {monitor.source or 'none (no NVML, no nvidia-smi)'}; GPU: {host.gpu}")
            checkpoint = lambda so_far: report.write(results_of(so_far), out_dir, plots=False)  # noqa: E731
            measured = GpuBench(config, log_dir, log, started, monitor, checkpoint).run()
    host.load_average_at_end = list(os.getloadavg())
    results = results_of(measured)
    report.write(results, out_dir)
    if kind is Run:
        line = f"{summary(results)}; SLO P99 {results.configuration.slo_ms:g} ms"
    else:
        ratios = ", ".join(f"{label} {ratio}" for label, ratio in results.throughput_ratios.items())
        line = f"length ratio {results.length_ratio}; throughput ratios {ratios or 'not measured'}; "
        line += f"{results.duration_s:.0f} s"
    log(f"{line}; report: {out_dir / 'report.md'}")


if __name__ == "__main__":
    main()
