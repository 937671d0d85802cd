"""`python -m bench readme --runs headline,headline-2`: the README's Results table, rendered from committed
headline runs and written between its markers in README.md; nothing else of the README changes. Each run
is a folder under bench/results/ with its results.json, and is refused unless its checks let it be quoted
(`bench.lib.checks.quotable`). The table has one row
per headline ratio (the length sweep, each mix, the abandonment share, RelayGR against admit-all), one
column per run, each ratio with the interval its two brackets give, and the host's unit u of each run.

The README holds the rendering between two markers (`BEGIN`, `END`); `write` replaces what lies between
them, and tests/bench/test_results.py holds the README to the rendering of the runs it names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from bench.lib import checks
from bench.lib.schema import Run, Sweep, ratio_interval
from bench.report.capacity import CAPACITY_PLOT
from services.common.config import listed, load, setting
from services.launcher.procs import REPO_ROOT

BEGIN = "<!-- results: rendered by `python -m bench readme` from the runs it names; do not edit -->"
END = "<!-- end of results -->"
ABANDONED = "0.3"  # the abandonment share the README quotes
BAND_WIDTH = 2.0  # an interval whose ends are further apart than this factor is called a band


def ratio_with_interval(value: float | None, bounds: Sequence[float | None]) -> str:
    """`x2.78 [x2.5, x3.2]`; a band when the interval is wide; `>` bounds where a sweep ran off its grid."""
    low, high = bounds
    if value is None:
        return f"≥ x{low:g} (no baseline answer)" if low else "no answer"
    shown = f"x{value:g} [x{low:g}, {'unbounded' if high is None else f'x{high:g}'}]"
    wide = high is None or not low or high / low > BAND_WIDTH
    return f"{shown}, a band" if wide else shown


def pair_cell(relay: Sweep, other: Sweep) -> str:
    """RelayGR's best over `other`'s, with the interval of their brackets (a lower bound where `other`
    met the SLO at no load it measured; said so where the run recorded no brackets)."""
    if relay.best is not None and other.best is None and other.points:
        lowest = min(point.rate for point in other.points)
        return f"> x{relay.best / lowest:.3g} (the other met the SLO at no load down to {lowest:g})"
    value = None if relay.best is None or not other.best else round(relay.best / other.best, 3)
    if value is not None and relay.first_failure is None and other.first_failure is None:
        return f"x{value:g} (the run recorded no brackets: a single edge each, no interval)"
    return ratio_with_interval(value, ratio_interval(relay, other))


def bests(baseline: Sweep, relay: Sweep) -> str:
    def best(sweep: Sweep) -> str:
        return "none" if sweep.best is None else f"{sweep.best:g}"

    return f"{best(baseline)} → {best(relay)}"


def rows(run: Run) -> list[tuple[str, str]]:
    """(what, `bests → ratio [interval]`) for each headline ratio of one run."""
    measured = run.measured
    length = measured.length_sweep
    out = [(f"longest long-term length at {length.rate:g} req/s, events", length.baseline, length.relay)]
    for number, (label, mix) in enumerate(measured.throughput_sweeps.items(), start=1):
        universe = measured.mix_universes[number - 1]
        out.append((f"highest load, mix {number} (`{label}`: cap {universe.max_long_term}), req/s",
                    mix.baseline, mix.relay))  # fmt: skip
    abandoned = measured.abandonment.fractions.get(ABANDONED)
    if abandoned is not None and abandoned.sweeps is not None:
        share = f"{float(ABANDONED):.0%}"
        out.append((f"highest load, mix 1 with {share} of requests abandoned after their Admit, req/s",
                    abandoned.sweeps.baseline, abandoned.sweeps.relay))  # fmt: skip
    cells = [(what, f"{bests(base, relay)}: {pair_cell(relay, base)}") for what, base, relay in out]
    admit_all = measured.ablations.sweeps.get("admit-all")
    if admit_all is not None:
        _, mix = run.first_mix
        relay = measured.ablations.relay_for("admit-all", mix.relay)  # measured beside it, where it was
        cells.append(("RelayGR against admitting every request (admit-all), mix 1, req/s",
                      f"{bests(admit_all, relay)}: {pair_cell(relay, admit_all)}"))  # fmt: skip
    unit = measured.host_unit
    described = absolute_bounds(run) if unit is None else f"u = {unit.u_ms:g} ms: {unit.describe()}"
    if unit is not None and measured.phases:
        units = [u for phase in measured.phases for u in (phase.u_ms, phase.u_end_ms)]
        described += f"; each experiment judged in u as timed at its start ({min(units):g}-{max(units):g} ms)"
    cells.append(("the host's unit, the SLO and the relay window", described))
    return cells


def absolute_bounds(run: Run) -> str:
    """A run with absolute bounds: its SLO, and what it is in the unit its own floor gives (the full pass
    at the first mix's cap) where it timed that length."""
    c = run.configuration
    unit = next((p.full_ms for p in run.measured.floor if p.prefix_length == c.mix_max), None)
    in_unit = f" ({c.slo_ms / unit:.2f} u, u = {unit:g} ms by its floor)" if unit else ""
    return f"absolute: SLO {c.slo_ms:g} ms{in_unit}, relay window {c.relay_window_ms:g} ms"


def render(runs: Sequence[tuple[str, Run]]) -> str:
    """The Results table for `runs` (each with its folder under bench/results/) and the paragraph beneath."""
    if not runs:
        raise ValueError("readme: no run to render")
    table_rows = [run_rows for _, run in runs for run_rows in [rows(run)]]
    header = ["", *[f"[`{name}`](bench/results/{name}/report.md)" for name, _ in runs]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for index, (what, _) in enumerate(table_rows[0]):
        lines.append("| " + " | ".join([what, *[run_rows[index][1] for run_rows in table_rows]]) + " |")
    first_name, first = runs[0]
    commits = sorted({run.versions.git_commit for _, run in runs})
    minutes = ", ".join(f"{run.duration_s / 60:.0f}" for _, run in runs)
    c, machine = first.configuration, first.machine
    profiles = ", ".join(sorted({run.configuration.profile for _, run in runs}))
    in_unit = first.measured.host_unit is not None
    paragraph = (
        "Baseline → RelayGR: each mode's highest value whose ranking P99 meets the SLO, and their ratio "
        f"with the interval its brackets give; {len(runs)} run(s) of the {profiles} profile, "
        f"`{c.model_preset}` with {c.rankers} rankers on a {machine.cores}-core {machine.cpu_model} "
        f"(commit {', '.join(commits)}; {minutes} minutes). On a CPU only the ratios mean anything"
        + (
            "; times are in the host's own unit u"
            if in_unit
            else f"; this run's SLO was absolute ({c.slo_ms:g} ms)"
        )
        + ". `make bench-reproduce` measures the headline twice in the host's unit and compares the runs"
        + (
            f"; capacity against the SLO: [plot](bench/results/{first_name}/{CAPACITY_PLOT})"
            if in_unit
            else ""
        )
        + "; method and caveats: [docs/benchmark.md](docs/benchmark.md)."
    )
    return "\n".join([BEGIN, "", *lines, "", paragraph, "", END])


def write(readme: Path, runs: Sequence[tuple[str, Run]]) -> None:
    """Replaces the README's rendered Results (between `BEGIN` and `END`) with `render(runs)`."""
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"readme: {readme} has no rendered Results (the markers {BEGIN!r} … {END!r})")
    before, rest = text.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    readme.write_text(before + render(runs) + after)


RESULTS_DIR = REPO_ROOT / "bench" / "results"


@dataclasses.dataclass(frozen=True)
class ReadmeConfig:
    runs: str = setting(
        "headline,headline-2",
        "the runs the table quotes: folders under bench/results/",
        items=str,
        distinct=True,
    )
    readme: str = setting(
        "README.md", "the file whose rendered Results are replaced (from the repository root)"
    )


def main(argv: Sequence[str] | None = None) -> None:
    config = load(ReadmeConfig, argv, prog="python -m bench readme", description=__doc__)
    runs = []
    for name in listed(config, "runs"):
        path = RESULTS_DIR / name / "results.json"
        if not path.exists():
            raise SystemExit(f"python -m bench readme: --runs: no results.json in {path.parent}")
        runs.append((name, checks.quotable(Run.load(path))))
    target = REPO_ROOT / config.readme
    write(target, runs)
    print(f"{target}: Results rendered from {', '.join(name for name, _ in runs)}")
