"""`python -m bench.report bench/results/<name> [--no-plots]`: renders a run's report.md (and its plots)
again from its results.json, which is read and checked, not rewritten. A gpu profile's results get the gpu
report (`bench.report.gpu`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from bench.report import gpu as gpu_report
from bench.report.markdown import render_markdown
from bench.report.plots import plot_all
from bench.schema import GpuRun, Run


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__)
    parser.add_argument("results_dir", type=Path, help="a folder with a results.json")
    parser.add_argument("--no-plots", action="store_true", help="write report.md only")
    args = parser.parse_args(argv)
    data = json.loads((args.results_dir / "results.json").read_text())
    if data.get("configuration", {}).get("profile") == "gpu":
        run: Run = GpuRun.from_json(data)
        markdown = gpu_report.render_markdown(run)
        draw = gpu_report.plot_all
    else:
        run = Run.from_json(data)
        markdown = render_markdown(run)
        draw = plot_all
    if not args.no_plots:
        draw(run, args.results_dir)
    (args.results_dir / "report.md").write_text(markdown)
    print(args.results_dir / "report.md")


if __name__ == "__main__":
    main()
