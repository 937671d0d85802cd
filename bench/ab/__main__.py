"""`python -m bench ab --modes baseline,relay --rates 20,40 --seeds 5`: a fixed-load A/B of the named modes.

Every mode's fleet is started at once; then, seed by seed and load by load, each mode is driven for one
run (the same users and arrival times in every mode), the modes' order rotating (`bench.ab.run.schedule`).
results.json and report.md go to bench/results/<name>/ (`--name`; without it, relaygr-ab in the temporary
folder) and are rewritten after every run; the services' logs go to its tmp/ folder.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Sequence
from pathlib import Path

from bench.ab.analysis import analyse
from bench.ab.config import AbConfig
from bench.ab.report import render_markdown
from bench.ab.run import AbBench
from bench.ab.schema import AbResults, AbRun
from bench.lib.context import machine, versions
from bench.lib.schema import Machine, Versions
from services.common.config import load


def results_of(
    config: AbConfig, runs: list[AbRun], bench: AbBench, started_at: str, duration_s: float, host: Machine,
    package_versions: Versions,
) -> AbResults:  # fmt: skip
    """The A/B's results from its runs; a mode or load with no run yet has no cell or comparison."""
    complete = len(runs) == len(config.mode_names()) * len(config.rate_list()) * config.seeds
    cells, comparisons = analyse(runs, config) if complete else ([], [])
    return AbResults(
        started_at=started_at,
        duration_s=round(duration_s, 1),
        machine=host,
        versions=package_versions,
        settings=config,
        recommend_bound_ms=config.recommend_bound_ms,
        modes=config.mode_list(),
        fleet=bench.bench.shape,
        universe=bench.bench.mix,
        cells=cells,
        comparisons=comparisons,
        runs=runs,
        warmups=list(bench.warmups),
    )


def write(results: AbResults, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    results.write(out_dir / "results.json")
    (out_dir / "report.md").write_text(render_markdown(results))


def main(argv: Sequence[str] | None = None, bench_class: type[AbBench] = AbBench) -> AbResults:
    config = load(AbConfig, argv, prog="python -m bench ab", description=__doc__)
    out_dir = config.out_dir()
    started_at = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
    started = time.monotonic()
    host, package_versions = machine(), versions()
    bench = bench_class(config, out_dir / "tmp" / "logs", log=lambda line: print(line, flush=True))

    def checkpoint(runs: list[AbRun]) -> AbResults:
        results = results_of(
            config, list(runs), bench, started_at, time.monotonic() - started, host, package_versions
        )
        write(results, out_dir)
        return results

    runs = bench.run(config.mode_list(), on_run=checkpoint)
    host.load_average_at_end = list(os.getloadavg())
    results = checkpoint(runs)
    for comparison in results.comparisons:
        for verdict in comparison.verdicts:
            print(verdict, flush=True)
    print(f"report: {out_dir / 'report.md'}", flush=True)
    return results


if __name__ == "__main__":
    main()
