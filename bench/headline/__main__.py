"""`python -m bench headline`: the headline, measured in randomized interleaved blocks (docs/benchmark.md).

Calibrates u and L on the idle host, starts the baseline's, RelayGR's and admit-all's fleets, runs
`--blocks` blocks (every arm once on one arrival seed, in a Williams order) and analyses them: results.json,
report.md and the plot go to bench/results/<name>/ (rewritten after every block, the analysis at the end);
the services' logs to its tmp/ folder. Prints one line per trial and block and, at the end, the claim.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import time
from collections.abc import Sequence
from pathlib import Path

from bench.headline import analysis
from bench.headline.config import HeadlineConfig
from bench.headline.report import claim, draw, render_markdown
from bench.headline.run import HeadlineBench
from bench.headline.schema import HeadlineResults
from bench.lib.context import git_commit, machine, versions
from services.common.config import load


def analysed(results: HeadlineResults) -> HeadlineResults:
    """`results` with its two analyses: the blocks kept, and every block."""
    args = (results.blocks, results.trials, results.calibration, results.settings)
    return dataclasses.replace(
        results, kept=analysis.analyse(*args, kept_only=True), every=analysis.analyse(*args, kept_only=False)
    )


def write(results: HeadlineResults, out_dir: Path, plots: bool = True) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    results.write(out_dir / "results.json")
    (out_dir / "report.md").write_text(render_markdown(results))
    if plots:
        draw(results, out_dir)


def main(
    argv: Sequence[str] | None = None, bench_class: type[HeadlineBench] = HeadlineBench
) -> HeadlineResults:
    config = load(HeadlineConfig, argv, prog="python -m bench headline", description=__doc__)
    out_dir = config.out_dir()
    started_at = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
    started = time.monotonic()
    host, package_versions, commit = machine(), versions(), git_commit()
    bench = bench_class(config, out_dir / "tmp" / "logs", log=lambda line: print(line, flush=True))

    def results() -> HeadlineResults:
        assert bench.calibration is not None and bench.driver is not None
        return HeadlineResults(
            started_at=started_at,
            duration_s=round(time.monotonic() - started, 1),
            commit=commit,
            machine=host,
            versions=package_versions,
            settings=config,
            fleet=bench.driver.shape,
            universe=bench.driver.mix,
            calibration=bench.calibration,
            design=bench.design,
            blocks=list(bench.blocks),
            trials=list(bench.trials),
        )

    bench.run(on_block=lambda: write(results(), out_dir, plots=False))
    host.load_average_at_end = list(os.getloadavg())
    final = analysed(results())
    write(final, out_dir)
    print(claim(final, final.kept), flush=True)
    print(f"report: {out_dir / 'report.md'}", flush=True)
    return final


if __name__ == "__main__":
    main()
