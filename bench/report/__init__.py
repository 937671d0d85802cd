"""The benchmark's outputs: results.json, report.md and the PNG plots, all from a run's results.

`results.json` is the `bench.lib.schema.Run` written once (`Run.to_json`): everything measured (every point,
with its cost), the headline ratios under `length_ratio`, `throughput_ratio` (the first mix) and
`throughput_ratios` (every mix), the machine, the versions and the configuration. `report.md` and the
plots are rendered from it alone, so `python -m bench report` can always render them again.

The package: `figures` (what the reports derive from the results, and their cells and tables),
`markdown` (`render_markdown`, section by section, its sections on the edges in `verdicts`), `plots`
(`plot_all`), `gpu` (the gpu profile's report) and `readme` (the README's Results). `write` writes the
report of a run's kind.
"""

from __future__ import annotations

from pathlib import Path

from bench.lib.schema import Run
from bench.lib.schema_gpu import GpuRun
from bench.report import gpu
from bench.report.markdown import render_markdown
from bench.report.plots import plot_all

__all__ = ["render_markdown", "write"]


def write(run: Run, out_dir: Path, plots: bool = True, results: bool = True) -> None:
    """Writes results.json (with `results`), the plots (with `plots`) and report.md into `out_dir`: the gpu
    profile's report for a `GpuRun`, else the CPU profiles'."""
    render, draw = (
        (gpu.render_markdown, gpu.plot_all) if isinstance(run, GpuRun) else (render_markdown, plot_all)
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    if results:
        run.write(out_dir / "results.json")
    if plots:
        draw(run, out_dir)
    (out_dir / "report.md").write_text(render(run))
