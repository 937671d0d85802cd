"""The benchmark's outputs: results.json, report.md and the PNG plots, all from the results dictionary.

`results.json` holds everything measured (every point, with its cost), the headline ratios under
`length_ratio`, `throughput_ratio` (the first mix) and `throughput_ratios` (every mix), the machine, the
versions and the configuration. `report.md` and the plots are rendered from it alone (`render_markdown`,
`plot_all`), so a results file can always be rendered again; `check` refuses one that lacks a key they
read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.probes import LOAD_GENERATOR
from services.common.contract import CACHE_SOURCES

PAPER_LENGTH_RATIO = 1.5
PAPER_THROUGHPUT_RATIO = 3.6
SOURCE_COLOURS = {"hbm": "#2b8a3e", "dram": "#1c7ed6", "extended": "#f59f00", "miss": "#c92a2a"}
MODE_STYLE = {
    "baseline": ("#495057", "s"),
    "relay": ("#1c7ed6", "o"),
    "admit-all": ("#f59f00", "^"),
    "dram-only": ("#0ca678", "v"),
    "no-affinity": ("#7048e8", "D"),
    "no-dram": ("#c92a2a", "X"),
    "no-revisit": ("#a0522d", "P"),
}
OTHER_MODE_STYLE = ("#868e96", ".")
PLOTS = {
    "length": "p99_vs_length.png",
    "load": "p99_vs_load.png",
    "hits": "hit_rates_by_tier.png",
    "floor": "where_time_goes.png",
}
# What every results.json has, at the top and in every measured point (`check` enforces it).
TOP_LEVEL_KEYS = (
    "name", "throughput_ratio", "throughput_ratios", "length_ratio", "started_at", "duration_s", "machine",
    "versions", "configuration", "profile", "floor", "cached_rank", "length_sweep", "throughput_sweeps",
    "abandonment", "window_sensitivity", "ablations", "modes", "fleet", "mix_universes",
)  # fmt: skip
MACHINE_KEYS = ("cores", "cpu_model", "memory_gib", "platform", "python")
VERSION_KEYS = ("torch", "git_commit")
SWEEP_KEYS = ("points", "best", "at_grid_top", "refined", "repeats", "seeds_agree")
MIX_KEYS = ("universe", "baseline", "relay", "ratio", "wasted_pre_infer_s", "device_s", "wasted_share")
FRACTION_KEYS = (
    "fraction", "sweeps", "baseline_best", "relay_best", "ratio", "wasted_pre_infer_s", "device_s",
    "wasted_share",
)  # fmt: skip
REPEAT_KEYS = ("role", "rate", "seeds", "rank_p99_ms", "meets_slo", "agree", "points")
POINT_KEYS = (
    "rate", "measured", "planned", "aborted", "abandoned", "errors", "violations", "rank_ms",
    "rank_p99_ci_ms", "e2e_ms", "cache_sources", "meets_slo", "cost",
)  # fmt: skip
ADMIT_ALL_HEADER = (
    "load req/s", "admit-all rank P99 ms (95% CI)", "RelayGR rank P99 ms (95% CI)", "RelayGR", "within noise",
)  # fmt: skip
# The services a point's CPU is split by (`cpu_service`), and issue 25's targets for RelayGR's best point,
# in ms of CPU per request.
CPU_SERVICES = ("rankers", "router", "trigger", "retrieval stub", "load generator")
CPU_TARGETS_MS = {"router": 0.6, "trigger": 0.4, "retrieval stub": 1.0}
POINT_HEADER = (
    "measured/planned", "rank P50 ms", "rank P99 ms (95% CI)", "e2e P99 ms", "errors",
    "HBM / DRAM / ext / miss", "ranker cores", "foreign cores", "SLO",
)  # fmt: skip


def write(results: dict[str, Any], out_dir: Path) -> None:
    """Writes results.json, the plots and report.md into `out_dir`."""
    check(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    plot_all(results, out_dir)
    (out_dir / "report.md").write_text(render_markdown(results))


def all_sweeps(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every sweep of a results dictionary by a name that says where it is."""
    sweeps = {f"length_sweep.{mode}": results["length_sweep"][mode] for mode in ("baseline", "relay")}
    for label, mix in results["throughput_sweeps"].items():
        sweeps |= {f"throughput_sweeps.{label}.{mode}": mix[mode] for mode in ("baseline", "relay")}
    for share, entry in results["abandonment"]["fractions"].items():
        for mode, sweep in (entry["sweeps"] or {}).items():
            sweeps[f"abandonment.{share}.{mode}"] = sweep
    sweeps |= {f"window_sensitivity.{w}": sweep for w, sweep in results["window_sensitivity"].items()}
    sweeps |= {f"ablations.{name}": sweep for name, sweep in results["ablations"]["sweeps"].items()}
    return sweeps


def check(results: dict[str, Any]) -> None:
    """ValueError naming the first key a results dictionary lacks."""

    def need(where: str, found: dict[str, Any], keys: Iterable[str]) -> None:
        missing = [key for key in keys if key not in found]
        if missing:
            raise ValueError(f"results: {where} lacks {', '.join(missing)}")

    need("the top level", results, TOP_LEVEL_KEYS)
    need("machine", results["machine"], MACHINE_KEYS)
    need("versions", results["versions"], VERSION_KEYS)
    need("length_sweep", results["length_sweep"], ("rate", "baseline", "relay"))
    if not results["throughput_sweeps"]:
        raise ValueError("results: throughput_sweeps has no mix")
    for label, mix in results["throughput_sweeps"].items():
        need(f"throughput_sweeps.{label}", mix, MIX_KEYS)
    need("abandonment", results["abandonment"], ("universe", "fractions"))
    for share, entry in results["abandonment"]["fractions"].items():
        need(f"abandonment.{share}", entry, FRACTION_KEYS)
        if entry["sweeps"] is not None:
            need(f"abandonment.{share}.sweeps", entry["sweeps"], ("baseline", "relay"))
    need("ablations", results["ablations"], ("universe", "rate", "sweeps"))
    for name, sweep in all_sweeps(results).items():
        need(name, sweep, SWEEP_KEYS)
        for point in sweep["points"]:
            need(f"a point of {name}", point, POINT_KEYS)
        for repeat in sweep["repeats"]:
            need(f"a repeat of {name}", repeat, REPEAT_KEYS)
            for point in repeat["points"]:
                need(f"a repeated point of {name}", point, POINT_KEYS)


# ---- reading the results ----


def ms(value: float | None) -> str:
    return "error" if value is None else f"{value:.1f}"


def times(value: float | None) -> str:
    return "n/a" if value is None else f"x{value:.2f}"


def bound_ms(value: float | None) -> str:
    """A confidence bound: None stands for an infinite one (failed requests decide it)."""
    return "∞" if value is None else f"{value:.1f}"


def p99_with_ci(point: dict[str, Any]) -> str:
    low, high = point["rank_p99_ci_ms"]
    return f"{ms(point['rank_ms']['p99'])} [{bound_ms(low)}, {bound_ms(high)}]"


def shares(counts: dict[str, int]) -> dict[str, float]:
    total = sum(counts.values())
    return {source: (counts.get(source, 0) / total if total else 0.0) for source in CACHE_SOURCES}


def verdict(point: dict[str, Any]) -> str:
    if point["meets_slo"]:
        return "meets"
    return "fails (stopped early)" if point["aborted"] else "fails"


def cores(point: dict[str, Any], rankers: bool) -> float:
    """Cores the rankers (or every other process of ours) used during a point."""
    cost = point["cost"]
    used = sum(s for name, s in cost["cpu_s"].items() if name.startswith("ranker") == rankers)
    return used / cost["wall_s"]


def cpu_service(process: str) -> str:
    """The service a process of the fleet belongs to: every ranker counts as `rankers`, every retrieval
    stub (a universe's own stub included) as `retrieval stub`."""
    if process.startswith("ranker"):
        return "rankers"
    if process.startswith("retrieval-stub"):
        return "retrieval stub"
    return "load generator" if process == LOAD_GENERATOR else process


def requests_sent(results: dict[str, Any], point: dict[str, Any]) -> int:
    """The requests a point sent, its warm-up's included (its cost covers both): the warm-up is the rate
    times the configured warm-up seconds, rounded as `bench.experiments` plans it."""
    return round(point["rate"] * results["configuration"]["warmup_s"]) + point["measured"]


def cpu_ms_per_request(results: dict[str, Any], point: dict[str, Any]) -> dict[str, float]:
    """Ms of CPU per request sent by each service of `CPU_SERVICES`, and `total` over every process of
    ours."""
    seconds = dict.fromkeys(CPU_SERVICES, 0.0)
    for process, used in point["cost"]["cpu_s"].items():
        service = cpu_service(process)
        seconds[service] = seconds.get(service, 0.0) + used
    seconds["total"] = sum(point["cost"]["cpu_s"].values())
    sent = requests_sent(results, point)
    return {service: 1000 * used / sent for service, used in seconds.items()}


def cores_needed(results: dict[str, Any], point: dict[str, Any]) -> float:
    """Cores our fleet needs at a point's offered load: its CPU per request times the load."""
    return cpu_ms_per_request(results, point)["total"] / 1000 * point["rate"]


def core_count(results: dict[str, Any]) -> int | None:
    """The machine's core count as the run recorded it (os.cpu_count(); None when it recorded none)."""
    count = results["machine"].get("cores")
    return count if isinstance(count, int) and count > 0 else None


def best_points(sweeps: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
    """Each mode's point at its best load (None where it met the SLO at no load)."""
    return {mode: point_at(sweep, "rate", sweep["best"]) for mode, sweep in sweeps.items()}


def point_at(sweep: dict[str, Any], key: str, value: float | None) -> dict[str, Any] | None:
    """The sweep's point measured at `value` (None when it measured none there)."""
    return next((p for p in sweep["points"] if value is not None and p[key] == value), None)


def first_failure(sweep: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The failing point just above the best one (what stopped the sweep)."""
    best = sweep["best"]
    above = [p for p in sweep["points"] if not p["meets_slo"] and (best is None or p[key] > best)]
    return min(above, key=lambda p: p[key]) if above else None


def table(header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(str(cell) for cell in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def point_row(point: dict[str, Any], first: Any) -> list[Any]:
    share = shares(point["cache_sources"])
    sent = f"{point['measured']}/{point['planned']}"
    if point["abandoned"]:
        sent += f" ({point['abandoned']} abandoned)"
    return [
        first,
        sent,
        ms(point["rank_ms"]["p50"]),
        p99_with_ci(point),
        ms(point["e2e_ms"]["p99"]),
        point["errors"],
        " / ".join(f"{share[s]:.0%}" for s in CACHE_SOURCES),
        f"{cores(point, rankers=True):.2f}",
        f"{point['cost']['foreign_cores']:.2f}",
        verdict(point),
    ]


def sweep_table(sweep: dict[str, Any], key: str, title: str) -> str:
    refined = set(sweep.get("refined", ()))
    rows = [
        point_row(p, f"{p[key]:g} (refined)" if p[key] in refined else f"{p[key]:g}")
        for p in sorted(sweep["points"], key=lambda p: p[key])
    ]
    return table((title, *POINT_HEADER), rows)


def load_modes(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The first mix's load sweep of every mode: the baseline, RelayGR and each ablation."""
    first = next(iter(results["throughput_sweeps"].values()))
    return {"baseline": first["baseline"], "relay": first["relay"], **results["ablations"]["sweeps"]}


# ---- markdown ----


def render_markdown(results: dict[str, Any]) -> str:
    sections = [
        _introduction(results),
        _headline(results),
        _against_no_relay_and_admit_all(results),
        _limits(results),
        _length_section(results),
        _throughput_section(results),
        _abandonment(results),
        _where_time_goes(results),
        _ablations(results),
        _windows(results),
        _machine(results),
    ]
    return "\n\n".join(section for section in sections if section) + "\n"


def _introduction(results: dict[str, Any]) -> str:
    c, machine, versions = results["configuration"], results["machine"], results["versions"]
    return (
        f"# RelayGR benchmark: `{results['name']}` ({c['profile']} profile)\n\n"
        f"{results['started_at']}, {results['duration_s'] / 60:.1f} minutes on "
        f"{_machine_cores(results)} cores ({machine['cpu_model']}), torch {versions['torch']}, "
        f"preset `{c['model_preset']}`, {c['rankers']} rankers with {c['torch_threads']} thread(s) each, "
        f"commit `{versions['git_commit']}`.\n\n"
        "**This ran on a CPU shared with other work: only the ratios between the modes are "
        "meaningful, not the absolute latencies or loads.** Every mode ran the same fleet processes, "
        "model, user universe, seeds and load; the `foreign cores` columns show how much CPU other users "
        "of the machine took during each point."
    )


def _headline(results: dict[str, Any]) -> str:
    c = results["configuration"]
    length = results["length_sweep"]
    slo, measured = c["slo_ms"], results["profile"]["measured"]

    rows = [
        (
            f"longest long-term length with ranking P99 ≤ {slo:g} ms at {length['rate']:g} req/s",
            best_cell(length["baseline"]),
            best_cell(length["relay"]),
            ratio_cell(results["length_ratio"], length, "long_term", "events"),
            f"x{PAPER_LENGTH_RATIO}",
        )
    ]
    rows += [
        (
            f"highest load (req/s) with ranking P99 ≤ {slo:g} ms and < {c['max_error_fraction']:.1%} errors "
            f"on the mix `{label}`",
            best_cell(mix["baseline"]),
            best_cell(mix["relay"]),
            ratio_cell(mix["ratio"], mix, "rate", "req/s"),
            f"x{PAPER_THROUGHPUT_RATIO}",
        )
        for label, mix in results["throughput_sweeps"].items()
    ]
    violations = measured - math.ceil(0.99 * measured)
    return (
        "## Headline\n\n" + table(("", "baseline", "RelayGR", "ratio", "paper"), rows) + "\n\n"
        f"SLO: ranking-stage P99 ≤ {slo:g} ms, the Rank through the router as the retrieval stub sees it; "
        f"a failed request counts as a violation. Relay window (the stub's pre-processing delay): "
        f"{c['preprocess_delay_ms']:g} ms. Each point: {measured} measured requests after "
        f"{c['warmup_s']:g} s of warm-up, open-loop Poisson arrivals, latency from the intended send "
        f"time; the P99 is nearest-rank, so a point meets the SLO with at most {violations} of them over it, "
        "and comes with its bootstrap 95% confidence interval. "
        f"Users: {c['revisit_probability']:.0%} of requests revisit a user seen in the last "
        f"{c['revisit_window_s']:g} s, the others are new users. Grids: lengths {c['lengths']}; loads "
        f"{c['loads']} req/s; each mode's value is the largest value that met the SLO, loads refined by "
        f"{results['profile']['refine_steps']} bisection(s) between grid values."
    )


def best_cell(sweep: dict[str, Any]) -> str:
    return "none" if sweep["best"] is None else f"{sweep['best']:g}"


def ratio_cell(ratio: float | None, pair: dict[str, Any], key: str, unit: str) -> str:
    """A headline ratio, said as the bound it is where a sweep ran off its grid: RelayGR met the SLO at
    the grid's end (the ratio is at least this), or the baseline met it nowhere (at least RelayGR's best
    over the lowest value the baseline failed at)."""
    relay, baseline = pair["relay"], pair["baseline"]
    if ratio is None and baseline["best"] is None and relay["best"] is not None and baseline["points"]:
        lowest = min(p[key] for p in baseline["points"])
        return (
            f"> x{relay['best'] / lowest:.2f} (the baseline met the SLO nowhere; it failed even at "
            f"{lowest:g} {unit})"
        )
    at_top = " (lower bound: RelayGR met the SLO at the grid's end)" if relay["at_grid_top"] else ""
    return times(ratio) + at_top


def within_noise(relay: dict[str, Any] | None, other: dict[str, Any]) -> bool:
    """Whether RelayGR's point is as good as another mode's passing one within the measurement's noise:
    it meets the SLO too, or its P99's 95% interval reaches into the other's."""
    if relay is None:
        return False
    if relay["meets_slo"]:
        return True
    low, _ = relay["rank_p99_ci_ms"]
    _, other_high = other["rank_p99_ci_ms"]
    return low is not None and (other_high is None or low <= other_high)


def _against_no_relay_and_admit_all(results: dict[str, Any]) -> str:
    """RelayGR on the first mix against the strongest no-relay serving (`dram-only`) and against admitting
    every request (`admit-all`), the two comparisons the trigger is judged by."""
    label, mix = next(iter(results["throughput_sweeps"].items()))
    relay, sweeps = mix["relay"], results["ablations"]["sweeps"]
    parts = ["## RelayGR against the strongest no-relay serving and against admitting everything"]
    dram_only = sweeps.get("dram-only")
    if dram_only is not None:
        ratio = relay["best"] / dram_only["best"] if relay["best"] and dram_only["best"] else None
        pair = {"relay": relay, "baseline": dram_only}
        parts.append(
            "`baseline` computes every Rank's whole sequence on its critical path. The strongest serving "
            "without relay that this code can do is `dram-only`: the rankers keep their DRAM tier, so a "
            "revisit reloads or extends the prefix its last Rank computed, and only new users' prefixes "
            f"are computed on the Rank's path. On the mix `{label}` it met the SLO up to "
            f"{'no load' if dram_only['best'] is None else format(dram_only['best'], 'g') + ' req/s'}, "
            f"RelayGR up to {relay['best']:g} req/s: {ratio_cell(ratio, pair, 'rate', 'req/s')}."
        )
    admit_all = sweeps.get("admit-all")
    if admit_all is not None:
        rows = []
        for point in sorted((p for p in admit_all["points"] if p["meets_slo"]), key=lambda p: p["rate"]):
            mine = point_at(relay, "rate", point["rate"])
            if mine is None and relay["best"] is not None and point["rate"] <= relay["best"]:
                cells, noise = ["not measured", f"meets (it met the SLO at {relay['best']:g})"], "yes"
            else:
                found = mine is not None
                cells = [p99_with_ci(mine) if found else "not measured", verdict(mine) if found else ""]
                noise = "yes" if within_noise(mine, point) else "**no**"
            rows.append([f"{point['rate']:g}", p99_with_ci(point), *cells, noise])
        parts += [
            "Against `admit-all` (the trigger admits every request: no gain test, no brakes), at every "
            "load where admit-all met the SLO: RelayGR is within noise there when it meets the SLO too or "
            "its P99's 95% interval reaches into admit-all's.",
            table(ADMIT_ALL_HEADER, rows),
        ]
    return "\n\n".join(parts) if len(parts) > 1 else ""


def _limit_line(results: dict[str, Any], sweep: dict[str, Any], mode: str, key: str, title: str) -> str:
    failure = first_failure(sweep, key)
    if failure is None:
        return f"- {title}, {mode}: no point above its best failed; the grid ends there."
    counters = failure["cost"]["rankers"]
    unit = "events" if key == "long_term" else "req/s"
    text = (
        f"- {title}, {mode}: at {failure[key]:g} {unit} the ranking P99 was {ms(failure['rank_ms']['p99'])} "
        f"ms (P50 {ms(failure['rank_ms']['p50'])} ms, {failure['errors']} errors); the rankers used "
        f"{cores(failure, rankers=True):.2f} cores, our other processes {cores(failure, rankers=False):.2f}, "
        f"other users of the machine {failure['cost']['foreign_cores']:.2f}."
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
        floor = [p for p in results["floor"] if p["prefix_length"] == failure[key]]
        if key == "long_term" and floor:
            text += (
                f" In-process, pre-inferring {failure[key]} events takes {floor[0]['pre_infer_ms']:.0f} ms, "
                f"against a relay window of {results['configuration']['preprocess_delay_ms']:g} ms."
            )
    return text


def _limits(results: dict[str, Any]) -> str:
    lines = ["## What stopped each mode (measured at the first failing point)", ""]
    pairs = [("long_term", "Length", results["length_sweep"])]
    pairs += [("rate", f"Throughput on `{name}`", mix) for name, mix in results["throughput_sweeps"].items()]
    for key, title, sweeps in pairs:
        lines += [_limit_line(results, sweeps[mode], mode, key, title) for mode in ("baseline", "relay")]
    return "\n".join(lines)


def _length_section(results: dict[str, Any]) -> str:
    c, sweep = results["configuration"], results["length_sweep"]
    parts = [
        "## Experiment 1: longest sequence under the SLO",
        f"Every user has the same long-term length (plus {c['short_term']} short-term events); offered "
        f"load {sweep['rate']:g} req/s.",
        f"![P99 against length]({PLOTS['length']})",
    ]
    for mode in ("baseline", "relay"):
        parts += [f"**{mode}**", sweep_table(sweep[mode], "long_term", "long-term length")]
    return "\n\n".join(parts)


def _results_table(results: dict[str, Any], sweeps: dict[str, dict[str, Any]]) -> str:
    """Each mode's best load, its P99 there with the CI, the failure above it and the seeds' agreement."""
    baseline = sweeps["baseline"]["best"]
    rows = []
    for mode, sweep in sweeps.items():
        best, failure = point_at(sweep, "rate", sweep["best"]), first_failure(sweep, "rate")
        agree = {None: "", True: "yes", False: "**no**"}[sweep["seeds_agree"]]
        rows.append([
            mode,
            "none" if sweep["best"] is None else f"{sweep['best']:g}" + ("+" if sweep["at_grid_top"] else ""),
            times(sweep["best"] / baseline if sweep["best"] is not None and baseline else None),
            p99_with_ci(best) if best else "",
            f"{failure['rate']:g}" if failure else "",
            p99_with_ci(failure) if failure else "",
            agree,
        ])  # fmt: skip
    header = (
        "mode", "best load req/s", "to the baseline", "rank P99 at best ms (95% CI)", "first failing load",
        "its rank P99 ms (95% CI)", "every seed agrees",
    )  # fmt: skip
    return table(header, rows)


def _repeats_table(sweeps: dict[str, dict[str, Any]]) -> str:
    rows = []
    for mode, sweep in sweeps.items():
        for repeat in sweep["repeats"]:
            rows.append([
                mode, repeat["role"].replace("_", " "), f"{repeat['rate']:g}",
                ", ".join(str(seed) for seed in repeat["seeds"]),
                ", ".join(ms(p99) for p99 in repeat["rank_p99_ms"]),
                ", ".join("meets" if ok else "fails" for ok in repeat["meets_slo"]),
                "yes" if repeat["agree"] else "**no**",
            ])  # fmt: skip
    if not rows:
        return ""
    header = ("mode", "point", "load req/s", "load seeds", "rank P99 ms per seed", "verdicts", "agree")
    return "Verdict points measured again with other load seeds (other users and arrivals):\n\n" + table(
        header, rows
    )


def _throughput_section(results: dict[str, Any]) -> str:
    c = results["configuration"]
    parts = [
        "## Experiment 2: SLO-compliant throughput",
        f"Length mixes: long-term lengths lognormal (sigma {c['mix_sigma']:g}), capped as production caps "
        "sequences to fit ranking's budget. `+`: the best is the grid's last value (a lower bound). "
        "The ablations (experiment 4) ran on the first mix only.",
        "CPU per request, at each mode's best load: every process's CPU seconds over the point (user + "
        "system, from /proc) divided by the requests it sent. The CPU is read around the whole point, "
        f"warm-up included, so the requests are the warm-up's ({c['warmup_s']:g} s at the point's rate) "
        "plus the measured ones (abandoned ones included). The targets are issue 25's for RelayGR's best "
        "point. The machine's ceiling: the cores our whole fleet needs at that load (its CPU per request "
        f"times the offered load) against the machine's {_machine_cores(results)} cores, beside the cores "
        "it used as measured (CPU seconds over the point's wall time) and those other users of the machine "
        "took.",
    ]
    for number, (label, mix) in enumerate(results["throughput_sweeps"].items()):
        sweeps = {"baseline": mix["baseline"], "relay": mix["relay"]}
        if number == 0:
            sweeps |= results["ablations"]["sweeps"]
        parts += [f"### Mix `{label}`", _results_table(results, sweeps)]
        if number == 0:
            parts.append(f"![P99 against load]({PLOTS['load']})")
        parts += [_cpu_per_request_table(results, sweeps), _ceiling_table(results, sweeps)]
        repeats = _repeats_table({"baseline": mix["baseline"], "relay": mix["relay"]})
        if repeats:
            parts.append(repeats)
        for mode in ("baseline", "relay"):
            parts += [f"**{mode}**", sweep_table(mix[mode], "rate", "load req/s")]
    return "\n\n".join(parts)


def _machine_cores(results: dict[str, Any]) -> str:
    count = core_count(results)
    return "unknown" if count is None else str(count)


def _at_best_table(
    sweeps: dict[str, dict[str, Any]], header: Sequence[str], cells: Callable[[dict[str, Any]], list[Any]]
) -> str:
    """A row for each mode's best point: the mode, the load and `cells` of the point (`none` and blanks
    where the mode met the SLO at no load)."""
    blanks = [""] * (len(header) - 2)
    rows = [
        [mode, "none", *blanks] if point is None else [mode, f"{point['rate']:g}", *cells(point)]
        for mode, point in best_points(sweeps).items()
    ]
    return table(header, rows)


def _cpu_per_request_table(results: dict[str, Any], sweeps: dict[str, dict[str, Any]]) -> str:
    targets = [f" (target ≤ {CPU_TARGETS_MS[s]:g})" if s in CPU_TARGETS_MS else "" for s in CPU_SERVICES]
    header = (
        "mode", "best load req/s", "requests (warm-up included)",
        *(f"{service} ms{target}" for service, target in zip(CPU_SERVICES, targets, strict=True)), "total ms",
    )  # fmt: skip

    def cells(point: dict[str, Any]) -> list[Any]:
        used = cpu_ms_per_request(results, point)
        return [requests_sent(results, point), *(f"{used[c]:.2f}" for c in (*CPU_SERVICES, "total"))]

    return "CPU per request at each mode's best load, ms:\n\n" + _at_best_table(sweeps, header, cells)


def _ceiling_table(results: dict[str, Any], sweeps: dict[str, dict[str, Any]]) -> str:
    count = core_count(results)
    header = (
        "mode", "best load req/s", "fleet CPU ms/request", "cores needed (CPU/request x load)",
        "of the machine's cores", "cores used, measured", "foreign cores", "needed + foreign, of the machine",
    )  # fmt: skip

    def cells(point: dict[str, Any]) -> list[Any]:
        needed, foreign = cores_needed(results, point), point["cost"]["foreign_cores"]
        return [
            f"{cpu_ms_per_request(results, point)['total']:.2f}", f"{needed:.2f}",
            _share(needed / count if count else None),
            f"{cores(point, rankers=True) + cores(point, rankers=False):.2f}", f"{foreign:.2f}",
            _share((needed + foreign) / count if count else None),
        ]  # fmt: skip

    title = f"The machine's ceiling ({_machine_cores(results)} cores) at each mode's best load:\n\n"
    return title + _at_best_table(sweeps, header, cells)


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _abandonment(results: dict[str, Any]) -> str:
    abandonment = results["abandonment"]
    fractions = abandonment["fractions"]
    if not fractions:
        return ""
    rows = []
    for entry in fractions.values():
        rows.append([
            f"{entry['fraction']:.0%}", entry["baseline_best"], entry["relay_best"], times(entry["ratio"]),
            f"{entry['wasted_pre_infer_s']:.1f}", _share(entry["wasted_share"]),
        ])  # fmt: skip
    header = (
        "abandoned", "baseline best req/s", "RelayGR best req/s", "ratio", "wasted pre-infer device s",
        "share of the rankers' device time",
    )  # fmt: skip
    parts = [
        "## Abandonment: pre-inference that no Rank consumes",
        f"On the mix `{abandonment['universe']}`, a share of the requests is filtered upstream after "
        "retrieval: the stub still runs retrieval and, with the relay, the Admit (so the trigger may "
        "pre-infer a prefix), but sends no Rank. Which requests are abandoned is a hash of (universe seed, "
        "user, request time). Loads count every Recommend; a point's verdict is over the Ranks that "
        "happened. Wasted pre-infer device seconds: RelayGR's rankers' device time on prefixes no Rank "
        "consumed, over the whole pair of sweeps (at 0%: the first mix's throughput sweeps, their repeats "
        "included), read after the rankers' lease ran out; the share is of the rankers' device-thread "
        "seconds over the same time.",
        table(header, rows),
    ]
    for share, entry in fractions.items():
        for mode, sweep in (entry["sweeps"] or {}).items():
            parts += [f"**{mode}, {float(share):.0%} abandoned**", sweep_table(sweep, "rate", "load req/s")]
    return "\n\n".join(parts)


def _where_time_goes(results: dict[str, Any]) -> str:
    cached = {p["prefix_length"]: p for p in results["cached_rank"]}
    rows = []
    for p in results["floor"]:
        row = [
            p["prefix_length"], f"{p['full_ms']:.1f}", f"{p['pre_infer_ms']:.1f}", f"{p['rank_ms']:.1f}",
            f"x{(p['pre_infer_ms'] + p['rank_ms']) / p['rank_ms']:.0f}",
        ]  # fmt: skip
        through = cached.get(p["prefix_length"])
        if through is None or through["rank_ms_p50"] is None:  # not measured, or never served from HBM
            row += ["", "", "", through["request_kib"] if through else ""]
        else:
            p50 = through["rank_ms_p50"]
            row += [ms(p50), ms(through["rank_ms_p99"]), f"{p50 - p['rank_ms']:+.1f}", through["request_kib"]]
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


def hit_rate_points(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """RelayGR's point and each ablation's at the ablations' rate (the grid load at or below RelayGR's
    best on the first mix, where every one of their sweeps starts)."""
    rate = results["ablations"]["rate"]
    modes = {name: sweep for name, sweep in load_modes(results).items() if name != "baseline"}
    found = {name: point_at(sweep, "rate", rate) for name, sweep in modes.items()}
    return {name: point for name, point in found.items() if point is not None}


def _ablations(results: dict[str, Any]) -> str:
    ablations = results["ablations"]
    rows = []
    for name, point in hit_rate_points(results).items():
        productions = point["cost"]["rankers"].get("productions", {})
        answered = sum(point["admit_reasons"].values()) or 1
        made = " / ".join(f"{productions.get(kind, 0):g}" for kind in ("compute", "reload", "extend"))
        admitted = point["admit_reasons"].get("admitted", 0) / answered
        rows.append([*point_row(point, name)[:7], f"{admitted:.0%}", made, verdict(point)])
    header = (
        "mode", "measured/planned", "rank P50 ms", "rank P99 ms (95% CI)", "e2e P99 ms", "errors",
        "HBM / DRAM / ext / miss", "admitted", "compute / reload / extend", "SLO",
    )  # fmt: skip
    modes = "; ".join(f"`{m['name']}`: {m['description']}" for m in results["modes"].values())
    parts = [
        "## Experiment 4: ablations and hit rates by tier",
        f"RelayGR with one technique taken away, each swept over load on the mix `{ablations['universe']}` "
        "(a fresh fleet each, except `no-revisit`, which is RelayGR's own fleet with a workload whose "
        "requests never revisit a user), starting from RelayGR's best load; their best loads are in "
        "experiment 2's table of that mix. Below, every mode's point at "
        f"{ablations['rate']:g} req/s (the grid load at or below RelayGR's best, where every ablation's "
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
    for name, sweep in ablations["sweeps"].items():
        parts += [f"**{name}**", sweep_table(sweep, "rate", "load req/s")]
    return "\n\n".join(parts)


def _windows(results: dict[str, Any]) -> str:
    windows = results["window_sensitivity"]
    if not windows:
        return ""
    baseline = results["length_sweep"]["baseline"]["best"]
    main_window = f"{results['configuration']['preprocess_delay_ms']:g}"
    sweeps = {main_window: results["length_sweep"]["relay"], **windows}
    rows = [
        (window, sweep["best"], times(sweep["best"] / baseline if sweep["best"] and baseline else None))
        for window, sweep in sorted(sweeps.items(), key=lambda item: float(item[0]))
    ]
    return "\n\n".join([
        "## Relay-window sensitivity",
        "Experiment 1 for RelayGR at other relay windows (the baseline does not depend on it).",
        table(("relay window ms", "RelayGR's longest length", "ratio to the baseline"), rows),
    ])  # fmt: skip


def _machine(results: dict[str, Any]) -> str:
    described = json.dumps({"machine": results["machine"], "versions": results["versions"]}, indent=1)
    return (
        f"## Machine and versions\n\n```\n{described}\n```\n\n"
        "The configuration, every point and what it cost the fleet are in `results.json`."
    )


# ---- plots ----


def plot_all(results: dict[str, Any], out_dir: Path) -> None:
    length = results["length_sweep"]
    length_title = f"Ranking P99 against length at {length['rate']:g} req/s"
    modes = {mode: length[mode] for mode in ("baseline", "relay")}
    _plot_sweeps(
        results, modes, "long_term", "long-term length (events)", length_title, out_dir / PLOTS["length"]
    )
    load_title = f"Ranking P99 against load, mix {next(iter(results['throughput_sweeps']))}"
    _plot_sweeps(
        results, load_modes(results), "rate", "offered load (Recommend calls/s)", load_title,
        out_dir / PLOTS["load"],
    )  # fmt: skip
    _plot_hit_rates(results, out_dir / PLOTS["hits"])
    _plot_floor(results, out_dir / PLOTS["floor"])


def _plot_sweeps(
    results: dict[str, Any],
    sweeps: dict[str, dict[str, Any]],
    key: str,
    xlabel: str,
    title: str,
    path: Path,
) -> None:
    slo = results["configuration"]["slo_ms"]
    cap = 5 * slo  # failed requests and far misses are drawn at the cap
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for mode, sweep in sweeps.items():
        colour, marker = MODE_STYLE.get(mode, OTHER_MODE_STYLE)
        points = sorted(sweep["points"], key=lambda p: p[key])
        xs = [p[key] for p in points]
        ys = [min(cap if p["rank_ms"]["p99"] is None else p["rank_ms"]["p99"], cap) for p in points]
        ax.plot(xs, ys, color=colour, marker=marker, label=f"{mode} (best {sweep['best']})")
        stopped = [(x, y) for x, y, p in zip(xs, ys, points, strict=True) if p["aborted"]]
        if stopped:
            ax.scatter(*zip(*stopped, strict=True), facecolors="white", edgecolors=colour, zorder=3, s=60)
    ax.axhline(slo, color="#c92a2a", linestyle="--", label=f"SLO {slo:g} ms")
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="ranking P99 (ms, capped)")
    ax.set_ylim(top=cap * 1.1)
    on_grid = {p[key] for sweep in sweeps.values() for p in sweep["points"] if p[key] not in sweep["refined"]}
    _plain_ticks(ax, sorted(on_grid))
    ax.set_title(
        f"{title}\nhollow: stopped early (P99 of the requests sent); CPU: compare ratios only", fontsize=9
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plain_ticks(ax: plt.Axes, xs: Sequence[float]) -> None:
    """Log axes labelled with plain numbers: the measured x values, and 1-2-5 steps of ms."""
    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _plot_hit_rates(results: dict[str, Any], path: Path) -> None:
    points = hit_rate_points(results)
    names = list(points)
    fig, ax = plt.subplots(figsize=(8, 4))
    bottoms = [0.0] * len(names)
    for source in CACHE_SOURCES:
        heights = [shares(points[name]["cache_sources"])[source] for name in names]
        ax.bar(names, heights, bottom=bottoms, color=SOURCE_COLOURS[source], label=source)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_ylabel("share of Ranks")
    ax.set_title(f"Where each Rank's prefix came from, {results['ablations']['rate']:g} req/s on the mix")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_floor(results: dict[str, Any], path: Path) -> None:
    floor = results["floor"]
    xs = [p["prefix_length"] for p in floor]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    lines = (
        ("full_ms", "full forward", "#495057"),
        ("pre_infer_ms", "pre-infer", "#f59f00"),
        ("rank_ms", "cached rank (the floor)", "#2b8a3e"),
    )
    for key, label, colour in lines:
        ax.plot(xs, [p[key] for p in floor], marker="o", color=colour, label=f"in-process {label}")
    cached = [p for p in results["cached_rank"] if p["rank_ms_p50"] is not None]
    ax.plot([p["prefix_length"] for p in cached], [p["rank_ms_p50"] for p in cached], marker="^",
            color="#1c7ed6", label="cached Rank through the router (P50)")  # fmt: skip
    ax.axhline(results["configuration"]["slo_ms"], color="#c92a2a", linestyle="--", label="SLO")
    ax.set(xlabel="long-term length (events)", ylabel="latency (ms)", xscale="log", yscale="log")
    _plain_ticks(ax, xs)
    ax.set_title("Where the time goes (CPU: compare ratios only)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
