"""The block experiment's report.md and plot (`render_markdown`, `draw`), from its results.json alone: the
calibration and design, the claim (`claim`: the largest multiple k of the baseline's load at which
RelayGR's P99 is no higher than the baseline's at L, with r_k and r_{k+1}), every arm with its step of the
fixed sequence, RelayGR against admit-all, the blocks with their slowdown, the same analysis over every
block where it differs, and the Ranks over the SLO by why."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from bench.headline.config import ADMIT_ALL, BASELINE, RELAY
from bench.headline.schema import Analysis, Estimate, HeadlineResults, trial_p99

PLOT = "p99-by-load.png"


def ratio(e: Estimate | None, digits: int = 2) -> str:
    """`x0.85 [0.78, 0.93]`: the estimate with its block-bootstrap interval."""
    if e is None or e.value is None:
        return "n/a"

    def bound(x: float | None) -> str:
        return "∞" if x is None else f"{x:.{digits}f}"

    return f"x{e.value:.{digits}f} [{bound(e.low)}, {bound(e.high)}]"


def t_check(e: Estimate) -> str:
    if e.t_low is None or e.t_high is None:
        return "n/a"
    return f"[{e.t_low:.2f}, {e.t_high:.2f}]"


def claim(analysis: Analysis | None) -> str:
    """The headline sentence, with r_k and r_{k+1} and their intervals."""
    if analysis is None:
        return "No block was kept: nothing is claimed."
    steps = analysis.steps
    k = analysis.claimed
    if k is None:
        first = steps[0]
        return (f"RelayGR claims no multiple: at {first.multiple:g} L its P99 is {ratio(first.ratio)} the "
                f"baseline's at L (one-sided upper bound {first.ratio.upper}).")  # fmt: skip
    at = next(step for step in steps if step.multiple == k)
    after = next((step for step in steps if step.multiple > k), None)
    sentence = f"**RelayGR carries {k:g}x the baseline's load at no worse P99**: r_{k:g} = {ratio(at.ratio)}"
    if after is not None:
        upper = after.ratio.upper
        why = "its P99 misses the SLO" if not after.meets_slo else "not tested"
        if upper is None or upper > 1:
            why = f"upper bound {'∞' if upper is None else f'{upper:.2f}'} > 1"
        sentence += f"; r_{after.multiple:g} = {ratio(after.ratio)} ({why})"
    return sentence + "."


def per_block(results: HeadlineResults) -> bool:
    """Whether the run timed u before every block (its loads, SLOs and pooled P99s in each block's u)."""
    return any(block.u_ms is not None for block in results.blocks)


def run_unit(results: HeadlineResults) -> tuple[float, float, float]:
    """The run's u, ms, with its range: the median of its blocks' own, or the calibration's."""
    units = [block.u_ms for block in results.blocks if block.u_ms is not None]
    if not units:
        return (results.calibration.u_ms,) * 3
    return statistics.median(units), min(units), max(units)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def arms_table(results: HeadlineResults, analysis: Analysis) -> list[str]:
    steps = {step.multiple: step for step in analysis.steps}
    # A run whose blocks timed their own u judged each Rank against its block's SLO, 2.87 of that u.
    slo = f"{results.settings.slo_u:g} u" if per_block(results) else f"{results.calibration.slo_ms:g} ms"
    rows = []
    for arm in analysis.arms:
        step = steps.get(arm.multiple) if arm.mode == RELAY else None
        verdict = ""
        if step is not None:
            verdict = "claimed" if step.passed else ("fails" if step.tested else "not tested")
        rows.append([
            arm.arm, f"{arm.rate:g}", f"{arm.p99_ms:.1f}", f"{arm.p99_u:.2f}",
            ratio(step.ratio) if step else "", f"{step.ratio.upper:.3f}" if step and step.ratio.upper else "",
            t_check(step.ratio) if step else "", f"{arm.over} / {arm.ranks} ({arm.over / arm.ranks:.2%})",
            "yes" if arm.meets_slo else "no", verdict,
        ])  # fmt: skip
    return table(
        ["arm", "req/s", "P99 ms", "P99 u", "r_k = P99 / baseline's [95 %]", "upper (one-sided)",
         "t check", f"Ranks over {slo}", "meets SLO", "decision"],
        rows,
    )  # fmt: skip


def analysis_lines(results: HeadlineResults, analysis: Analysis) -> list[str]:
    lines = [
        claim(analysis),
        "",
        f"{len(analysis.blocks)} blocks ({'' if analysis.balanced else 'not '}a balanced Williams set).",
        "",
        *arms_table(results, analysis),
        "",
    ]
    if analysis.against_admit_all:
        rows = [[f"{k} L", ratio(e), f"{e.upper:.3f}" if e.upper else "∞", t_check(e)]
                for k, e in analysis.against_admit_all.items()]  # fmt: skip
        lines += ["RelayGR's P99 over admit-all's at the same load:", "",
                  *table(["load", "ratio [95 %]", "upper (one-sided)", "t check"], rows), ""]  # fmt: skip
    return lines


def unit_line(results: HeadlineResults) -> str:
    """How u, L and the bounds were set: u timed before every block, or (older runs) once, at the start."""
    c, cal = results.settings, results.calibration
    if not per_block(results):
        return (
            f"u = {cal.u_ms:g} ms (the median of {len(cal.unit_timings_ms)} full passes at {cal.unit_length} "
            f"events); L = {cal.load_per_u:g} / u = {cal.rate:g} Recommend/s; SLO {c.slo_u:g} u = "
            f"{cal.slo_ms:g} ms; relay window {cal.relay_window_ms:g} ms. "
        )
    rates = [block.rate for block in results.blocks if block.rate is not None]
    u, low, high = run_unit(results)
    return (
        f"u is timed on the drained host before every block (the median of {c.unit_timings} full passes at "
        f"{cal.unit_length} events): {u:g} ms over the blocks ({low:g}-{high:g}). Each block's L = "
        f"{cal.load_per_u:g} / its u ({min(rates):g}-{max(rates):g} Recommend/s) and its SLO {c.slo_u:g} u; "
        "its latencies pool in its u, shown as ms at the median u. The fleets run with the bounds of "
        f"u = {cal.u_ms:g} ms, timed before they started: SLO {cal.slo_ms:g} ms (the trigger's), relay "
        f"window {cal.relay_window_ms:g} ms. "
    )


def render_markdown(results: HeadlineResults) -> str:
    c, cal, host = results.settings, results.calibration, results.machine
    kept, every = results.kept, results.every
    correlation = None if every is None else every.drift_p99_correlation
    # Runs from before the rule on other processes' cores recorded none, and render as they did; so do runs
    # that timed u once, before their fleets started.
    foreign_rule = any(block.foreign_cores is not None for block in results.blocks)
    # Runs before the host's speed so far compared each block with the calibration's canary reading.
    so_far = any(block.canary_reference_ms is not None for block in results.blocks)
    own_units = per_block(results)
    lines = [
        "# The headline: RelayGR against the baseline in randomized interleaved blocks",
        "",
        f"{host.cpu_model} ({host.cores} cores, {host.cpu_capability or 'vector width not recorded'}), "
        f"commit {results.commit}, started {results.started_at}, {results.duration_s / 60:.0f} minutes. "
        f"`{c.model_preset}` with {c.rankers} rankers a fleet, mix 1 (median {c.mix_median}, cap {c.mix_max} "
        "events).",
        "",
        unit_line(results) + "Each block runs every arm once on one arrival seed, in a Williams order;"
        f" each trial sends {c.requests} measured Recommends "
        f"({c.baseline_requests} for the baseline) after {c.warmup_s:g} s of its own load, "
        "and none stops early. Intervals resample whole "
        f"blocks ({c.resamples} resamples, {c.confidence:.0%}); the t check is the t interval of the "
        "per-block log ratios. A multiple is claimed, in ascending order, while its one-sided upper "
        "bound of r_k is at most 1 and its share of Ranks over the SLO is below 1 % by a binomial test.",
        "",
        f"![P99 by load]({PLOT})",
        "",
        "## The blocks kept (the headline)",
        "",
        *(["No block was kept.", ""] if kept is None else analysis_lines(results, kept)),
        "## Blocks",
        "",
        f"A block is left out of the headline when its host slowdown s is above {c.drift_limit:g}: the "
        "median of the canary's CPU time on the drained host before each of its trials against "
        + (
            "the host's speed so far (the median of the reference readings and every block's idle readings, "
            "its own included)"
            if so_far
            else "the calibration's"
        )
        + ", scaled by the steal share"
        + (
            ""
            if not foreign_rule
            else f"; or when, during one of its trials, processes other than the fleets and the load "
            f"generator took more than {c.foreign_limit:g} cores"
        )
        + ". The baseline's own P99 at L tracks the host's speed; its "
        f"rank correlation with s over every block: {'n/a' if correlation is None else correlation}.",
        "",
    ]
    baseline = {t.block: t for t in results.trials if t.mode == BASELINE}
    rows, reference = [], cal.canary_reference_ms
    for block in results.blocks:
        trial = baseline.get(block.index)
        rows.append([
            str(block.index), str(block.seed), ", ".join(block.order), f"{block.slowdown:.3f}",
            *([f"{block.u_ms:g}", f"{block.rate:g}"] if own_units else []),
            f"{block.canary_ms:g}" + (f" / {block.canary_reference_ms or reference:g}" if so_far else ""),
            f"{block.steal_share:.1%}",
            *([f"{block.foreign_cores:g}"] if foreign_rule else []),
            "" if trial is None else f"{trial_p99(trial):.1f}",
            "kept" if block.kept else "left out", f"{block.duration_s:.0f}",
        ])  # fmt: skip
    header = ["block", "seed", "order", "s", *(["u ms", "L req/s"] if own_units else []),
              "canary / reference ms" if so_far else "canary ms", "steal",
              *(["other cores"] if foreign_rule else []), "baseline P99 ms",
              "", "seconds"]  # fmt: skip
    lines += [*table(header, rows), ""]
    if every is not None and (kept is None or every.blocks != kept.blocks):
        lines += ["## Every block, the left-out ones included", "", *analysis_lines(results, every)]
    if kept is not None:
        rows = [[arm.arm, f"{arm.over}", ", ".join(f"{k} {v}" for k, v in arm.over_sources.items()) or "none",
                 ", ".join(f"{k} {v}" for k, v in arm.sources.items())] for arm in kept.arms]  # fmt: skip
        lines += ["## Ranks over the SLO, by why", "",
                  *table(["arm", "over", "over the SLO: source/miss reason", "every Rank: source"], rows),
                  ""]  # fmt: skip
    return "\n".join(lines) + "\n"


def draw(results: HeadlineResults, out_dir: Path) -> None:
    """P99 against the load multiple, per arm, as a multiple of the baseline's P99 at L, with intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    analysis = results.kept or results.every
    if analysis is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    steps = analysis.steps
    # A block bootstrap's percentile interval need not hold the pooled estimate: the interval is drawn as
    # its own bar, and a ratio with no finite P99 (over 1 % unanswered) is left out of the plot.
    shown = [s for s in steps if s.ratio.value is not None and math.isfinite(s.ratio.value)]
    ax.plot([s.multiple for s in shown], [s.ratio.value for s in shown], "o-",
            label="RelayGR: P99 / baseline's P99 at L [95 %]")  # fmt: skip
    bars = [s for s in steps if s.ratio.low is not None and s.ratio.high is not None
            and math.isfinite(s.ratio.high)]  # fmt: skip
    ax.vlines([s.multiple for s in bars], [s.ratio.low for s in bars], [s.ratio.high for s in bars],
              color="#1c7ed6")  # fmt: skip
    base = next(arm for arm in analysis.arms if arm.mode == BASELINE)
    admit = [arm for arm in analysis.arms if arm.mode == ADMIT_ALL]
    if admit:
        ax.plot([a.multiple for a in admit], [a.p99_ms / base.p99_ms for a in admit], "s", color="#e8590c",
                label="admit-all: P99 / baseline's P99 at L")  # fmt: skip
    ax.axhline(1.0, color="#495057", linestyle="--", label=f"the baseline's P99 at L ({base.p99_ms:.0f} ms)")
    # In u: a run whose blocks timed their own u pools its P99s in it, and its SLO is slo_u of it.
    slo = (
        results.settings.slo_u / base.p99_u
        if per_block(results)
        else results.calibration.slo_ms / base.p99_ms
    )
    ax.axhline(slo, color="#c92a2a", linestyle=":", label=f"SLO {results.settings.slo_u:g} u")
    ax.set_xlabel("load, multiples of L")
    ax.set_ylabel("ranking P99 / the baseline's at L")
    ax.set_title(f"k claimed: {analysis.claimed if analysis.claimed is not None else 'none'}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / PLOT, dpi=110)
    plt.close(fig)
