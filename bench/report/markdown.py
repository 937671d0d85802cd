"""report.md of a run (`render_markdown`), section by section, from its results alone."""

from __future__ import annotations

import math

from bench.lib.schema import Run, Sweep
from bench.report.figures import (
    ceiling_table,
    core_count,
    cpu_per_request_table,
    hit_rate_points,
    machine_section,
    ms,
    p99_with_ci,
    point_at,
    point_row,
    repeats_table,
    results_table,
    share,
    sweep_table,
    table,
    times,
    verdict,
    within_noise,
)
from bench.report.plots import PLOTS
from bench.report.verdicts import capacity_section, checks_banner, edges_section, limits_section

PAPER_LENGTH_RATIO = 1.5
PAPER_THROUGHPUT_RATIO = 3.6
ADMIT_ALL_HEADER = (
    "load req/s", "admit-all rank P99 ms (95% CI)", "RelayGR rank P99 ms (95% CI)", "RelayGR", "within noise",
)  # fmt: skip


def render_markdown(run: Run) -> str:
    sections = [
        _introduction(run),
        _headline(run),
        capacity_section(run),
        edges_section(run),
        _against_no_relay_and_admit_all(run),
        limits_section(run),
        _length_section(run),
        _throughput_section(run),
        _abandonment(run),
        _where_time_goes(run),
        _ablations(run),
        _windows(run),
        machine_section(run)
        + "\n\nThe configuration, every point and what it cost the fleet are in `results.json`.",
    ]
    return "\n\n".join(section for section in sections if section) + "\n"


def _introduction(run: Run) -> str:
    c, versions = run.configuration, run.versions
    banner = checks_banner(run)
    return (
        f"# RelayGR benchmark: `{run.name}` ({c.profile} profile)\n\n"
        + (f"{banner}\n\n" if banner else "")
        + f"{run.started_at}, {run.duration_s / 60:.1f} minutes on "
        f"{core_count(run) or 'unknown'} cores ({run.machine.cpu_model}), torch {versions.torch}, "
        f"preset `{c.model_preset}`, {c.rankers} rankers with {c.torch_threads} thread(s) each, "
        f"commit `{versions.git_commit}`.\n\n"
        "**This ran on a CPU shared with other work: only the ratios between the modes are "
        "meaningful, not the absolute latencies or loads.** Every mode ran the same fleet processes, "
        "model, user universe, seeds and load; the `foreign cores` columns show how much CPU other users "
        "of the machine took during each point."
    )


def _headline(run: Run) -> str:
    c, length, measured = run.configuration, run.measured.length_sweep, run.profile.measured
    slo = c.slo_ms
    answers = [(f"longest long-term length with ranking P99 ≤ {slo:g} ms at {length.rate:g} req/s", length,
                run.length_ratio, "long_term", PAPER_LENGTH_RATIO)]  # fmt: skip
    answers += [(f"highest load (req/s) with ranking P99 ≤ {slo:g} ms and < {c.max_error_fraction:.1%} "
                 f"errors on the mix `{label}`", mix, mix.ratio, "rate", PAPER_THROUGHPUT_RATIO)
                for label, mix in run.measured.throughput_sweeps.items()]  # fmt: skip
    rows = [
        [what, *("none" if s.best is None else f"{s.best:g}" for s in (pair.baseline, pair.relay)),
         ratio_cell(ratio, pair.baseline, pair.relay, key), f"x{paper}"]
        for what, pair, ratio, key, paper in answers
    ]  # fmt: skip
    violations = measured - math.ceil(0.99 * measured)
    unit = run.measured.host_unit
    in_unit = (
        f"Host unit u = {unit.u_ms:g} ms (the in-process full pass of `{unit.model_preset}` at "
        f"{unit.length} events, timed at the run's start): {unit.describe()}. "
        if unit
        else ""
    )
    return (
        "## Headline\n\n"
        + table(("", "baseline", "RelayGR", "ratio", "paper"), rows)
        + "\n\n"
        + in_unit
        + f"SLO: ranking-stage P99 ≤ {slo:g} ms, the Rank through the router as the retrieval stub sees it; "
        f"a failed request counts as a violation. Relay window (the stub's pre-processing delay): "
        f"{c.relay_window_ms:g} ms. Each point: {measured} measured requests after "
        f"{c.warmup_s:g} s of warm-up, open-loop Poisson arrivals, latency from the intended send "
        f"time; the P99 is nearest-rank, so a point meets the SLO with at most {violations} of them over it, "
        "and comes with its bootstrap 95% confidence interval. "
        f"Users: {c.revisit_probability:.0%} of requests revisit a user seen in the last "
        f"{c.revisit_window_s:g} s, the others are new users. Grids: lengths {c.lengths}; loads "
        f"{c.loads} req/s; each mode's value is the largest value that met the SLO, loads refined by "
        f"{run.profile.refine_steps} bisection(s) between grid values."
    )


def ratio_cell(ratio: float | None, baseline: Sweep, relay: Sweep, key: str) -> str:
    """A ratio, said as the bound it is where a sweep ran off its grid: RelayGR met the SLO at the grid's
    end (the ratio is at least this), or the baseline met it nowhere (at least RelayGR's best over the
    lowest value the baseline failed at)."""
    if ratio is None and baseline.best is None and relay.best is not None and baseline.points:
        lowest = min(getattr(p, key) for p in baseline.points)
        unit = "events" if key == "long_term" else "req/s"
        failed = f"the baseline met the SLO nowhere; it failed even at {lowest:g} {unit}"
        return f"> x{relay.best / lowest:.2f} ({failed})"
    at_top = " (lower bound: RelayGR met the SLO at the grid's end)" if relay.at_grid_top else ""
    return times(ratio) + at_top


def _against_no_relay_and_admit_all(run: Run) -> str:
    """RelayGR on the first mix against the strongest no-relay serving (`dram-only`) and against admitting
    every request (`admit-all`), the two comparisons the trigger is judged by."""
    label, mix = run.first_mix
    ablations, sweeps = run.measured.ablations, run.measured.ablations.sweeps
    parts = ["## RelayGR against the strongest no-relay serving and against admitting everything"]
    if ablations.relay_beside:
        parts.append("RelayGR's sweep here is the one measured in turns with each mode, on users of their "
                     "own, in the same minutes of the machine (its speed drifts over a run).")  # fmt: skip
    dram_only = sweeps.get("dram-only")
    if dram_only is not None:
        relay = ablations.relay_for("dram-only", mix.relay)
        ratio = relay.best / dram_only.best if relay.best and dram_only.best else None
        parts.append(
            "`baseline` computes every Rank's whole sequence on its critical path. The strongest serving "
            "without relay that this code can do is `dram-only`: the rankers keep their DRAM tier, so a "
            "revisit reloads or extends the prefix its last Rank computed, and only new users' prefixes "
            f"are computed on the Rank's path. On the mix `{label}` it met the SLO up to "
            f"{'no load' if dram_only.best is None else format(dram_only.best, 'g') + ' req/s'}, "
            f"RelayGR up to {relay.best:g} req/s: {ratio_cell(ratio, dram_only, relay, 'rate')}."
        )
    admit_all = sweeps.get("admit-all")
    if admit_all is not None:
        relay = ablations.relay_for("admit-all", mix.relay)
        rows = []
        for point in sorted((p for p in admit_all.points if p.passes), key=lambda p: p.rate):
            mine = point_at(relay, "rate", point.rate)
            if mine is None and relay.best is not None and point.rate <= relay.best:
                cells, noise = ["not measured", f"meets (it met the SLO at {relay.best:g})"], "yes"
            else:
                cells = [p99_with_ci(mine), verdict(mine)] if mine is not None else ["not measured", ""]
                noise = "yes" if within_noise(mine, point) else "**no**"
            rows.append([f"{point.rate:g}", p99_with_ci(point), *cells, noise])
        parts += [
            "Against `admit-all` (the trigger admits every request: no gain test, no brakes), at every "
            "load where admit-all met the SLO: RelayGR is within noise there when it meets the SLO too or "
            "its P99's 95% interval reaches into admit-all's.",
            table(ADMIT_ALL_HEADER, rows),
        ]
    return "\n\n".join(parts) if sweeps.keys() & {"dram-only", "admit-all"} else ""


def _length_section(run: Run) -> str:
    c, sweep = run.configuration, run.measured.length_sweep
    parts = [
        "## Experiment 1: longest sequence under the SLO",
        f"Every user has the same long-term length (plus {c.short_term} short-term events); offered "
        f"load {sweep.rate:g} req/s.",
        f"![P99 against length]({PLOTS['length']})",
    ]
    return "\n\n".join(parts + _sweep_tables({"baseline": sweep.baseline, "relay": sweep.relay}, "long_term"))


_ROUTING_NOTE = {
    "direct": " The trigger and the retrieval stubs routed their own PreInfer and Rank calls to the rankers "
    "(direct routing): the router took part in no request, and its column is what it spends meanwhile "
    "(its health checks of the rankers)."
}


def _throughput_section(run: Run) -> str:
    c = run.configuration
    parts = [
        "## Experiment 2: SLO-compliant throughput",
        f"Length mixes: long-term lengths lognormal (sigma {c.mix_sigma:g}), capped as production caps "
        "sequences to fit ranking's budget. `+`: the best is the grid's last value (a lower bound). "
        "The ablations (experiment 4) ran on the first mix only.",
        "CPU per request, at each mode's best load: every process's CPU seconds over the point (user + "
        "system, from /proc) divided by the requests it sent. The CPU is read around the whole point, "
        f"warm-up included, so the requests are the warm-up's ({c.warmup_s:g} s at the point's rate) "
        "plus the measured ones (abandoned ones included). The targets are the serving path's, for RelayGR's "
        "best point. The machine's ceiling: the cores our whole fleet needs at that load (its CPU per "
        f"request times the offered load) against the machine's {core_count(run) or 'unknown'} cores, beside "
        "the cores it used as measured (CPU seconds over the point's wall time) and those other users of the "
        "machine took." + _ROUTING_NOTE.get(c.routing, ""),
    ]
    for number, (label, mix) in enumerate(run.measured.throughput_sweeps.items()):
        pair = {"baseline": mix.baseline, "relay": mix.relay}
        sweeps = pair | run.measured.ablations.sweeps if number == 0 else dict(pair)
        parts += [f"### Mix `{label}`", results_table(sweeps)]
        if number == 0:
            parts.append(f"![P99 against load]({PLOTS['load']})")
        parts += [cpu_per_request_table(run, sweeps), ceiling_table(run, sweeps), repeats_table(pair)]
        parts += _sweep_tables(pair)
    return "\n\n".join(part for part in parts if part)


def _sweep_tables(sweeps: dict[str, Sweep], key: str = "rate") -> list[str]:
    """Each sweep's table of points under its title in bold."""
    return [part for title, sweep in sweeps.items() for part in (f"**{title}**", sweep_table(sweep, key))]


def _abandonment(run: Run) -> str:
    abandonment = run.measured.abandonment
    fractions = abandonment.fractions
    if not fractions:
        return ""
    rows = []
    for entry in fractions.values():
        rows.append([
            f"{entry.fraction:.0%}", entry.baseline_best, entry.relay_best, times(entry.ratio),
            f"{entry.waste.wasted_pre_infer_s:.1f}", share(entry.waste.wasted_share),
        ])  # fmt: skip
    header = (
        "abandoned", "baseline best req/s", "RelayGR best req/s", "ratio", "wasted pre-infer device s",
        "share of the rankers' device time",
    )  # fmt: skip
    parts = [
        "## Abandonment: pre-inference that no Rank consumes",
        f"On the mix `{abandonment.universe}`, a share of the requests is filtered upstream after "
        "retrieval: the stub still runs retrieval and, with the relay, the Admit (so the trigger may "
        "pre-infer a prefix), but sends no Rank. Which requests are abandoned is a hash of (universe seed, "
        "user, request time). Loads count every Recommend; a point's verdict is over the Ranks that "
        "happened. Wasted pre-infer device seconds: RelayGR's rankers' device time on prefixes no Rank "
        "consumed, over the whole pair of sweeps (at 0%: the first mix's throughput sweeps, their repeats "
        "included), read after the rankers' lease ran out; the share is of the rankers' device-thread "
        "seconds over the same time.",
        table(header, rows),
    ]
    for fraction, entry in fractions.items():
        if entry.sweeps is not None:
            modes = {"baseline": entry.sweeps.baseline, "relay": entry.sweeps.relay}
            parts += _sweep_tables(
                {f"{mode}, {float(fraction):.0%} abandoned": s for mode, s in modes.items()}
            )
    return "\n\n".join(parts)


def _where_time_goes(run: Run) -> str:
    cached = {p.prefix_length: p for p in run.measured.cached_rank}
    rows = []
    for p in run.measured.floor:
        row = [
            p.prefix_length, f"{p.full_ms:.1f}", f"{p.pre_infer_ms:.1f}", f"{p.rank_ms:.1f}",
            f"x{(p.pre_infer_ms + p.rank_ms) / p.rank_ms:.0f}",
        ]  # fmt: skip
        through = cached.get(p.prefix_length)
        if through is None or through.rank_ms_p50 is None:  # not measured, or never served from HBM
            row += ["", "", "", through.request_kib if through else ""]
        else:
            p50 = through.rank_ms_p50
            row += [ms(p50), ms(through.rank_ms_p99), f"{p50 - p.rank_ms:+.1f}", through.request_kib]
        rows.append(row)
    header = (
        "long-term length", "full forward ms", "pre-infer ms", "cached rank ms (floor)", "miss / cached",
        "cached Rank via router P50 ms", "P99 ms", "serving overhead ms", "request KiB",
    )  # fmt: skip
    return "\n\n".join([
        "## Experiment 3: where the time goes",
        "In-process: this process, the rankers' thread count, the ranker's own runner and warm-up profiler "
        "(median of repeats). Through the router: the idle RelayGR fleet, client-observed, each Rank after "
        "a PreInfer leased its prefix in HBM. `miss / cached`: what a miss costs on the critical path "
        "(pre-infer + rank, how the ranker computes a prefix it does not hold) over the cached rank, the "
        "most relay can save per request.",
        f"![Where the time goes]({PLOTS['floor']})",
        table(header, rows),
    ])  # fmt: skip


def _ablations(run: Run) -> str:
    ablations = run.measured.ablations
    rows = []
    for name, point in hit_rate_points(run).items():
        productions = point.cost.rankers.get("productions", {})
        answered = sum(point.admit_reasons.values()) or 1
        made = " / ".join(f"{productions.get(kind, 0):g}" for kind in ("compute", "reload", "extend"))
        admitted = point.admit_reasons.get("admitted", 0) / answered
        rows.append([*point_row(point, name)[:7], f"{admitted:.0%}", made, verdict(point)])
    header = (
        "mode", "measured/planned", "rank P50 ms", "rank P99 ms (95% CI)", "e2e P99 ms", "errors",
        "HBM / DRAM / ext / miss", "admitted", "compute / reload / extend", "SLO",
    )  # fmt: skip
    modes = "; ".join(f"`{m.name}`: {m.description}" for m in run.measured.modes.values())
    parts = [
        "## Experiment 4: ablations and hit rates by tier",
        f"RelayGR with one technique taken away, each swept over load on the mix `{ablations.universe}` "
        "(a fresh fleet each, except `no-revisit`, which is RelayGR's own fleet with a workload whose "
        "requests never revisit a user), starting from RelayGR's best load; their best loads are in "
        "experiment 2's table of that mix. Below, every mode's point at "
        f"{ablations.rate:g} req/s (the grid load at or below RelayGR's best, where every ablation's "
        "sweep starts), with the same users "
        "(`no-revisit` aside). `HBM / DRAM / ext / miss`: where "
        "each Rank's prefix came from (HBM: leased there by a PreInfer, computed or reloaded from DRAM; "
        "DRAM: reloaded on the Rank's own path; ext: a cached prefix extended with the events appended "
        "since; miss: computed on the Rank's path). `compute / reload / extend`: the rankers' prefix "
        "productions during the point, warm-up included.",
        f"![Hit rates by tier]({PLOTS['hits']})",
        table(header, rows),
        f"Modes: {modes}.",
    ]
    for name, sweep in ablations.sweeps.items():
        parts += _sweep_tables({name: sweep})
        if name in ablations.relay_beside:
            parts += [f"**relay, beside {name}** (in turns with it, on the same users)",
                      sweep_table(ablations.relay_beside[name], "rate")]  # fmt: skip
    return "\n\n".join(parts)


def _windows(run: Run) -> str:
    windows = run.measured.window_sensitivity
    if not windows:
        return ""
    baseline = run.measured.length_sweep.baseline.best
    main_window = f"{run.configuration.relay_window_ms:g}"
    sweeps = {main_window: run.measured.length_sweep.relay, **windows}
    rows = [
        (window, sweep.best, times(sweep.best / baseline if sweep.best and baseline else None))
        for window, sweep in sorted(sweeps.items(), key=lambda item: float(item[0]))
    ]
    return "\n\n".join([
        "## Relay-window sensitivity",
        "Experiment 1 for RelayGR at other relay windows (the baseline does not depend on it).",
        table(("relay window ms", "RelayGR's longest length", "ratio to the baseline"), rows),
    ])  # fmt: skip
