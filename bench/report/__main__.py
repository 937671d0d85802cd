"""`python -m bench report --results-dir bench/results/<name> [--plots false]`: renders a folder's report
again from its results.json (mlperf's result.json), which is read and checked, not rewritten, by the
renderer of the command that wrote it: run's report.md and plots (the gpu profile's own), the headline's,
ab's, tracing's and the device path's report.md, mlperf's, serving's and shared-device's summary.md.

rollout's report has no renderer: its summary.md's first line gives the run's wall time and load averages,
which its results.json does not hold."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.lib import codec, envelope
from bench.lib.schema_gpu import load_run
from bench.report import write
from services.common.config import load, setting


@dataclasses.dataclass(frozen=True)
class ReportConfig:
    results_dir: str = setting("", "a results folder, with its results.json or result.json (required)")
    plots: bool = setting(True, "draw the plots too (false: report.md only)")

    def validate(self) -> None:
        if not self.results_dir:
            raise ValueError("--results-dir is required")


def run(folder: Path, plots: bool) -> list[Path]:
    write(load_run(folder / "results.json"), folder, plots, results=False)
    return [folder / "report.md"]


def headline(folder: Path, plots: bool) -> list[Path]:
    from bench.headline.report import draw, render_markdown
    from bench.headline.schema import HeadlineResults

    results = HeadlineResults.read(folder / "results.json")
    if plots:
        draw(results, folder)
    (folder / "report.md").write_text(render_markdown(results))
    return [folder / "report.md"]


def ab(folder: Path, plots: bool) -> list[Path]:
    from bench.ab.report import render_markdown
    from bench.ab.schema import AbResults

    (folder / "report.md").write_text(render_markdown(AbResults.load(folder / "results.json")))
    return [folder / "report.md"]


def mlperf(folder: Path, plots: bool) -> list[Path]:
    """The search's summary.md and each of its runs'."""
    from bench.mlperf import report
    from bench.mlperf.results import SearchResult, read_json

    search = read_json(SearchResult, folder / "result.json")
    (folder / "summary.md").write_text(report.search_markdown(search))
    written = [folder / "summary.md"]
    for mode in search.modes.values():
        for one in mode.runs:
            summary = folder / mode.mode / f"q{one.settings.target_qps:g}" / "summary.md"
            summary.write_text(report.run_markdown(one))
            written.append(summary)
    return written


def mlperf_run(folder: Path, plots: bool) -> list[Path]:
    """One LoadGen run's summary.md (a folder `<mode>/q<qps>/` of a search)."""
    from bench.mlperf import report
    from bench.mlperf.results import RunResult, read_json

    (folder / "summary.md").write_text(report.run_markdown(read_json(RunResult, folder / "result.json")))
    return [folder / "summary.md"]


def tracing(folder: Path, plots: bool) -> list[Path]:
    from bench.tracing.report import TracingRun, markdown

    run_ = codec.from_json(TracingRun, envelope.read(folder / "results.json", "tracing"))
    (folder / "report.md").write_text(markdown(run_))
    return [folder / "report.md"]


def serving(folder: Path, plots: bool) -> list[Path]:
    from bench.micro.serving.summary import summary

    (folder / "summary.md").write_text(summary(envelope.read(folder / "results.json", "serving")))
    return [folder / "summary.md"]


def shared_device(folder: Path, plots: bool) -> list[Path]:
    from bench.micro import shared_device as command

    record = envelope.read(folder / "results.json", "shared-device")
    config = command.SharedDeviceConfig(**record["configuration"])
    points = [command.Point(**point) for point in record["points"]]
    (folder / "summary.md").write_text(command.summary(config, points))
    return [folder / "summary.md"]


def accelerator(folder: Path, plots: bool) -> list[Path]:
    from bench.micro.accelerator import device

    (folder / "report.md").write_text(device.report(envelope.read(folder / "results.json", "accelerator")))
    return [folder / "report.md"]


RENDERERS: dict[str, Callable[[Path, bool], list[Path]]] = {
    "run": run, "headline": headline, "ab": ab, "mlperf": mlperf, "mlperf-run": mlperf_run,
    "tracing": tracing, "serving": serving, "shared-device": shared_device, "accelerator": accelerator,
}  # fmt: skip


def results_file(folder: Path) -> Path:
    """The folder's results: results.json, or mlperf's result.json."""
    found = folder / "results.json"
    return found if found.exists() else folder / "result.json"


def render(folder: Path, plots: bool) -> list[Path]:
    """The folder's report(s) rendered again by its command's renderer; a ValueError saying why not."""
    path = results_file(folder)
    if not path.exists():
        raise ValueError(f"{folder}: no results.json (or result.json)")
    command = envelope.command_of(path)
    if command is None:
        raise ValueError(f"{path}: not in a command's envelope (recorded by hand or by an older tool)")
    if command not in RENDERERS:
        raise ValueError(f"{path}: {command}'s report is written by its run only (python -m bench {command})")
    try:
        return RENDERERS[command](folder, plots)
    except KeyError as exc:  # a record older than what today's renderer reads
        lacks = f"today's {command} renderer reads {exc}, which this older record lacks"
        raise ValueError(f"{path}: {lacks}") from None


def main(argv: Sequence[str] | None = None) -> None:
    config = load(ReportConfig, argv, prog="python -m bench report", description=__doc__)
    try:
        written = render(Path(config.results_dir), config.plots)
    except ValueError as exc:
        raise SystemExit(f"python -m bench report: {exc}") from None
    print("\n".join(str(path) for path in written))


if __name__ == "__main__":
    main()
