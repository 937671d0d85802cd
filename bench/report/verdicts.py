"""The report's sections on a run's checks and on its edges as statistics, for runs that recorded them:
older runs render without them, as they did.

`checks_banner`: at the top of the report, whether the run's recorded checks flagged it, and why; a flagged
run's figures are not for the README. `edges_section`: each sweep's bracket (its best and the lowest
failing value above it), each ratio with its bracket-based interval, the pooled verdicts at each
mode's bracket on every mix (the seeds, requests, pooled P99 and interval, decided or not).
`over_slo_sentence`: what the Ranks over the SLO were at a failing load (`bench.lib.schema_context.OverSlo`,
pooled over the load's seeds), for the report's account of what stopped each mode. `phases_section`:
the host's unit in each phase.
"""

from __future__ import annotations

import collections

from bench.lib.schema import Point, Run, Sweep
from bench.lib.schema_context import OverSlo
from bench.report.tables import ms, table, times


def checks_banner(run: Run) -> str:
    """The run's checks in a paragraph (empty for a run from before them)."""
    checks = run.checks
    if checks is None:
        return ""
    drift = "no committed run on this host to compare with" if checks.floor_drift is None else (
        f"{checks.floor_drift:+.1%} against {checks.floor_reference}"
    )  # fmt: skip
    if checks.floor_change is not None:
        drift += f", {checks.floor_change:+.1%} from the run's start to its end"
    if checks.phase_changes:
        changes = ", ".join(f"{name} {change:+.1%}" for name, change in checks.phase_changes.items())
        drift += f"; the host's unit within each phase: {changes}"
    capability = run.machine.cpu_capability
    measured = (
        f"in-process floor {drift}{f' (CPU kernels: {capability})' if capability else ''}; other users of "
        f"the machine took {checks.foreign_cores_mean:.2f} cores on average during the points (at most "
        f"{checks.foreign_cores_max:.2f})"
    )
    if checks.flags:
        reasons = "".join(f"\n- {flag}" for flag in checks.flags)
        return f"**FLAGGED: this run's figures are not for the README.** ({measured}){reasons}"
    return f"Checks: {measured}; not flagged."


def bracket(sweep: Sweep) -> str:
    """A sweep's bracket: [best, first failure), open where a side is missing."""
    if sweep.best is None:
        return "none" if sweep.first_failure is None else f"< {sweep.first_failure:g}"
    if sweep.first_failure is None:
        return f"≥ {sweep.best:g}"
    return f"[{sweep.best:g}, {sweep.first_failure:g})"


def interval_cell(interval: list[float | None] | None) -> str:
    if interval is None:
        return ""
    low, high = interval
    return f"≥ {times(low)}" if high is None else f"{times(low)} to {times(high)}"


def _verdict_rows(mode: str, sweep: Sweep) -> list[list[str]]:
    rows = []
    chosen = [("best", sweep.best), ("first failure", sweep.first_failure)]
    for role, value in chosen:
        point: Point | None = next((p for p in sweep.points if value is not None and p.rate == value), None)
        if point is None or point.verdict is None:
            continue
        v = point.verdict
        low, high = v.rank_p99_ci_ms
        rows.append([
            mode, role, f"{value:g}", ", ".join(str(seed) for seed in v.seeds), v.requests,
            f"{ms(v.rank_p99_ms)} [{ms(low)}, {ms(high)}]", "meets" if v.meets_slo else "fails",
            "yes" if v.decided else f"**no** ({v.outcome})",
        ])  # fmt: skip
    return rows


def counts(counter: dict[str, int]) -> str:
    """`hbm 8, dram 2`: a count by label, largest first."""
    return ", ".join(f"{label} {n}" for label, n in collections.Counter(counter).most_common()) or "-"


def over_slo_sentence(point: Point) -> str:
    """What the Ranks over the SLO were at a failing load, pooled over its seeds, in a sentence (empty
    where its points predate the account): why that edge is where it is."""
    seeds = [point, *(point.verdict.points if point.verdict else [])]
    accounts: list[OverSlo] = [p.over_slo for p in seeds if p.over_slo is not None]
    if len(accounts) < len(seeds) or not sum(a.requests for a in accounts):
        return ""

    def pooled(field: str) -> str:
        return counts(sum((collections.Counter(getattr(a, field)) for a in accounts), collections.Counter()))

    over, failed = sum(a.requests for a in accounts), sum(a.failed for a in accounts)
    events = sum(a.long_term_events for a in accounts)
    computed = sum(a.computed_prefix_events for a in accounts) / events if events else 0.0
    ranked = sum(p.measured - p.abandoned for p in seeds)
    plural = "s" * (len(seeds) > 1)
    text = (
        f" Over the SLO: {over} of its {ranked} Ranks ({len(seeds)} load seed{plural}"
        f"{f', {failed} failed' if failed else ''}); their prefixes from {pooled('cache_sources')}"
    )
    if any(a.miss_reasons for a in accounts):
        text += f" (misses: {pooled('miss_reasons')})"
    if over > failed:
        answers = pooled("admit_reasons")
        text += "" if answers.startswith("no_answer") and "," not in answers else f"; trigger: {answers}"
        wait_ms = sum(a.prefix_wait_ms for a in accounts) / (over - failed)
        text += (
            f"; mean wait for an in-flight prefix {wait_ms:.1f} ms; {computed:.0%} of their long-term events "
            "computed on the critical path"
        )
    bursts, largest = sum(a.bursts for a in accounts), max(a.largest_burst for a in accounts)
    return text + f"; in {bursts} burst{'s' * (bursts > 1)}, the largest of {largest}."


def edges_section(run: Run) -> str:
    """Brackets, ratio intervals and the pooled verdicts at the brackets (empty for older runs)."""
    measured = run.measured
    mixes = measured.throughput_sweeps
    if run.length_ratio_interval is None or any(mix.ratio_interval is None for mix in mixes.values()):
        return ""
    length = measured.length_sweep
    rows = [[
        f"length (events) at {length.rate:g} req/s", bracket(length.baseline), bracket(length.relay),
        times(run.length_ratio), interval_cell(run.length_ratio_interval),
    ]]  # fmt: skip
    rows += [
        [f"load (req/s) on `{label}`", bracket(mix.baseline), bracket(mix.relay), times(mix.ratio),
         interval_cell(mix.ratio_interval)]
        for label, mix in mixes.items()
    ]  # fmt: skip
    rows += [
        [f"load (req/s), {entry.fraction:.0%} abandoned", bracket(entry.sweeps.baseline),
         bracket(entry.sweeps.relay), times(entry.ratio), interval_cell(entry.ratio_interval)]
        for entry in measured.abandonment.fractions.values()
        if entry.sweeps is not None
    ]  # fmt: skip
    cap = run.profile.seed_cap
    verdicts = [row for mix in mixes.values() for mode in ("baseline", "relay")
                for row in _verdict_rows(f"{mode} on `{mix.universe}`", getattr(mix, mode))]  # fmt: skip
    look = look_level(run)
    parts = [
        "## Edges: brackets and ratio intervals",
        f"A value's verdict pools its load seeds (each its own users and arrivals): after each seed, the "
        f"ranked requests of every seed so far give the P99 and its bootstrap interval ({look:.0%} a look, "
        f"so that all the looks together err at most 5 % where the level was set for them); the value "
        f"passes when the interval lies within the SLO, fails when it lies above it (or a seed stopped "
        f"early: the pooled requests had failed for certain), and otherwise gets one more seed, up to "
        f"{cap}; at the cap the pooled P99 decides alone (undecided). Each mode's edge lies in its "
        f"bracket: its highest passing value and the lowest failing one above it. A ratio's interval "
        f"follows from the two brackets (RelayGR's best over the baseline's first failure, RelayGR's first"
        f" failure over the baseline's best): it bounds the ratio of the edges as the verdicts placed "
        f"them, and is not a confidence interval.",
        table(("sweep", "baseline edge", "RelayGR edge", "ratio", "ratio interval"), rows),
    ]
    if verdicts:
        header = ("mode", "point", "load req/s", "load seeds", "requests", "pooled rank P99 ms (95% CI)",
                  "verdict", "decided")  # fmt: skip
        parts += ["The pooled verdicts at each mode's bracket:", table(header, verdicts)]
    return "\n\n".join(parts)


def look_level(run: Run) -> float:
    """The confidence of each look's P99 interval in `run`'s verdicts (0.95 in runs from before it was
    recorded)."""
    for mix in run.measured.throughput_sweeps.values():
        for sweep in (mix.baseline, mix.relay):
            for point in sweep.points:
                if point.verdict is not None:
                    return point.verdict.confidence or 0.95
    return 0.95


def phases_section(run: Run) -> str:
    """Each phase's host unit at its start and end and the SLO it was judged against (empty for runs
    without phases: every run but the retired headline profile's)."""
    phases = run.measured.phases
    if not phases:
        return ""
    rows = [
        [phase.name, f"{phase.started_s / 60:.1f}", f"{phase.duration_s / 60:.1f}", f"{phase.u_ms:g}",
         f"{phase.u_end_ms:g}", f"{phase.change:+.1%}", f"{phase.slo_ms:g}", f"{phase.host_wait_s:g}"]
        for phase in phases
    ]  # fmt: skip
    header = ("phase", "started, min", "minutes", "u at start ms", "u at end ms", "change", "SLO judged ms",
              "waited for the host, s")  # fmt: skip
    text = (
        "Each experiment ran as a phase: u (the in-process full pass at the host unit's length, in a fresh "
        "process, every running fleet idle) was timed at its start and its end, and its points were judged "
        "against the run's SLO multiple of its starting u; the fleets kept the trigger's SLO and the relay "
        "window they started with. A phase whose u moved more than the floor's drift limit flags the run. "
        "Before each point a probe read the host's speed, and the point waited while the host was slower "
        "than it had been (within the run's --host-wait-s)."
    )
    return f"## Phases: the host's unit in each experiment\n\n{text}\n\n{table(header, rows)}"
