"""Whether a run's figures may be quoted (issue 31): its checks, recorded in results.json (`Run.checks`)
and at the top of its report.

Two things move every figure of a run on a shared machine without showing in its ratios' points:

- the machine's speed: the in-process floor (`bench.micro.floor.model_floor`, timed before any fleet
  starts) is compared with the previous committed run of the same profile (bench/results/<profile>/ at
  the checkout's HEAD): the relative change of its full forwards summed over the lengths both timed. A
  change above `--floor-drift-limit` (5 %) flags the run: its limits are not comparable with the
  committed ones;
- other users of the machine: the cores they took during each measured point (`Cost.foreign_cores`),
  averaged over every point by its wall time. A mean above `--foreign-cores-limit` (0.2 cores) flags
  the run.

A flagged run's figures never go into the README (`quotable` refuses it; tests/bench/test_results.py
holds the README's run to it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

from bench import context
from bench.config import BenchConfig
from bench.schema import FloorPoint, Measurements, Point, Run, RunChecks, Sweep

Reference = tuple[str, list[FloorPoint]]  # a committed run's name (folder and commit) and its floor


class FlaggedRun(ValueError):
    """A run whose checks flagged it was about to be quoted."""


# A profile whose floor is timed as another's (the same lengths and repeats) is checked against that
# profile's committed run until it has one of its own.
SAME_FLOOR_AS = {"headline": "full"}


def committed_reference(profile: str) -> Reference | None:
    """The previous committed run of `profile` (bench/results/<profile>/results.json at HEAD), else of the
    profile that times its floor alike (`SAME_FLOOR_AS`): its name and its floor; None when there is none
    or it cannot be read."""
    for name in (profile, SAME_FLOOR_AS.get(profile)):
        text = context.committed_file(f"bench/results/{name}/results.json") if name else None
        if not text:
            continue
        try:
            run = Run.from_json(json.loads(text))
        except ValueError:
            return None
        return f"bench/results/{name} (commit {run.versions.git_commit})", run.measured.floor
    return None


def floor_drift(floor: list[FloorPoint], reference: list[FloorPoint]) -> float | None:
    """This floor's full forwards, summed over the lengths both floors timed, relative to the reference's,
    less one (+0.1: 10 % slower); None when they share no length."""
    theirs = {point.prefix_length: point.full_ms for point in reference}
    shared = [point for point in floor if point.prefix_length in theirs]
    before = sum(theirs[point.prefix_length] for point in shared)
    if not shared or before <= 0:
        return None
    return round(sum(point.full_ms for point in shared) / before - 1, 4)


def sweeps(measured: Measurements) -> Iterator[Sweep]:
    """Every sweep of a run."""
    yield measured.length_sweep.baseline
    yield measured.length_sweep.relay
    for mix in measured.throughput_sweeps.values():
        yield from (mix.baseline, mix.relay)
    for fraction in measured.abandonment.fractions.values():
        if fraction.sweeps is not None:
            yield from (fraction.sweeps.baseline, fraction.sweeps.relay)
    yield from measured.window_sensitivity.values()
    yield from measured.ablations.sweeps.values()


def points(measured: Measurements) -> Iterator[Point]:
    """Every point a run measured, every seed of every load."""
    for sweep in sweeps(measured):
        for point in sweep.points:
            yield point
            if point.verdict is not None:
                yield from point.verdict.points


def run_checks(config: BenchConfig, measured: Measurements, reference: Reference | None) -> RunChecks:
    """The checks of a run (see the module's docstring) against the previous committed run's floor."""
    flags = []
    drift = None if reference is None else floor_drift(measured.floor, reference[1])
    if drift is not None and abs(drift) > config.floor_drift_limit:
        flags.append(
            f"the in-process floor moved {drift:+.1%} from {reference[0]}'s "
            f"(limit {config.floor_drift_limit:.0%}): the machine ran at another speed"
        )
    costs = [point.cost for point in points(measured)]
    wall = sum(cost.wall_s for cost in costs)
    mean = sum(cost.foreign_cores * cost.wall_s for cost in costs) / wall if wall else 0.0
    if mean > config.foreign_cores_limit:
        flags.append(
            f"other users of the machine took {mean:.2f} cores on average during the points "
            f"(limit {config.foreign_cores_limit:g})"
        )
    return RunChecks(
        floor_reference=None if reference is None else reference[0],
        floor_drift=drift,
        foreign_cores_mean=round(mean, 3),
        foreign_cores_max=round(max((cost.foreign_cores for cost in costs), default=0.0), 3),
        flags=flags,
    )


def with_checks(run: Run, reference: Callable[[str], Reference | None] = committed_reference) -> Run:
    """`run` with its checks, against the previous committed run of its profile (`reference(profile)`)."""
    run.checks = run_checks(run.configuration, run.measured, reference(run.configuration.profile))
    return run


def quotable(run: Run) -> Run:
    """`run`, whose figures may go into the README; FlaggedRun when its checks flagged it."""
    if run.checks is not None and run.checks.flags:
        raise FlaggedRun(
            f"{run.name} is flagged, its figures may not be quoted: {'; '.join(run.checks.flags)}"
        )
    return run
