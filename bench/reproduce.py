"""`python -m bench reproduce --runs A,B`: whether two runs of the headline experiments agree.

Two runs of `make bench-headline` at one commit, on an otherwise idle machine, reproduce when, on every
headline ratio (the length sweep's, each mix's and each non-zero abandoned share's):

- both runs measured it;
- their bracket-based intervals overlap (`bench.lib.schema.ratio_interval`: the ratio of the edges as the
  sequential verdicts placed them);
- their point estimates agree within `--agreement` (10 %): the larger is at most 1.1x the smaller.

The comparison holds only for two distinct runs of the headline profile, one after the other (the second
started after the first ended), each with every headline ratio the headline profile measures (the length
sweep's, both mixes', each non-zero abandoned share of its default `--abandon-fractions`). Beside that,
each run is held to the paper's targets on the first mix (`--target-ratio`, x3 over the baseline: the
paper reports x3.6; and `--target-of-admit-all`, 0.95 of admit-all's highest load: the trigger's
selectivity must not cost throughput) and to its checks at the default limits, whatever limits its own
flags set (a run without checks, or flagged, is not quotable: `bench.lib.checks.quotable`); both runs are held
to one code (one commit, or two that differ only in bench/results/: the first run may be committed before
the second is made, in another session) and, unless both ran in their host's unit u (whose point is that
any speed measures the same experiment: the change is then recorded only), to one machine speed (their
floors within the default `--floor-drift-limit`). Prints the comparison as markdown (and writes it to
`--out`); exits 1 unless every one of these holds, so that `make bench-reproduce` fails where it should.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.lib import context
from bench.lib.checks import FlaggedRun, default_limit, floor_drift, lowest, quotable
from bench.lib.config import load_config
from bench.lib.schema import Run, Sweep, ratio, ratio_interval
from services.common.config import listed, load, setting

Interval = list[float | None]  # [low, high]; high None: unbounded
RESULTS = "bench/results/"


@dataclasses.dataclass(frozen=True)
class ReproduceConfig:
    runs: str = setting(
        "bench/results/headline,bench/results/headline-2",
        "the two runs' folders, each with its results.json (the earlier first)",
        items=str,
        distinct=True,
    )
    agreement: float = setting(
        0.10, "the most two runs' point estimates of a ratio may differ: larger / smaller - 1", above=0
    )
    target_ratio: float = setting(3.0, "the least RelayGR / baseline on the first mix, in each run", above=0)
    target_of_admit_all: float = setting(
        0.95, "the least RelayGR / admit-all highest load on the first mix, in each run", above=0
    )
    out: str = setting("", "also write the comparison (markdown) to this file (empty: print only)")

    def validate(self) -> None:
        if len(listed(self, "runs")) != 2:
            raise ValueError("--runs takes exactly two folders")


@dataclasses.dataclass(frozen=True)
class Ratio:
    """One headline ratio of one run: its point estimate and its bracket-based interval (None: the run
    did not measure it, or predates intervals)."""

    value: float | None
    interval: Interval | None


@dataclasses.dataclass(frozen=True)
class Agreement:
    """One headline ratio in both runs, and whether they agree."""

    name: str
    first: Ratio
    second: Ratio
    overlap: bool | None  # None: an interval is missing
    spread: float | None  # larger / smaller - 1 (None: a value is missing)
    agrees: bool
    # Both runs' baselines met the SLO at no value, so neither has a ratio: their lower bounds (the
    # intervals' lows, RelayGR's best over the baseline's first failure) were compared instead.
    of_bounds: bool = False


PROFILE = "headline"


def expected_ratios() -> list[str]:
    """The headline ratios a run of the headline profile measures with its default settings, by name
    (each mix's without its universe: `mix 1`, `mix 2`)."""
    config = load_config(["--profile", PROFILE], {})
    abandoned = [f"{fraction:.0%} abandoned" for fraction in config.abandon_grid() if fraction > 0]
    return ["length", "mix 1", "mix 2", *abandoned]


def missing(run: Run) -> list[str]:
    """The expected headline ratios (`expected_ratios`) that `run` did not measure (no value and no
    interval)."""
    measured = {
        name.split(" (")[0]
        for name, found in headline(run).items()
        if found.value is not None or found.interval is not None
    }
    return [name for name in expected_ratios() if name not in measured]


def started(run: Run) -> datetime.datetime:
    return datetime.datetime.fromisoformat(run.started_at)


def headline(run: Run) -> dict[str, Ratio]:
    """A run's headline ratios by name: the length sweep's, each mix's (mix 1, mix 2, …) and each
    non-zero abandoned share's."""
    ratios = {"length": Ratio(run.length_ratio, run.length_ratio_interval)}
    for number, mix in enumerate(run.measured.throughput_sweeps.values(), start=1):
        ratios[f"mix {number} ({mix.universe})"] = Ratio(mix.ratio, mix.ratio_interval)
    for fraction in run.measured.abandonment.fractions.values():
        if fraction.fraction > 0:
            ratios[f"{fraction.fraction:.0%} abandoned"] = Ratio(fraction.ratio, fraction.ratio_interval)
    return ratios


def overlaps(first: Interval, second: Interval) -> bool:
    """Whether two intervals share a point (an unbounded high end reaches every value above its low)."""
    low = max(first[0] or 0.0, second[0] or 0.0)
    highs = [high for high in (first[1], second[1]) if high is not None]
    return not highs or low <= min(highs)


def agreement(name: str, first: Ratio, second: Ratio, limit: float) -> Agreement:
    """`name`'s ratio in both runs, judged: both measured, intervals overlapping, values within `limit`."""
    overlap = (
        None
        if first.interval is None or second.interval is None
        else overlaps(first.interval, second.interval)
    )
    values = (first.value, second.value)
    of_bounds = values == (None, None) and overlap is not None
    if of_bounds:
        values = (first.interval[0], second.interval[0])
    spread = None
    if all(values):
        spread = round(max(values) / min(values) - 1, 4)
    agrees = bool(overlap) and spread is not None and spread <= limit
    return Agreement(name, first, second, overlap, spread, agrees, of_bounds)


@dataclasses.dataclass(frozen=True)
class Target:
    """One run's first-mix target: RelayGR's highest load over the other mode's, against its least."""

    name: str
    ratio: Ratio
    least: float

    @property
    def met(self) -> bool:
        return self.ratio.value is not None and self.ratio.value >= self.least


def targets(run: Run, config: ReproduceConfig) -> list[Target]:
    """The first mix's targets in `run`: RelayGR over the baseline, and over admit-all (none: not
    measured)."""
    mix = next(iter(run.measured.throughput_sweeps.values()))
    admit_all: Sweep | None = run.measured.ablations.sweeps.get("admit-all")
    of_admit_all = Ratio(None, None)
    if admit_all is not None:
        relay = run.measured.ablations.relay_for("admit-all", mix.relay)  # measured beside it, where it was
        of_admit_all = Ratio(ratio(relay.best, admit_all.best), ratio_interval(relay, admit_all))
    return [
        Target("RelayGR / baseline, mix 1", Ratio(mix.ratio, mix.ratio_interval), config.target_ratio),
        Target("RelayGR / admit-all, mix 1", of_admit_all, config.target_of_admit_all),
    ]


def shown(ratio: Ratio) -> str:
    """A ratio and its interval as the tables write them (`x2.5 [2.2, 2.9]`; none: no ratio)."""
    text = "none" if ratio.value is None else f"x{ratio.value:g}"
    if ratio.interval is None:
        return f"{text}, no interval"
    low, high = ratio.interval
    return f"{text} [{low or 0:g}, {'unbounded' if high is None else f'{high:g}'}]"


def yes(flag: bool | None) -> str:
    return "n/a" if flag is None else "yes" if flag else "**no**"


@dataclasses.dataclass(frozen=True)
class Comparison:
    names: tuple[str, str]
    runs: tuple[Run, Run]
    agreements: list[Agreement]
    targets: tuple[list[Target], list[Target]]
    floor_limit: float  # the most the two runs' floors may differ (the default --floor-drift-limit)

    # What the two runs' commits differ in (empty: one commit; None: a commit this checkout lacks).
    changed: list[str] | None

    @property
    def one_code(self) -> bool:
        """Both runs measured one code: one commit, or two that differ only in bench/results/ (the first
        run's results, committed before the second run), neither with uncommitted changes."""
        dirty = any(run.versions.git_commit.endswith("-dirty") for run in self.runs)
        return (
            not dirty and self.changed is not None and all(path.startswith(RESULTS) for path in self.changed)
        )

    @property
    def one_after_the_other(self) -> bool:
        """Two distinct runs: the second started after the first ended."""
        first, second = self.runs
        ended = started(first) + datetime.timedelta(seconds=first.duration_s)
        return started(second) >= ended

    @property
    def headline_profile(self) -> bool:
        return all(run.configuration.profile == PROFILE for run in self.runs)

    @property
    def complete(self) -> bool:
        """Both runs measured every headline ratio of the headline profile."""
        return not any(missing(run) for run in self.runs)

    @property
    def quotable(self) -> bool:
        """Neither run lacks its checks or is flagged, at its own limits or the default ones."""
        try:
            for run in self.runs:
                quotable(run)
        except FlaggedRun:
            return False
        return True

    @property
    def reproduced(self) -> bool:
        return bool(self.agreements) and all(entry.agrees for entry in self.agreements)

    @property
    def targets_met(self) -> bool:
        return all(target.met for found in self.targets for target in found)

    @property
    def floor_moved(self) -> float | None:
        """The second run's floor against the first's (each the lower of its start and end floors), as
        `bench.lib.checks` compares a run with a committed one; None where they share no length."""
        first, second = (lowest(run.measured.floor, run.measured.floor_end) for run in self.runs)
        return floor_drift(second, first)

    @property
    def in_host_unit(self) -> bool:
        """Both runs' bounds were in their host's unit u: each measured the same experiment at its speed."""
        return all(run.checks is not None and run.checks.in_host_unit for run in self.runs)

    @property
    def same_speed(self) -> bool:
        """The two floors within the limit; not required of two runs in the host's unit (recorded only)."""
        held = self.floor_moved is not None and abs(self.floor_moved) <= self.floor_limit
        return held or self.in_host_unit

    @property
    def holds(self) -> bool:
        return (
            self.one_after_the_other
            and self.headline_profile
            and self.complete
            and self.one_code
            and self.same_speed
            and self.quotable
            and self.reproduced
            and self.targets_met
        )


def compare(
    names: tuple[str, str],
    runs: tuple[Run, Run],
    config: ReproduceConfig,
    changed_between: Callable[[str, str], list[str] | None] = context.changed_between,
) -> Comparison:
    """The two runs' headline ratios side by side, each run's targets, and what their commits differ in
    (`changed_between(first, second)`, asked only when they differ)."""
    first, second = (headline(run) for run in runs)
    agreements = [
        agreement(
            name, first.get(name, Ratio(None, None)), second.get(name, Ratio(None, None)), config.agreement
        )
        for name in dict.fromkeys([*first, *second])
    ]
    both = (targets(runs[0], config), targets(runs[1], config))
    first, second = (run.versions.git_commit.removesuffix("-dirty") for run in runs)
    changed = [] if first == second else changed_between(first, second)
    return Comparison(names, runs, agreements, both, default_limit("floor_drift_limit"), changed)


def render(comparison: Comparison, config: ReproduceConfig) -> str:
    """The comparison as markdown: the runs, the ratios' agreement, the targets and the verdict."""
    header = "| run | commit | profile | seeds a verdict | minutes | checks |\n|---|---|---|---|---|---|"
    lines = ["# Do two headline runs agree?", "", header]
    for name, run in zip(comparison.names, comparison.runs, strict=True):
        checks = "not recorded" if run.checks is None else (
            "FLAGGED: " + "; ".join(run.checks.flags) if run.checks.flags else "not flagged"
        )  # fmt: skip
        lines.append(
            f"| {name} | {run.versions.git_commit} | {run.configuration.profile} | {run.profile.seed_cap} | "
            f"{run.duration_s / 60:.0f} | {checks} |"
        )
    first, second = comparison.names
    agrees = f"agrees (at most {config.agreement:.0%})"
    lines += ["", f"| ratio | {first} | {second} | intervals overlap | spread | {agrees} |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for entry in comparison.agreements:
        spread = "n/a" if entry.spread is None else f"{entry.spread:.1%}"
        if entry.of_bounds and entry.spread is not None:
            spread += " (of the lower bounds: no baseline met the SLO)"
        lines.append(
            f"| {entry.name} | {shown(entry.first)} | {shown(entry.second)} | {yes(entry.overlap)} | "
            f"{spread} | {yes(entry.agrees)} |"
        )
    lines += ["", f"| target | least | {first} | {second} |", "|---|---|---|---|"]
    for mine, theirs in zip(*comparison.targets, strict=True):
        lines.append(
            f"| {mine.name} | x{mine.least:g} | {shown(mine.ratio)}: {yes(mine.met)} | "
            f"{shown(theirs.ratio)}: {yes(theirs.met)} |"
        )
    moved = "not comparable" if comparison.floor_moved is None else f"{comparison.floor_moved:+.1%}"
    lacking = "; ".join(
        f"{name} lacks {', '.join(gone)}"
        for name, run in zip(comparison.names, comparison.runs, strict=True)
        if (gone := missing(run))
    )
    verdicts = [
        ("two runs, the second started after the first ended", comparison.one_after_the_other),
        (f"both of the {PROFILE} profile", comparison.headline_profile),
        (
            "both measured every headline ratio" + (f" ({lacking})" if lacking else ""),
            comparison.complete,
        ),
        (
            "one code: one commit, or two that differ only in bench/results/, neither dirty",
            comparison.one_code,
        ),
        (
            (
                f"both in the host's unit, so their speeds may differ (the second's floor {moved} from the "
                "first's)"
                if comparison.in_host_unit
                else f"the machine's speed held between them (the second's floor {moved} from the first's, "
                f"limit {comparison.floor_limit:.0%})"
            ),
            comparison.same_speed,
        ),
        ("both runs checked and neither flagged, at the default limits", comparison.quotable),
        ("every headline ratio agrees", comparison.reproduced),
        ("the first mix's targets met in both", comparison.targets_met),
    ]
    lines += ["", *(f"- {what}: {yes(ok)}" for what, ok in verdicts), "",
              f"**{'Every check holds.' if comparison.holds else 'Not every check holds.'}**"]  # fmt: skip
    return "\n".join(lines) + "\n"


def read(folder: str) -> Run:
    """The run in `folder` (its results.json)."""
    path = Path(folder) / "results.json"
    try:
        return Run.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        raise SystemExit(f"python -m bench reproduce: --runs: no results.json in {folder}") from None


def main(argv: Sequence[str] | None = None) -> int:
    config = load(ReproduceConfig, argv, prog="python -m bench reproduce", description=__doc__)
    first, second = listed(config, "runs")
    comparison = compare((first, second), (read(first), read(second)), config)
    text = render(comparison, config)
    print(text, end="")
    if config.out:
        Path(config.out).write_text(text)
    return 0 if comparison.holds else 1


if __name__ == "__main__":
    sys.exit(main())
