"""`python -m bench readme`: the README's Results, rendered from committed runs and written between its
markers in README.md (`BEGIN`, `END`); nothing else of the README changes. Two tables:

- the headline, from two runs of the block experiment (`--runs`, `python -m bench headline`; each cell
  gives both runs, separated by ` · `), and beside it the length sweep's ratio and mix 2 over the
  committed runs of `python -m bench run` (`--side-runs`), as the range they span;
- the cache handoff through a rollout (`--rollout`, `python -m bench rollout`), handoff off → on, each
  difference with its t interval over the seeds (the seed, not the request, is the unit that repeats).

tests/bench/test_results.py holds the README to the rendering of the runs it names.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.headline.compare import compare
from bench.headline.config import BASELINE, RELAY
from bench.headline.report import PLOT, per_block, ratio, run_unit
from bench.headline.schema import Analysis, HeadlineResults, Step
from bench.lib import envelope
from bench.lib.intervals import t_value
from bench.lib.schema import Run
from bench.report.figures import table
from services.common.config import listed, load, setting
from services.launcher.procs import REPO_ROOT

BEGIN = "<!-- results: rendered by `python -m bench readme` from the runs it names; do not edit -->"
END = "<!-- end of results -->"
RESULTS_DIR = REPO_ROOT / "bench" / "results"
CONFIDENCE = 0.95
NEXT_CALL = "a drained ranker's resident users whose next call hit"
RESTART_P99 = "Recommend P99 through the rolling restart (mean of the seeds' P99s)"


def headline_rows(runs: Sequence[HeadlineResults]) -> list[tuple[str, str]]:
    """(what, both runs' values) for each headline row."""
    kept = [run.kept for run in runs if run.kept is not None]
    if len(kept) < len(runs):
        raise ValueError("readme: a headline run kept no block")

    def both(cells: Iterable[str]) -> str:
        return " · ".join(cells)

    def step(analysis: Analysis, multiple: float) -> Step:
        return next(s for s in analysis.steps if s.multiple == multiple)

    rows = [
        ("RelayGR's ranking P99 at L, over the baseline's at L", both(ratio(step(a, 1).ratio) for a in kept)),
        ("**k claimed: RelayGR carries k times the baseline's load at no worse P99**",
         both(f"**{'none' if a.claimed is None else f'x{a.claimed:g}'}**" for a in kept)),
    ]  # fmt: skip
    for multiple in (s.multiple for s in kept[0].steps if s.multiple != 1.0):
        cells = []
        for analysis in kept:
            mine = step(analysis, multiple)
            mark = "claimed" if mine.passed else ("fails" if mine.tested else "not tested")
            cells.append(f"{ratio(mine.ratio)} ({mark})")
        rows.append(
            (f"r_{multiple:g}: RelayGR's P99 at {multiple:g} L over the baseline's at L", both(cells))
        )
    base = [next(arm for arm in a.arms if arm.mode == BASELINE) for a in kept]
    rows.append(("the baseline's P99 at L (L = 0.7 / u)",
                 both(f"{b.p99_ms:.0f} ms = {b.p99_u:.2f} u at {b.rate:g} req/s" for b in base)))  # fmt: skip
    rows.append(("RelayGR's P99 at 1, 2, … L, ms (u)", both(
        ", ".join(f"{arm.p99_ms:.0f} ({arm.p99_u:.2f})" for arm in a.arms if arm.mode == RELAY) for a in kept
    )))  # fmt: skip
    rows += [(f"RelayGR's P99 over admit-all's at {m} L", both(ratio(a.against_admit_all[m]) for a in kept))
             for m in kept[0].against_admit_all]  # fmt: skip
    return rows


def side_rows(side: Sequence[tuple[str, Run]]) -> list[tuple[str, str]]:
    """The length sweep's ratio and mix 2's, as the range over the committed runs of `python -m bench run`."""
    if not side:
        return []
    names = ", ".join(f"`{name}`" for name, _ in side)
    lengths = [run.length_ratio for _, run in side if run.length_ratio is not None]
    rate = side[0][1].measured.length_sweep.rate
    rows = []
    if lengths:
        what = f"the longest long-term length meeting the SLO at {rate:g} req/s, RelayGR over the baseline"
        rows.append((what, f"x{min(lengths):g} to x{max(lengths):g} over {len(lengths)} runs ({names})"))
    per_u = []
    met = 0
    for _, run in side:
        sweeps = list(run.measured.throughput_sweeps.values())
        if len(sweeps) < 2:
            continue
        mix2 = sweeps[1]
        met += mix2.baseline.best is not None
        unit = next(
            (p.full_ms for p in run.measured.floor if p.prefix_length == run.configuration.mix_max), None
        )
        if mix2.relay.best is not None and unit:
            per_u.append(mix2.relay.best * unit / 1000)
    if per_u:
        rows.append(("mix 2 (cap 4096 events): RelayGR's highest load meeting the SLO, requests per u",
                     f"{min(per_u):.2f} to {max(per_u):.2f}; the baseline met the SLO at some load in "
                     f"{met} of {len(per_u)} runs"))  # fmt: skip
    return rows


def _t(differences: Sequence[float]) -> tuple[float, float, float]:
    """The mean of per-seed differences and its t interval over the seeds."""
    mean = statistics.fmean(differences)
    if len(differences) < 2:
        return mean, math.nan, math.nan
    half = (
        t_value(CONFIDENCE, len(differences) - 1)
        * statistics.stdev(differences)
        / math.sqrt(len(differences))
    )
    return mean, mean - half, mean + half


def rollout_rows(rollout: dict[str, Any]) -> list[tuple[str, str]]:
    """Handoff off → on from a rollout run's results.json, each difference with its t interval over seeds."""
    figures = rollout["figures"]
    modes = {m["mode"]: m for m in figures["modes"]}
    off, on = modes["off"], modes["on"]
    per_seed = figures["comparison"]["per_seed"]
    hit, hit_low, hit_high = _t([s["on_drained_hit"] - s["off_drained_hit"] for s in per_seed])
    p99, p99_low, p99_high = _t([s["on_p99_ms"] - s["off_p99_ms"] for s in per_seed])
    shown = "no difference shown" if p99_low <= 0 <= p99_high else "a difference"

    def share(figure: dict[str, Any]) -> str:
        return f"{figure['share']['value']:.1%}"

    off_p99 = statistics.fmean(s["off_p99_ms"] for s in per_seed)
    on_p99 = statistics.fmean(s["on_p99_ms"] for s in per_seed)
    return [
        (NEXT_CALL,
         f"{share(off['drained'])} → {share(on['drained'])}: {hit * 100:+.1f} pp [{hit_low * 100:+.1f}, "
         f"{hit_high * 100:+.1f}]"),
        ("failed calls", f"{off['failed']} → {on['failed']}"),
        (RESTART_P99,
         f"{off_p99:.1f} → {on_p99:.1f} ms: {p99:+.1f} ms [{p99_low:+.1f}, {p99_high:+.1f}], {shown}"),
        ("the new member's returning users whose first call hit after a scale-out (steady state: 100 %)",
         f"{share(off['scale_out_first'])} → {share(on['scale_out_first'])}"),
        ("device seconds recomputing prefixes through the restart, a run",
         f"{off['recompute_s']['rollout']:g} → {on['recompute_s']['rollout']:g} s"),
    ]  # fmt: skip


def render(runs: Sequence[tuple[str, HeadlineResults]], side: Sequence[tuple[str, Run]],
           rollout: tuple[str, dict[str, Any]] | None,
           new_users: tuple[str, dict[str, Any]] | None = None) -> str:  # fmt: skip
    """The Results for the headline `runs`, the `side` runs, the `rollout` run and the rollout run with new
    users among its calls (each named by its folder under bench/results/)."""
    if len(runs) != 2:
        raise ValueError("readme: the headline takes two runs")
    (first_name, first), (second_name, second) = runs
    links = " · ".join(f"[`{name}`](bench/results/{name}/report.md)" for name, _ in runs)
    c, host = first.settings, first.machine
    # A run that timed u before every block loads each block at 0.7 / its own u: its u is their median.
    per_block_note = ", the median of each run's blocks' own" if per_block(first) else ""
    reproduced, _ = compare([first_name, second_name], [first, second])
    commits = sorted({run.commit for _, run in runs})
    lines = [
        BEGIN, "",
        table(["", links], [*headline_rows([first, second]), *side_rows(side)]),
        "",
        f"Two runs of `python -m bench headline` at commit{'s' if len(commits) > 1 else ''} "
        f"{', '.join(commits)} on a {host.cores}-core {host.cpu_model} "
        f"({host.cpu_capability or 'vector width not recorded'}; u = {run_unit(first)[0]:g} and "
        f"{run_unit(second)[0]:g} ms{per_block_note}), {len(first.kept.blocks if first.kept else [])} and "
        f"{len(second.kept.blocks if second.kept else [])} blocks kept, each block every arm once on one "
        f"arrival seed in a Williams order; `{c.model_preset}` with {c.rankers} rankers, mix 1 (median "
        f"{c.mix_median}, cap {c.mix_max} events), SLO {c.slo_u:g} u. Intervals are 95 % block bootstraps "
        "(whole blocks resampled); a multiple is claimed while the one-sided upper bound of r_k is at most 1 "
        f"and RelayGR meets the SLO. `make bench-reproduce` runs it twice and compares: "
        + ("**the two runs reproduce**" if reproduced else "**these two runs do not reproduce yet**")
        + f" ([the comparison](bench/results/{second_name}/reproduce.md) says which conditions hold); "
        + "the plot: "
        f"[P99 against the load multiple](bench/results/{first_name}/{PLOT}); how to read it: "
        "[docs/benchmark.md](docs/benchmark.md#the-headline). The length and mix-2 rows come from the "
        "earlier `python -m bench run` runs they name, one run each, with absolute bounds.",
    ]  # fmt: skip
    if rollout is not None:
        name, data = rollout
        seeds = len(data["figures"]["comparison"]["per_seed"])
        lines += [
            "",
            f"Caches through a rolling restart of every ranker, a scale-out and a scale-in ([`{name}`]"
            f"(bench/results/{name}/summary.md), `python -m bench rollout`: {seeds} seeds, handoff off → on "
            "with the same arrivals; intervals are t intervals over the seeds):",
            "",
            table(["", "handoff off → on"], rollout_rows(data)),
        ]  # fmt: skip
    if new_users is not None:
        name, data = new_users
        rows = dict(rollout_rows(data))
        lines += [
            "",
            f"With 10 % of the calls from new users instead ([`{name}`](bench/results/{name}/summary.md)), "
            f"the next-call hit share goes {rows[NEXT_CALL].split(':')[0]}, and the Recommend P99 through "
            f"the restart {rows[RESTART_P99]}.",
        ]  # fmt: skip
    return "\n".join([*lines, "", END])


def write(readme: Path, text: str) -> None:
    """Replaces the README's rendered Results (between `BEGIN` and `END`) with `text`."""
    current = readme.read_text()
    if BEGIN not in current or END not in current:
        raise ValueError(f"readme: {readme} has no rendered Results (the markers {BEGIN!r} … {END!r})")
    before, rest = current.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    readme.write_text(before + text + after)


@dataclasses.dataclass(frozen=True)
class ReadmeConfig:
    runs: str = setting(
        "headline,headline-2", "the two headline runs the table quotes: folders under bench/results/",
        items=str, distinct=True,
    )  # fmt: skip
    side_runs: str = setting(
        "full,full-5e3657a,full-b893f0b,full-febe785",
        "the runs of `python -m bench run` whose length sweep and mix 2 the table quotes beside it",
        items=str, distinct=True, may_be_empty=True,
    )  # fmt: skip
    rollout: str = setting("rollout-population", "the rollout run the second table quotes (empty: none)")
    rollout_new_users: str = setting(
        "rollout", "the rollout run with new users among its calls quoted beneath it (empty: none)"
    )
    readme: str = setting(
        "README.md", "the file whose rendered Results are replaced (from the repository root)"
    )


def render_from(config: ReadmeConfig) -> str:
    """The Results for the runs `config` names (folders under bench/results/)."""

    def path(name: str) -> Path:
        found = RESULTS_DIR / name / "results.json"
        if not found.exists():
            raise SystemExit(f"python -m bench readme: no results.json in {found.parent}")
        return found

    def rollout(name: str) -> tuple[str, dict[str, Any]] | None:
        return (name, envelope.read(path(name), "rollout")) if name else None

    runs = [(name, HeadlineResults.read(path(name))) for name in listed(config, "runs")]
    side = [(name, Run.load(path(name))) for name in listed(config, "side_runs")]
    return render(runs, side, rollout(config.rollout), rollout(config.rollout_new_users))


def main(argv: Sequence[str] | None = None) -> None:
    config = load(ReadmeConfig, argv, prog="python -m bench readme", description=__doc__)
    target = REPO_ROOT / config.readme
    write(target, render_from(config))
    print(f"{target}: Results rendered")
