"""The benchmark's outputs: results.json, report.md and the PNG plots, all from the results dictionary.

`results.json` holds everything measured (every point, with its cost), the two headline ratios under
`throughput_ratio` and `length_ratio`, the machine, the versions and the configuration. `report.md` and
the plots are rendered from it alone (`render_markdown`, `plot_all`), so a results file can always be
rendered again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from services.common.contract import CACHE_SOURCES

PAPER_LENGTH_RATIO = 1.5
PAPER_THROUGHPUT_RATIO = 3.6
SOURCE_COLOURS = {"hbm": "#2b8a3e", "dram": "#1c7ed6", "extended": "#f59f00", "miss": "#c92a2a"}
MODE_STYLE = {"baseline": ("#495057", "s"), "relay": ("#1c7ed6", "o")}
PLOTS = {
    "length": "p99_vs_length.png",
    "load": "p99_vs_load.png",
    "hits": "hit_rates_by_tier.png",
    "floor": "where_time_goes.png",
}
# What every results.json has, at the top and in every measured point (`check` enforces it).
TOP_LEVEL_KEYS = (
    "name", "throughput_ratio", "length_ratio", "started_at", "duration_s", "machine", "versions",
    "configuration", "profile", "floor", "cached_rank", "length_sweep", "throughput_sweep",
    "window_sensitivity", "ablations", "modes", "fleet", "mix_universe",
)  # fmt: skip
MACHINE_KEYS = ("cores", "cpu_model", "memory_gib", "platform", "python")
VERSION_KEYS = ("torch", "git_commit")
POINT_KEYS = (
    "rate", "measured", "planned", "aborted", "errors", "violations", "rank_ms", "e2e_ms", "cache_sources",
    "meets_slo", "cost",
)  # fmt: skip
POINT_HEADER = (
    "measured/planned", "rank P50 ms", "rank P99 ms", "e2e P99 ms", "errors",
    "HBM / DRAM / ext / miss", "ranker cores", "foreign cores", "SLO",
)  # fmt: skip


def write(results: dict[str, Any], out_dir: Path) -> None:
    """Writes results.json, the plots and report.md into `out_dir`."""
    check(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    plot_all(results, out_dir)
    (out_dir / "report.md").write_text(render_markdown(results))


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
    need("throughput_sweep", results["throughput_sweep"], ("universe", "baseline", "relay"))
    sweeps = {f"{name}.{mode}": results[name][mode] for name in ("length_sweep", "throughput_sweep")
              for mode in ("baseline", "relay")}  # fmt: skip
    sweeps |= {
        f"window_sensitivity.{window}": sweep for window, sweep in results["window_sensitivity"].items()
    }
    for name, sweep in sweeps.items():
        need(name, sweep, ("points", "best", "at_grid_top"))
        for point in sweep["points"]:
            need(f"a point of {name}", point, POINT_KEYS)
    need("ablations", results["ablations"], ("rate", "points"))
    for name, point in results["ablations"]["points"].items():
        need(f"ablation {name}", point, POINT_KEYS)


# ---- reading the results ----


def ms(value: float | None) -> str:
    return "error" if value is None else f"{value:.1f}"


def times(value: float | None) -> str:
    return "n/a" if value is None else f"x{value:.2f}"


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
    return [
        first,
        f"{point['measured']}/{point['planned']}",
        ms(point["rank_ms"]["p50"]),
        ms(point["rank_ms"]["p99"]),
        ms(point["e2e_ms"]["p99"]),
        point["errors"],
        " / ".join(f"{share[s]:.0%}" for s in CACHE_SOURCES),
        f"{cores(point, rankers=True):.2f}",
        f"{point['cost']['foreign_cores']:.2f}",
        verdict(point),
    ]


def sweep_table(points: list[dict[str, Any]], key: str, title: str) -> str:
    rows = [point_row(p, p[key]) for p in sorted(points, key=lambda p: p[key])]
    return table((title, *POINT_HEADER), rows)


# ---- markdown ----


def render_markdown(results: dict[str, Any]) -> str:
    sections = [
        _introduction(results),
        _headline(results),
        _limits(results),
        _length_section(results),
        _throughput_section(results),
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
        f"{results['started_at']}, {results['duration_s'] / 60:.1f} minutes on {machine['cores']} cores "
        f"({machine['cpu_model']}), torch {versions['torch']}, preset `{c['model_preset']}`, "
        f"{c['rankers']} rankers with {c['torch_threads']} thread(s) each, "
        f"commit `{versions['git_commit']}`.\n\n"
        "**This ran on a CPU shared with other work: only the ratios between the two modes are "
        "meaningful, not the absolute latencies or loads.** Both modes ran the same fleet processes, "
        "model, user universe, seeds and load; the `foreign cores` columns show how much CPU other users "
        "of the machine took during each point."
    )


def _headline(results: dict[str, Any]) -> str:
    c = results["configuration"]
    length, load = results["length_sweep"], results["throughput_sweep"]
    slo, measured = c["slo_ms"], results["profile"]["measured"]

    def bound(sweep: dict[str, Any]) -> str:
        return (
            " (lower bound: RelayGR met the SLO at the grid's end)" if sweep["relay"]["at_grid_top"] else ""
        )

    rows = [
        (
            f"longest long-term length with ranking P99 ≤ {slo:g} ms at {length['rate']:g} req/s",
            length["baseline"]["best"],
            length["relay"]["best"],
            times(results["length_ratio"]) + bound(length),
            f"x{PAPER_LENGTH_RATIO}",
        ),
        (
            f"highest load (req/s) with ranking P99 ≤ {slo:g} ms and < {c['max_error_fraction']:.1%} errors "
            f"on the length mix",
            load["baseline"]["best"],
            load["relay"]["best"],
            times(results["throughput_ratio"]) + bound(load),
            f"x{PAPER_THROUGHPUT_RATIO}",
        ),
    ]
    violations = measured - math.ceil(0.99 * measured)
    return (
        "## Headline\n\n" + table(("", "baseline", "RelayGR", "ratio", "paper"), rows) + "\n\n"
        f"SLO: ranking-stage P99 ≤ {slo:g} ms, the Rank through the router as the retrieval stub sees it; "
        f"a failed request counts as a violation. Relay window (the stub's pre-processing delay): "
        f"{c['preprocess_delay_ms']:g} ms. Each point: {measured} measured requests after "
        f"{c['warmup_s']:g} s of warm-up, open-loop Poisson arrivals, latency from the intended send "
        f"time; the P99 is nearest-rank, so a point meets the SLO with at most {violations} of them over it. "
        f"Users: {c['revisit_probability']:.0%} of requests revisit a user seen in the last "
        f"{c['revisit_window_s']:g} s, the others are new users. Grids: lengths {c['lengths']}; loads "
        f"{c['loads']} req/s; each mode's value is the largest grid value that met the SLO."
    )


def _limit_line(results: dict[str, Any], sweep: dict[str, Any], mode: str, key: str, title: str) -> str:
    failure = first_failure(sweep[mode], key)
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
    for key, title, sweep in (
        ("long_term", "Length", results["length_sweep"]),
        ("rate", "Throughput", results["throughput_sweep"]),
    ):
        lines += [_limit_line(results, sweep, mode, key, title) for mode in ("baseline", "relay")]
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
        parts += [f"**{mode}**", sweep_table(sweep[mode]["points"], "long_term", "long-term length")]
    return "\n\n".join(parts)


def _throughput_section(results: dict[str, Any]) -> str:
    c, sweep = results["configuration"], results["throughput_sweep"]
    parts = [
        "## Experiment 2: SLO-compliant throughput",
        f"Length mix `{sweep['universe']}`: long-term lengths lognormal (median {c['mix_median']}, sigma "
        f"{c['mix_sigma']:g}), capped at {c['mix_max']} as production caps sequences to fit ranking's "
        "budget.",
        f"![P99 against load]({PLOTS['load']})",
    ]
    for mode in ("baseline", "relay"):
        parts += [f"**{mode}**", sweep_table(sweep[mode]["points"], "rate", "load req/s")]
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


def _ablations(results: dict[str, Any]) -> str:
    rate = results["ablations"]["rate"]
    rows = []
    for name, point in results["ablations"]["points"].items():
        productions = point["cost"]["rankers"].get("productions", {})
        answered = sum(point["admit_reasons"].values()) or 1
        made = " / ".join(f"{productions.get(kind, 0):g}" for kind in ("compute", "reload", "extend"))
        admitted = point["admit_reasons"].get("admitted", 0) / answered
        rows.append([*point_row(point, name)[:7], f"{admitted:.0%}", made, verdict(point)])
    header = (
        "mode", "measured/planned", "rank P50 ms", "rank P99 ms", "e2e P99 ms", "errors",
        "HBM / DRAM / ext / miss", "admitted", "compute / reload / extend", "SLO",
    )  # fmt: skip
    modes = "; ".join(f"`{m['name']}`: {m['description']}" for m in results["modes"].values())
    return "\n\n".join([
        "## Experiment 4: ablations and hit rates by tier",
        "RelayGR (its own fleet) and RelayGR with one technique taken away (a fresh fleet each), at "
        f"{rate:g} req/s (RelayGR's SLO-compliant throughput) on the mix, with the same users, new to every "
        "fleet. `HBM / DRAM / ext / miss`: where "
        "each Rank's prefix came from (HBM: leased there by a PreInfer, computed or reloaded from DRAM; "
        "DRAM: reloaded on the Rank's own path; ext: a cached prefix extended with the events appended "
        "since; miss: computed on the Rank's path). `compute / reload / extend`: the rankers' prefix "
        "productions during the point, warm-up included.",
        f"![Hit rates by tier]({PLOTS['hits']})",
        table(header, rows),
        f"Modes: {modes}.",
    ])  # fmt: skip


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
    length, load = results["length_sweep"], results["throughput_sweep"]
    length_title = f"Ranking P99 against length at {length['rate']:g} req/s"
    _plot_sweep(
        results, length, "long_term", "long-term length (events)", length_title, out_dir / PLOTS["length"]
    )
    load_title = f"Ranking P99 against load, mix {load['universe']}"
    _plot_sweep(
        results, load, "rate", "offered load (Recommend calls/s)", load_title, out_dir / PLOTS["load"]
    )
    _plot_hit_rates(results, out_dir / PLOTS["hits"])
    _plot_floor(results, out_dir / PLOTS["floor"])


def _plot_sweep(
    results: dict[str, Any], sweep: dict[str, Any], key: str, xlabel: str, title: str, path: Path
) -> None:
    slo = results["configuration"]["slo_ms"]
    cap = 5 * slo  # failed requests and far misses are drawn at the cap
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for mode in ("baseline", "relay"):
        colour, marker = MODE_STYLE[mode]
        points = sorted(sweep[mode]["points"], key=lambda p: p[key])
        xs = [p[key] for p in points]
        ys = [min(cap if p["rank_ms"]["p99"] is None else p["rank_ms"]["p99"], cap) for p in points]
        ax.plot(xs, ys, color=colour, marker=marker, label=f"{mode} (best {sweep[mode]['best']})")
        stopped = [(x, y) for x, y, p in zip(xs, ys, points, strict=True) if p["aborted"]]
        if stopped:
            ax.scatter(*zip(*stopped, strict=True), facecolors="white", edgecolors=colour, zorder=3, s=60)
    ax.axhline(slo, color="#c92a2a", linestyle="--", label=f"SLO {slo:g} ms")
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="ranking P99 (ms, capped)")
    ax.set_ylim(top=cap * 1.1)
    _plain_ticks(ax, sorted({p[key] for mode in ("baseline", "relay") for p in sweep[mode]["points"]}))
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
    points = results["ablations"]["points"]
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
