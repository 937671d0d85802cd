"""The benchmark's outputs: results.json, report.md and the PNG plots, all from a run's results.

`results.json` is the `bench.lib.schema.Run` written once (`Run.to_json`): everything measured (every point,
with its cost), the headline ratios under `length_ratio`, `throughput_ratio` (the first mix) and
`throughput_ratios` (every mix), the machine, the versions and the configuration. `report.md` and the
plots are rendered from it alone, so a results file can always be rendered again:
`python -m bench report --results-dir bench/results/<name>` reads its results.json (`Run.load`, which refuses
one that lacks a field they read) and writes the report and the plots beside it.

The package: `figures` (what the report derives from the results), `tables` (its markdown tables),
`verdicts` (the run's checks at the top, the brackets, ratio intervals and pooled verdicts),
`markdown` (`render_markdown`, section by section) and `plots` (`plot_all`); `gpu`, the gpu profile's
own report. `write` and `renderer` pick the report of a run's kind.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bench.lib.schema import Run
from bench.lib.schema_gpu import GpuRun
from bench.report import gpu
from bench.report.figures import (
    CPU_SERVICES,
    CPU_TARGETS_MS,
    cores_needed,
    cpu_ms_per_request,
    hit_rate_points,
    point_at,
    requests_sent,
)  # fmt: skip
from bench.report.markdown import render_markdown
from bench.report.plots import PLOTS, plot_all

__all__ = [
    "CPU_SERVICES", "CPU_TARGETS_MS", "PLOTS", "cores_needed", "cpu_ms_per_request", "hit_rate_points",
    "plot_all", "point_at", "render_markdown", "renderer", "requests_sent", "write",
]  # fmt: skip


def renderer(run: Run) -> tuple[Callable[[Run], str], Callable[[Run, Path], None]]:
    """The report.md renderer and the plotter of a run's kind: the gpu profile's (`bench.report.gpu`) for
    a `GpuRun`, else the CPU profiles'."""
    if isinstance(run, GpuRun):
        return gpu.render_markdown, gpu.plot_all
    return render_markdown, plot_all


def write(run: Run, out_dir: Path, plots: bool = True) -> None:
    """Writes results.json, the plots (with `plots`) and report.md into `out_dir`."""
    render, draw = renderer(run)
    out_dir.mkdir(parents=True, exist_ok=True)
    run.write(out_dir / "results.json")
    if plots:
        draw(run, out_dir)
    (out_dir / "report.md").write_text(render(run))
