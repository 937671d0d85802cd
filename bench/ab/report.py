"""report.md of a fixed-load A/B, rendered from its results alone (`AbResults`)."""

from __future__ import annotations

import math

from bench.ab.schema import AbResults, AbRun, disturbed, latencies, number
from bench.lib.intervals import Interval
from bench.lib.stats import percentile


def interval(value: Interval, scale: float = 1.0, digits: int = 1, signed: bool = False) -> str:
    if value.value is None and value.low is None and value.high is None:
        return "n/a"
    low, high = (number(bound, scale, digits, signed) for bound in (value.low, value.high))
    return f"{number(value.value, scale, digits, signed)} [{low}, {high}]"


def over_slo(run: AbRun, slo_ms: float) -> str:
    """`rank P99 40.0 ms, 3 of 300 Ranks over`: a run's Rank P99, its Ranks over `slo_ms` (failures too)."""
    ranks = latencies(run.rank_ms)
    over = sum(ms > slo_ms for ms in ranks)
    return f"rank P99 {percentile(ranks, 99):.1f} ms, {over} of {len(ranks)} Ranks over"


def warmups(results: AbResults) -> list[str]:
    """The fleets' warm-up runs in a paragraph (none for an A/B without them)."""
    if not results.warmups:
        return []
    c = results.settings
    each = "; ".join(f"{run.mode} {over_slo(run, c.slo_ms)} the SLO" for run in results.warmups)
    rate = results.warmups[0].rate
    return [
        f"Before its first run each fleet got {c.fleet_warmup_s:g} s of load at {rate:g} Recommend/s, with "
        f"users of its own, counted nowhere (`--fleet-warmup-s`; a fleet's first run after its start reads "
        f"slow): {each}.",
        "",
    ]


def places(results: AbResults) -> dict[float, dict[str, list[int]]]:
    """Per load and mode, how many of its (seed, load) blocks it ran in each place (0: first)."""
    modes = results.settings.mode_names()
    counts = {rate: {mode: [0] * len(modes) for mode in modes} for rate in results.settings.rate_list()}
    blocks: dict[tuple[int, float], list[AbRun]] = {}
    for run in results.runs:
        blocks.setdefault((run.seed, run.rate), []).append(run)
    for (_, rate), runs in blocks.items():
        for place, run in enumerate(sorted(runs, key=lambda run: run.order)):
            counts[rate][run.mode][place] += 1
    return counts


def balanced(counts: dict[str, list[int]]) -> bool:
    """Whether at one load every place in the order went to every mode equally often, give or take one."""
    return all(max(column) - min(column) <= 1 for column in zip(*counts.values(), strict=True))


def order(results: AbResults) -> list[str]:
    """Which mode ran first at each load, and a warning where the order is unbalanced at a load."""
    found = places(results)
    each = "; ".join(
        f"at {rate:g}/s "
        + ", ".join(f"{mode} in {counts[0]} of {sum(counts)}" for mode, counts in by_mode.items())
        for rate, by_mode in found.items()
    )
    lines = [f"First in the order of a (seed, load): {each}."]
    if not all(balanced(by_mode) for by_mode in found.values()):
        lines[0] += (
            " **The order is unbalanced at a load**: a mode that always ran first there (right after the "
            "previous block's settle) or always after another mode's run may owe part of its difference to "
            "its place in the order."
        )
    return [*lines, ""]


def quantile(seeds: int) -> str:
    """Which quantile the share intervals take with this many seeds (`bench.lib.intervals.critical_value`)."""
    if seeds < 2:
        return "with the normal quantile (one seed: no design effect is estimated)"
    return (
        f"taking Student's t quantile for {seeds - 1} degrees of freedom (seeds - 1: the effect is "
        "estimated from them)"
    )


def render_markdown(results: AbResults) -> str:
    c = results.settings
    modes = c.mode_names()
    seeds = sorted({run.seed for run in results.runs})
    level = f"{c.confidence:.0%}"
    machine = results.machine
    lines = [
        f"# Fixed-load A/B: {', '.join(modes)}",
        "",
        f"`python -m bench ab` at {results.versions.git_commit}, started {results.started_at}, "
        f"{results.duration_s / 60:.1f} minutes on {machine.cores} cores ({machine.cpu_model}); load average "
        f"at the start {', '.join(f'{x:.2f}' for x in machine.load_average_at_start or [])}.",
        "",
        f"Every mode's fleet up at once ({c.rankers} {c.model_preset} ranker(s) each, {c.torch_threads} "
        f"thread(s)), driven in turn by (load seed, load), every mode once at each; users of "
        f"`{results.universe.label}` with revisit probability {c.revisit_probability:g}, relay window "
        f"{c.relay_window_ms:g} ms. Each run: {c.warmup_s:g} s of warm-up, then {c.requests} measured "
        f"Recommends open loop, no early stop. Load seeds {', '.join(str(s) for s in seeds)}; loads "
        f"{', '.join(f'{r:g}' for r in c.rate_list())} Recommend/s.",
        "",
        f"A Rank is over the SLO above {c.slo_ms:g} ms, a Recommend above {results.recommend_bound_ms:g} ms "
        "(its bound includes the relay window); a failed request is over both. Shares are over every "
        f"measured request of every seed, with {level} Wilson intervals on the effective counts (counts "
        f"divided by the design effect, the seeds' dispersion beyond a binomial's) {quantile(len(seeds))}; "
        "P99s are pooled over "
        f"the seeds, with {level} moving-block bootstrap intervals ({c.resamples} resamples, blocks of "
        f"{c.block_s:g} s of requests within each seed). A difference is the second mode's value less the "
        "first's: Newcombe's interval for shares (pp: percentage points), the paired block bootstrap for "
        "P99s (`bench.lib.intervals`).",
        "",
        *order(results),
        *warmups(results),
        "## Per mode and load",
        "",
        "| load /s | mode | requests | errors | Ranks over SLO | share % | design effect | "
        "Recommends over bound | share % | design effect | Rank P99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in results.cells:
        lines.append(
            f"| {cell.rate:g} | {cell.mode} | {cell.ranks} | {cell.errors} | {cell.ranks_over} | "
            f"{interval(cell.ranks_over_share, 100, 2)} | {cell.ranks_design_effect:g} | "
            f"{cell.recommends_over} | {interval(cell.recommends_over_share, 100, 2)} | "
            f"{cell.recommends_design_effect:g} | {interval(cell.rank_p99_ms)} |"
        )
    lines += [
        "",
        "## Per pair of modes",
        "",
        "| load /s | second - first | Ranks over SLO, pp | Recommends over bound, pp | Rank P99, ms |",
        "|---|---|---|---|---|",
    ]
    for pair in results.comparisons:
        lines.append(
            f"| {pair.rate:g} | {pair.b} - {pair.a} | {interval(pair.ranks_over_share, 100, 2, True)} | "
            f"{interval(pair.recommends_over_share, 100, 2, True)} | "
            f"{interval(pair.rank_p99_ms, 1, 1, True)} |"
        )
    lines += ["", *[f"- {verdict}" for pair in results.comparisons for verdict in pair.verdicts], ""]
    if len(seeds) < 5:
        lines += [f"Only {len(seeds)} load seed(s): the design effect rests on few of them.", ""]
    flagged = [run for run in results.runs if disturbed(run, c)]
    lines += [
        "## Every run, in the order driven",
        "",
        f"{len(flagged)} of {len(results.runs)} runs disturbed (send lag P99 over "
        f"{c.send_lag_limit_ms:g} ms, or other processes over {c.foreign_cores_limit:g} cores while they "
        "ran).",
        "",
        "| # | mode | load /s | seed | Ranks over SLO | Rank P99 ms | errors | send lag P99 ms "
        "| foreign cores | wall s | disturbed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in results.runs:
        foreign = "-" if run.foreign_cores is None else f"{run.foreign_cores:.2f}"
        ranks = latencies(run.rank_ms)
        p99 = percentile(ranks, 99) if ranks else math.nan
        p99_text = number(None if math.isinf(p99) else p99)
        lines.append(
            f"| {run.order} | {run.mode} | {run.rate:g} | {run.seed} | "
            f"{sum(ms > c.slo_ms for ms in ranks)} of {len(ranks)} | {p99_text} | "
            f"{run.errors} | {run.send_lag_p99_ms:g} | {foreign} | {run.wall_s:g} | "
            f"{'; '.join(disturbed(run, c))} |"
        )
    return "\n".join(lines) + "\n"
