"""`python -m bench report --results-dir bench/results/<name> [--plots false]`: renders a run's report.md
(and its plots) again from its results.json, which is read and checked, not rewritten. A gpu profile's
results get the gpu report (`bench.report.gpu`), a headline run's (`python -m bench headline`) its own
(`bench.headline.report`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from bench.lib import envelope
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
    path = results_dir / "results.json"
    command = envelope.command_of(path)
    if command == "headline":  # the block experiment's
        from bench.headline.report import draw, render_markdown
        from bench.headline.schema import HeadlineResults

        results = HeadlineResults.read(path)
        if config.plots:
            draw(results, results_dir)
        (results_dir / "report.md").write_text(render_markdown(results))
    elif command == "run":
        kind = GpuRun if envelope.header(path)["settings"].get("profile") == "gpu" else Run
        write(kind.load(path), results_dir, config.plots, results=False)
    else:
        raise SystemExit(f"python -m bench report: {path} holds no run or headline results ({command})")
    print(results_dir / "report.md")


if __name__ == "__main__":
    main()
