"""`python -m bench reproduce --runs A,B`: whether two runs of the block experiment agree.

They reproduce when they are two runs, the second started after the first ended, of one code (one clean
commit, or two that differ only in bench/results/), with the same settings (the folder's name aside); both
kept blocks and claim the same k; and at every multiple of L their r_k intervals (block bootstrap) overlap,
as do their intervals of RelayGR's P99 over admit-all's. Each run's u, L and machine are shown beside them:
in the host's unit two hosts measure one experiment, so a change of host is recorded, not refused. Prints
the comparison as markdown (and writes it to `--out`); exits 1 unless every condition holds.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.headline.report import per_block, ratio, run_unit, table
from bench.headline.schema import Estimate, HeadlineResults
from bench.lib.context import changed_between
from services.common.config import listed, load, setting

RESULTS = "bench/results/"


@dataclasses.dataclass(frozen=True)
class ReproduceConfig:
    runs: str = setting(
        "bench/results/headline,bench/results/headline-2",
        "the two runs' folders, each with its results.json (the earlier first)",
        items=str,
        distinct=True,
    )
    out: str = setting("", "also write the comparison (markdown) to this file (empty: print only)")

    def validate(self) -> None:
        if len(listed(self, "runs")) != 2:
            raise ValueError("--runs takes exactly two folders")


def overlap(a: Estimate, b: Estimate) -> bool:
    """Whether two estimates' block-bootstrap intervals overlap (a missing high bound is an infinite one;
    a missing low one overlaps nothing)."""
    if a.low is None or b.low is None:
        return False
    return a.low <= (math.inf if b.high is None else b.high) and b.low <= (
        math.inf if a.high is None else a.high
    )


def _end(run: HeadlineResults) -> datetime.datetime:
    return datetime.datetime.fromisoformat(run.started_at) + datetime.timedelta(seconds=run.duration_s)


def same_code(first: HeadlineResults, second: HeadlineResults) -> bool:
    """One clean commit, or two whose difference lies wholly in bench/results/."""
    if first.commit.endswith("-dirty") or second.commit.endswith("-dirty"):
        return False
    if first.commit == second.commit:
        return True
    changed = changed_between(first.commit, second.commit)
    return changed is not None and all(path.startswith(RESULTS) for path in changed)


def settings_apart_from_name(run: HeadlineResults) -> dict[str, object]:
    return {k: v for k, v in dataclasses.asdict(run.settings).items() if k != "name"}


def unit_cell(run: HeadlineResults) -> str:
    """The run's u and L: the calibration's, or the median and range of its blocks' own."""
    if not per_block(run):
        return f"{run.calibration.u_ms:g}; {run.calibration.rate:g}"
    u, low, high = run_unit(run)
    rates = [block.rate for block in run.blocks if block.rate is not None]
    return f"{u:g} ({low:g}-{high:g}); {statistics.median(rates):g} ({min(rates):g}-{max(rates):g})"


def compare(names: Sequence[str], runs: Sequence[HeadlineResults]) -> tuple[bool, str]:
    """Whether the two runs reproduce, and the comparison as markdown."""
    first, second = runs
    checks: list[tuple[str, bool]] = [
        ("two runs, the second started after the first ended", _end(first) <= datetime.datetime.fromisoformat(
            second.started_at)),
        (f"one code ({first.commit}, {second.commit})", same_code(first, second)),
        ("the same settings", settings_apart_from_name(first) == settings_apart_from_name(second)),
        ("both kept blocks to analyse", first.kept is not None and second.kept is not None),
    ]  # fmt: skip
    rows: list[list[str]] = []
    if first.kept is not None and second.kept is not None:
        a, b = first.kept, second.kept
        checks.append((f"the same k claimed ({a.claimed}, {b.claimed})", a.claimed == b.claimed))
        theirs = {step.multiple: step.ratio for step in b.steps}
        estimates = [(f"r_{step.multiple:g}", step.ratio, theirs.get(step.multiple)) for step in a.steps]
        estimates += [(f"RelayGR / admit-all at {k} L", estimate, b.against_admit_all.get(k))
                      for k, estimate in a.against_admit_all.items()]  # fmt: skip
        for name, mine, other in estimates:
            agree = other is not None and overlap(mine, other)
            checks.append((f"{name}: the intervals overlap", agree))
            rows.append([name, ratio(mine), ratio(other), "yes" if agree else "no"])
        rows.append(["k claimed", str(a.claimed), str(b.claimed), "yes" if a.claimed == b.claimed else "no"])
    reproduced = all(ok for _, ok in checks)
    lines = [
        "# Do two headline runs agree?",
        "",
        *table(["", names[0], names[1], "agree"], [
            ["machine", first.machine.cpu_model, second.machine.cpu_model, ""],
            ["u, ms; L, req/s", unit_cell(first), unit_cell(second), ""],
            ["blocks kept", str(len(first.kept.blocks) if first.kept else 0),
             str(len(second.kept.blocks) if second.kept else 0), ""],
            *rows,
        ]),
        "",
        *(f"- [{'x' if ok else ' '}] {what}" for what, ok in checks),
        "",
        "**Reproduced.**" if reproduced else "**Not reproduced.**",
    ]  # fmt: skip
    return reproduced, "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    config = load(ReproduceConfig, argv, prog="python -m bench reproduce", description=__doc__)
    names = listed(config, "runs")
    runs = [HeadlineResults.read(Path(name) / "results.json") for name in names]
    reproduced, text = compare([Path(name).name for name in names], runs)
    sys.stdout.write(text)
    if config.out:
        Path(config.out).write_text(text)
    return 0 if reproduced else 1
