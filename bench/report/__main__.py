"""`python -m bench report --results-dir bench/results/<name> [--plots false]`: renders a run's report.md
(and its plots) again from its results.json, which is read and checked, not rewritten. A gpu profile's
results get the gpu report (`bench.report.gpu`), a headline run's (`python -m bench headline`) its own
(`bench.headline.report`)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from bench.lib.schema import Run
from bench.lib.schema_gpu import GpuRun
from bench.report import write
from services.common.config import load, setting


@dataclasses.dataclass(frozen=True)
class ReportConfig:
    results_dir: str = setting("", "a run's folder, with its results.json (required)")
    plots: bool = setting(True, "draw the plots too (false: report.md only)")

    def validate(self) -> None:
        if not self.results_dir:
            raise ValueError("--results-dir is required")


def main(argv: Sequence[str] | None = None) -> None:
    config = load(ReportConfig, argv, prog="python -m bench report", description=__doc__)
    results_dir = Path(config.results_dir)
    data = json.loads((results_dir / "results.json").read_text())
    if "calibration" in data:  # the block experiment's
        from bench.headline.report import draw, render_markdown
        from bench.headline.schema import HeadlineResults

        results = HeadlineResults.read(results_dir / "results.json")
        if config.plots:
            draw(results, results_dir)
        (results_dir / "report.md").write_text(render_markdown(results))
    else:
        kind = GpuRun if data.get("configuration", {}).get("profile") == "gpu" else Run
        write(kind.from_json(data), results_dir, config.plots, results=False)
    print(results_dir / "report.md")


if __name__ == "__main__":
    main()
