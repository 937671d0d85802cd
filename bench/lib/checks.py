"""Whether a run's figures may be quoted: its checks, recorded in results.json (`Run.checks`)
and at the top of its report.

Two things move every figure of a run on a shared machine without showing in its ratios' points:

- the machine's speed: the in-process floor (`bench.lib.floor.model_floor`) is timed before any fleet
  starts and again after the last one stopped, each in a fresh process (`in_fresh_process`; timed in
  the benchmark's own process after its load, short lengths read up to 40 % slower: 16 events 2.9 ->
  4.2 ms in a 2.5-minute cpu-tiny run, 2.9 -> 3.0 ms apart). Each length's lower time of the two
  (timing noise only ever adds) is compared with the previous committed run of the same profile
  (bench/results/<profile>/ at the checkout's HEAD): the relative change of the full forwards summed
  over the lengths both timed. A change above `--floor-drift-limit` (10 %) flags the run: its limits
  are not comparable with the committed ones. So does the same change between the run's own two
  floors: the machine's speed moved while it ran. The limit is twice the floor's own noise: four floors
  timed in a row in one process on an idle machine (2026-11-27) spanned 9.6 % (the first the slowest),
  three in a fresh process 1.6 %, and the last four committed full runs' floors sit 1-7 % apart; at 5 %
  two of those three runs would have been flagged against the one before. The previous committed run
  counts only where it ran on the same host (`same_host`: CPU model, cores, platform and, where both
  recorded it, torch's CPU kernels): another host moves the floor far more than any contention, and
  says nothing of this run's. The same 2-core "AMD EPYC" VM on a host without AVX-512 (kernels AVX2,
  platform `...-fc-v782-...`, every session of 2026-11-27) timed 1.4-1.9x the committed full run's floor
  (`...-fc-v669-...`). A run on a host with no committed run is compared with none, and says so; a
  second run there is compared with the first (`bench.reproduce` holds two runs to one speed as well);
- other users of the machine: the cores they took during each measured point (`Cost.foreign_cores`),
  averaged over every point by its wall time. A mean above `--foreign-cores-limit` (0.2 cores) flags
  the run.

A run whose bounds are in its host's unit u (the CPU profiles' default, `bench.lib.config.BenchConfig.slo_u`)
runs the same experiment on any host: its floor's drift from the committed run is recorded but raises no
flag (and `--stop-when-flagged` does not stop it), while the foreign cores still do, and so does the
machine's speed moving within it: where the run went in phases (`bench.run.phases`), each judged in u as
timed at its own start, the unit's change from a phase's start to its end, phase by phase (the floor's
start-to-end change is then recorded, not a flag: a slower host between two phases changes no phase's
unit); where it did not, the floor's start-to-end change.

A flagged run's figures never go into the README (`quotable` refuses it; tests/bench/test_results.py
holds the README's run to it), and neither do those of a run with no checks: a run from before them, or
a record that takes none (a fixed-load A/B's results, `bench.ab`). `quotable` judges the recorded checks
at the default limits as well as at the run's own (`flags_at_default_limits`), since the limits are
flags with no maximum.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import TypeVar

from bench.lib import context
from bench.lib.config import BenchConfig
from bench.lib.schema import FloorPoint, Machine, Measurements, Point, Run, RunChecks, Sweep

Reference = tuple[str, list[FloorPoint]]  # a committed run's name (folder and commit) and its floor
R = TypeVar("R")  # a record of a run that may carry checks: a `Run`, or another command's (an A/B's)


class FlaggedRun(ValueError):
    """A run whose checks flagged it was about to be quoted."""


# A profile whose floor is timed as another's (the same lengths and repeats) is checked against that
# profile's committed run until it has one of its own.
SAME_FLOOR_AS = {"headline": "full"}


def same_host(one: Machine, other: Machine) -> bool:
    """Whether two runs' machines are one host class: the same CPU model, cores and platform (its kernel
    build included), and the same torch CPU kernels where both recorded them."""
    kernels = one.cpu_capability is None or other.cpu_capability is None
    return (one.cpu_model, one.cores, one.platform) == (other.cpu_model, other.cores, other.platform) and (
        kernels or one.cpu_capability == other.cpu_capability
    )


def committed_reference(profile: str, host: Machine) -> Reference | None:
    """The previous committed run of `profile` (bench/results/<profile>/results.json at HEAD), else of the
    profile that times its floor alike (`SAME_FLOOR_AS`), the first of them that ran on `host`
    (`same_host`): its name and its floor; None when there is none or it cannot be read."""
    for name in (profile, SAME_FLOOR_AS.get(profile)):
        text = context.committed_file(f"bench/results/{name}/results.json") if name else None
        if not text:
            continue
        try:
            run = Run.from_json(json.loads(text))
        except ValueError:
            return None
        if same_host(run.machine, host):
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
    yield from measured.ablations.relay_beside.values()


def points(measured: Measurements) -> Iterator[Point]:
    """Every point a run measured, every seed of every load."""
    for sweep in sweeps(measured):
        for point in sweep.points:
            yield point
            if point.verdict is not None:
                yield from point.verdict.points


def lowest(floor: list[FloorPoint], again: list[FloorPoint] | None) -> list[FloorPoint]:
    """`floor` with each path's time at each length lowered to `again`'s where it timed that length
    lower (`again` None: `floor`)."""
    other = {point.prefix_length: point for point in again or []}
    lowered = []
    for point in floor:
        twin = other.get(point.prefix_length, point)
        lowered.append(
            dataclasses.replace(
                point,
                full_ms=min(point.full_ms, twin.full_ms),
                pre_infer_ms=min(point.pre_infer_ms, twin.pre_infer_ms),
                rank_ms=min(point.rank_ms, twin.rank_ms),
            )
        )
    return lowered


def drift_flag(drift: float | None, moved: str, limit: float, meaning: str) -> str | None:
    """The flag of a floor that `moved` (says how) by `drift` (None: within `limit`, or not compared)."""
    if drift is None or abs(drift) <= limit:
        return None
    return f"the in-process floor moved {drift:+.1%} {moved} (limit {limit:.0%}): {meaning}"


def flags_at(checks: RunChecks, floor_limit: float, foreign_cores_limit: float) -> list[str]:
    """The flags a run's checks raise at these limits: a floor that moved more than `floor_limit` from
    the committed run's or from the run's start to its end, a mean of other users' cores above
    `foreign_cores_limit`."""
    # A run in the host's unit with phases judged each phase in its own u: the unit's change within each
    # phase is what may flag it, not the floor's from the run's start to its end.
    by_phase = checks.in_host_unit and bool(checks.phase_changes)
    moved = [
        (
            None if checks.in_host_unit else checks.floor_drift,
            f"from {checks.floor_reference}'s",
            "the machine ran at another speed",
        ),
        (
            None if by_phase else checks.floor_change,
            "from the run's start to its end",
            "the machine's speed changed while it ran",
        ),
        *(
            (change, f"during the phase '{name}' (the host's unit u, from its start to its end)",
             "its points were judged in a unit the machine no longer had")
            for name, change in checks.phase_changes.items()
        ),
    ]  # fmt: skip
    flags = [flag for drift, how, meaning in moved if (flag := drift_flag(drift, how, floor_limit, meaning))]
    if checks.foreign_cores_mean > foreign_cores_limit:
        flags.append(
            f"other users of the machine took {checks.foreign_cores_mean:.2f} cores on average during the "
            f"points (limit {foreign_cores_limit:g})"
        )
    return flags


def run_checks(config: BenchConfig, measured: Measurements, reference: Reference | None) -> RunChecks:
    """The checks of a run (see the module's docstring) against the previous committed run's floor."""
    drift = (
        None if reference is None else floor_drift(lowest(measured.floor, measured.floor_end), reference[1])
    )
    costs = [point.cost for point in points(measured)]
    wall = sum(cost.wall_s for cost in costs)
    mean = sum(cost.foreign_cores * cost.wall_s for cost in costs) / wall if wall else 0.0
    checks = RunChecks(
        floor_reference=None if reference is None else reference[0],
        floor_drift=drift,
        foreign_cores_mean=round(mean, 3),
        foreign_cores_max=round(max((cost.foreign_cores for cost in costs), default=0.0), 3),
        flags=[],
        floor_change=None if measured.floor_end is None else floor_drift(measured.floor_end, measured.floor),
        in_host_unit=measured.host_unit is not None and measured.host_unit.slo_u is not None,
        phase_changes={phase.name: phase.change for phase in measured.phases},
    )
    return dataclasses.replace(
        checks, flags=flags_at(checks, config.floor_drift_limit, config.foreign_cores_limit)
    )


def first_floor(
    config: BenchConfig, floor: list[FloorPoint], log: Callable[[str], None], host: Machine
) -> None:
    """Logs how far a run's first floor on `host` moved from the previous committed run's there; with
    `--stop-when-flagged`, FlaggedRun when that is already past the limit (before any fleet starts)."""
    reference = committed_reference(config.profile, host)
    if reference is None:
        log(f"floor check: no committed run of this profile on this host ({describe(host)}) to compare with")
        return
    drift = floor_drift(floor, reference[1])
    log(f"floor check: {'not comparable' if drift is None else f'{drift:+.1%}'} against {reference[0]}")
    if not config.slo_ms:
        log("floor check: the run's bounds are in the host's unit u, so its speed is recorded, not a flag")
        return
    flag = drift_flag(
        drift, f"from {reference[0]}'s", config.floor_drift_limit, "the machine runs at another speed"
    )
    if flag is not None and config.stop_when_flagged:
        raise FlaggedRun(
            f"{flag}; stopped before any fleet started (--stop-when-flagged false runs it anyway)"
        )


def describe(host: Machine) -> str:
    """A host as the checks name it: CPU model, cores, torch's CPU kernels and platform."""
    kernels = f", {host.cpu_capability} kernels" if host.cpu_capability else ""
    return f"{host.cpu_model}, {host.cores} cores{kernels}, {host.platform}"


def with_checks(run: Run, reference: Callable[[str, Machine], Reference | None] = committed_reference) -> Run:
    """`run` with its checks, against the previous committed run of its profile on its host
    (`reference(profile, machine)`)."""
    found = reference(run.configuration.profile, run.machine)
    run.checks = run_checks(run.configuration, run.measured, found)
    return run


def default_limit(name: str) -> float:
    """The documented default of one of the checks' limits (`floor_drift_limit`, `foreign_cores_limit`)."""
    return next(field.default for field in dataclasses.fields(BenchConfig) if field.name == name)


def flags_at_default_limits(checks: RunChecks) -> list[str]:
    """The flags a run's recorded checks raise at the default limits, whatever limits the run was given."""
    return flags_at(checks, default_limit("floor_drift_limit"), default_limit("foreign_cores_limit"))


def quotable(run: R) -> R:
    """`run`, whose figures may go into the README; FlaggedRun when it records no checks (a `Run` from
    before them, or a fixed-load A/B's `AbResults`, which take none) or its checks flag it, at its own
    limits or at the default ones. `run.name` names it in the message."""
    checks: RunChecks | None = getattr(run, "checks", None)
    name = run.name
    if checks is None:
        raise FlaggedRun(
            f"{name} records no checks (its machine's speed against a committed run's, other users' cores): "
            "its figures may not be quoted"
        )
    flags = list(dict.fromkeys([*checks.flags, *flags_at_default_limits(checks)]))
    if flags:
        raise FlaggedRun(f"{name} is flagged, its figures may not be quoted: {'; '.join(flags)}")
    return run
