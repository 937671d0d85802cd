"""report.md's sections on where each mode's edge lies, each from the runs that recorded what it reads
(the others render without it): what stopped each mode (`limits_section`, with what the Ranks over the SLO
were, `over_slo_sentence`), the run's checks (`checks_banner`), the first mix's capacity at other SLO
multiples of u (`capacity_section`), and the brackets, ratio intervals and pooled verdicts
(`edges_section`)."""

from __future__ import annotations

import collections
from typing import NamedTuple

from bench.lib.schema import Point, Run, Sweep, ratio, ratio_interval
from bench.report.figures import cores, first_failure, ms, table, times

CAPACITY_PLOT = "capacity_vs_slo.png"


def _limit_line(run: Run, sweep: Sweep, mode: str, key: str, title: str) -> str:
    failure = first_failure(sweep, key)
    if failure is None:
        return f"- {title}, {mode}: no point above its best failed; the grid ends there."
    counters = failure.cost.rankers
    value = getattr(failure, key)
    text = (
        f"- {title}, {mode}: at {value:g} {'events' if key == 'long_term' else 'req/s'} the ranking P99 was "
        f"{ms(failure.rank_ms.p99)} ms (P50 {ms(failure.rank_ms.p50)} ms, {failure.errors} errors); the "
        f"rankers used {cores(failure, rankers=True):.2f} cores, our other processes "
        f"{cores(failure, rankers=False):.2f}, other users of the machine {failure.cost.foreign_cores:.2f}."
        f"{over_slo_sentence(failure)}"
    )
    if mode == "relay":
        computed = counters.get("productions", {}).get("compute", 0)
        text += (
            f" {counters.get('joins', 0):g} Ranks (of {computed:g} prefix computations) arrived before "
            "their prefix was ready and waited for it"
        )
        pre_infer_s = counters.get("device_s", {}).get("pre_infer", 0.0)
        if computed:
            text += (
                f"; a prefix computation held a ranker's device thread {1000 * pre_infer_s / computed:.0f} "
                "ms on average (Ranks it let through between chunks included)"
            )
        text += "."
        floor = [p for p in run.measured.floor if p.prefix_length == value]
        if key == "long_term" and floor:
            text += (
                f" In-process, pre-inferring {value} events takes {floor[0].pre_infer_ms:.0f} ms, "
                f"against a relay window of {run.configuration.relay_window_ms:g} ms."
            )
    return text


def limits_section(run: Run) -> str:
    """What stopped each mode, measured at its first failing point."""
    lines = ["## What stopped each mode (measured at the first failing point)", ""]
    length = run.measured.length_sweep
    pairs = [("long_term", "Length", length.baseline, length.relay)]
    pairs += [("rate", f"Throughput on `{name}`", mix.baseline, mix.relay)
              for name, mix in run.measured.throughput_sweeps.items()]  # fmt: skip
    for key, title, baseline, relay in pairs:
        lines += [
            _limit_line(run, baseline, "baseline", key, title),
            _limit_line(run, relay, "relay", key, title),
        ]
    return "\n".join(lines)


def over_slo_sentence(point: Point) -> str:
    """What the Ranks over the SLO were at a failing load, pooled over its seeds, in a sentence (empty
    where its points predate the account): why that edge is where it is."""
    seeds = [point, *(point.verdict.points if point.verdict else [])]
    accounts = [p.over_slo for p in seeds if p.over_slo is not None]
    if len(accounts) < len(seeds) or not sum(a.requests for a in accounts):
        return ""

    def pooled(field: str) -> str:  # `hbm 8, dram 2`: a count by label over the seeds, largest first
        counts = sum((collections.Counter(getattr(a, field)) for a in accounts), collections.Counter())
        return ", ".join(f"{label} {n}" for label, n in counts.most_common()) or "-"

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


def checks_banner(run: Run) -> str:
    """The run's recorded checks in a paragraph (empty for a run without them)."""
    checks = run.checks
    if checks is None:
        return ""
    flagged = "; ".join(checks.flags) or "not flagged"
    return (
        f"Checks: in-process floor {checks.floor_drift:+.1%} against {checks.floor_reference}; other users "
        f"of the machine took {checks.foreign_cores_mean:.2f} cores on average during the points (at most "
        f"{checks.foreign_cores_max:.2f}); {flagged}."
    )


class CapacityRow(NamedTuple):
    """Both modes' capacity on the first mix at one SLO multiple of u (`headline`: the run's own)."""

    multiple: float
    slo_ms: float
    baseline: Sweep
    relay: Sweep
    headline: bool


def capacity_rows(run: Run) -> list[CapacityRow]:
    """Every SLO multiple of the first mix, the headline's (its sweeps are the mix's own) among them, in
    increasing order; none for a run whose SLO was absolute."""
    unit, (_, mix) = run.measured.host_unit, run.first_mix
    if unit is None or unit.slo_u is None or not mix.capacity:
        return []
    rows = [CapacityRow(unit.slo_u, unit.slo_ms, mix.baseline, mix.relay, True)]
    rows += [CapacityRow(c.multiple, c.slo_ms, c.baseline, c.relay, False) for c in mix.capacity.values()]
    return sorted(rows, key=lambda row: row.multiple)


def capacity_bracket(sweep: Sweep) -> str:
    """A mode's capacity as its bracket: the best load and the lowest failing one above it."""
    if sweep.best is None:
        return "none" + (f" (fails at {sweep.first_failure:g})" if sweep.first_failure is not None else "")
    above = "grid's end" if sweep.first_failure is None else f"{sweep.first_failure:g}"
    return f"{sweep.best:g} [{sweep.best:g}, {above})"


def capacity_section(run: Run) -> str:
    """The capacity-against-SLO table and its plot (empty for a run without capacities)."""
    rows = capacity_rows(run)
    if not rows:
        return ""
    cells = []
    for row in rows:
        shown = ratio(row.relay.best, row.baseline.best)
        low, high = ratio_interval(row.relay, row.baseline)
        cells.append((
            f"{row.multiple:g} u = {row.slo_ms:g} ms" + (" (headline)" if row.headline else ""),
            capacity_bracket(row.baseline), capacity_bracket(row.relay),
            ("none" if shown is None else f"x{shown:g}")
            + f" [x{low:g}, {'unbounded' if high is None else f'x{high:g}'}]",
        ))  # fmt: skip
    return "\n\n".join([
        f"## Capacity against the SLO (mix `{run.first_mix[0]}`)",
        "Each mode's highest load whose ranking P99 meets the SLO at several multiples of the host's unit "
        "u, with its bracket [best, lowest failing load above it); the ratio with the interval the two "
        "brackets give. The load sweeps ran at the largest multiple first and every smaller one reused "
        "their points; only the headline's multiple (marked) is refined between grid values.",
        table(("SLO", "baseline req/s", "RelayGR req/s", "RelayGR / baseline"), cells),
        f"![capacity against the SLO]({CAPACITY_PLOT})",
    ])  # fmt: skip


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
    """The pooled verdicts at a sweep's bracket: its best and its first failure."""
    rows = []
    for role, value in (("best", sweep.best), ("first failure", sweep.first_failure)):
        point = next((p for p in sweep.points if value is not None and p.rate == value), None)
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


def look_level(run: Run) -> float:
    """The confidence of each look's P99 interval in `run`'s verdicts (0.95 for a run without verdicts)."""
    for mix in run.measured.throughput_sweeps.values():
        for point in (*mix.baseline.points, *mix.relay.points):
            if point.verdict is not None:
                return point.verdict.confidence
    return 0.95


def edges_section(run: Run) -> str:
    """Brackets, ratio intervals and the pooled verdicts at the brackets (empty for runs without them)."""
    measured = run.measured
    mixes = measured.throughput_sweeps
    if run.length_ratio_interval is None or any(mix.ratio_interval is None for mix in mixes.values()):
        return ""
    length = measured.length_sweep

    def edge(what: str, base: Sweep, relay: Sweep, value: float | None, interval: list | None) -> list[str]:
        return [what, bracket(base), bracket(relay), times(value), interval_cell(interval)]

    rows = [edge(f"length (events) at {length.rate:g} req/s", length.baseline, length.relay, run.length_ratio,
                 run.length_ratio_interval)]  # fmt: skip
    rows += [edge(f"load (req/s) on `{label}`", mix.baseline, mix.relay, mix.ratio, mix.ratio_interval)
             for label, mix in mixes.items()]  # fmt: skip
    rows += [edge(f"load (req/s), {entry.fraction:.0%} abandoned", entry.sweeps.baseline, entry.sweeps.relay,
                  entry.ratio, entry.ratio_interval)
             for entry in measured.abandonment.fractions.values() if entry.sweeps is not None]  # fmt: skip
    verdicts = [row for mix in mixes.values() for mode in ("baseline", "relay")
                for row in _verdict_rows(f"{mode} on `{mix.universe}`", getattr(mix, mode))]  # fmt: skip
    look = look_level(run)
    parts = [
        "## Edges: brackets and ratio intervals",
        f"A value's verdict pools its load seeds (each its own users and arrivals): after each seed, the "
        f"ranked requests of every seed so far give the P99 and its bootstrap interval ({look:.0%} a look, "
        f"so that all the looks together err at most 5 % where the level was set for them); the "
        f"value passes when the interval lies within the SLO, fails when it lies above it (or a seed stopped "
        f"early: the pooled requests had failed for certain), and otherwise gets one more seed, up to "
        f"{run.profile.seed_cap}; at the cap the pooled P99 decides alone (undecided). Each mode's edge lies "
        f"in its bracket: its highest passing value and the lowest failing one above it. A ratio's interval "
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
