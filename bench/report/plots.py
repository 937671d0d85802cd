"""The reports' PNG plots: ranking P99 against length and against load (each mode's sweep), each mode's
capacity against the SLO, where each Rank's prefix came from at the ablations' rate, and where the time
goes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.lib.schema import Run, Sweep
from bench.report.figures import SHOWN_SOURCES, hit_rate_points, load_modes, shares
from bench.report.verdicts import CAPACITY_PLOT, capacity_rows

SOURCE_COLOURS = {
    "hbm": "#2b8a3e",
    "dram": "#1c7ed6",
    "peer": "#7048e8",
    "extended": "#f59f00",
    "miss": "#c92a2a",
}
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


def plot_all(run: Run, out_dir: Path) -> None:
    length, slo = run.measured.length_sweep, run.configuration.slo_ms
    modes = {"baseline": length.baseline, "relay": length.relay}
    title = f"Ranking P99 against length at {length.rate:g} req/s"
    plot_sweeps(modes, "long_term", title, out_dir / PLOTS["length"], slo)
    title = f"Ranking P99 against load, mix {run.first_mix[0]}"
    plot_sweeps(load_modes(run), "rate", title, out_dir / PLOTS["load"], slo)
    plot_capacity(run, out_dir / CAPACITY_PLOT)
    _plot_hit_rates(run, out_dir / PLOTS["hits"])
    _plot_floor(run, out_dir / PLOTS["floor"])


def plot_sweeps(sweeps: dict[str, Sweep], key: str, title: str, path: Path, slo: float) -> None:
    """Each mode's sweep's P99 against `key` (`long_term`, `rate`) and the SLO, `slo` ms."""
    cap = 5 * slo  # failed requests and far misses are drawn at the cap
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for mode, sweep in sweeps.items():
        colour, marker = MODE_STYLE.get(mode, OTHER_MODE_STYLE)
        points = sorted(sweep.points, key=lambda p: getattr(p, key))
        xs = [getattr(p, key) for p in points]
        ys = [min(cap if p.rank_ms.p99 is None else p.rank_ms.p99, cap) for p in points]
        ax.plot(xs, ys, color=colour, marker=marker, label=f"{mode} (best {sweep.best})")
        stopped = [(x, y) for x, y, p in zip(xs, ys, points, strict=True) if p.aborted]
        if stopped:
            ax.scatter(*zip(*stopped, strict=True), facecolors="white", edgecolors=colour, zorder=3, s=60)
    ax.axhline(slo, color="#c92a2a", linestyle="--", label=f"SLO {slo:g} ms")
    xlabel = "long-term length (events)" if key == "long_term" else "offered load (Recommend calls/s)"
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="ranking P99 (ms, capped)")
    ax.set_ylim(top=cap * 1.1)
    on_grid = {
        getattr(p, key)
        for sweep in sweeps.values()
        for p in sweep.points
        if getattr(p, key) not in sweep.refined
    }
    _plain_ticks(ax, sorted(on_grid))
    ax.set_title(
        f"{title}\nhollow: stopped early (P99 of the requests sent); CPU: compare ratios only", fontsize=9
    )
    _save(fig, ax, path)


def _save(fig: plt.Figure, ax: plt.Axes, path: Path, grid: bool = True, **legend: object) -> None:
    ax.legend(fontsize=8, **legend)
    if grid:
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


def _plot_hit_rates(run: Run, path: Path) -> None:
    points = hit_rate_points(run)
    names = list(points)
    fig, ax = plt.subplots(figsize=(8, 4))
    bottoms = [0.0] * len(names)
    for source in SHOWN_SOURCES:
        heights = [shares(points[name].cache_sources)[source] for name in names]
        ax.bar(names, heights, bottom=bottoms, color=SOURCE_COLOURS[source], label=source)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_ylabel("share of Ranks")
    ax.set_title(f"Where each Rank's prefix came from, {run.measured.ablations.rate:g} req/s on the mix")
    _save(fig, ax, path, grid=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _plot_floor(run: Run, path: Path) -> None:
    floor = run.measured.floor
    xs = [p.prefix_length for p in floor]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    lines = (
        ("full_ms", "full forward", "#495057"),
        ("pre_infer_ms", "pre-infer", "#f59f00"),
        ("rank_ms", "cached rank (the floor)", "#2b8a3e"),
    )
    for key, label, colour in lines:
        ax.plot(xs, [getattr(p, key) for p in floor], marker="o", color=colour, label=f"in-process {label}")
    cached = [p for p in run.measured.cached_rank if p.rank_ms_p50 is not None]
    ax.plot([p.prefix_length for p in cached], [p.rank_ms_p50 for p in cached], marker="^",
            color="#1c7ed6", label="cached Rank through the router (P50)")  # fmt: skip
    ax.axhline(run.configuration.slo_ms, color="#c92a2a", linestyle="--", label="SLO")
    ax.set(xlabel="long-term length (events)", ylabel="latency (ms)", xscale="log", yscale="log")
    _plain_ticks(ax, xs)
    ax.set_title("Where the time goes (CPU: compare ratios only)")
    _save(fig, ax, path)


def plot_capacity(run: Run, path: Path) -> None:
    """Each mode's capacity against the SLO multiple, its bracket as an error bar (none: no plot)."""
    rows = capacity_rows(run)
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for mode, colour, field in (("baseline", "#868e96", "baseline"), ("RelayGR", "#1c7ed6", "relay")):
        passed = [(row.multiple, getattr(row, field)) for row in rows if getattr(row, field).best is not None]
        xs, ys = [x for x, _ in passed], [sweep.best for _, sweep in passed]
        highs = [(s.best if s.first_failure is None else s.first_failure) - s.best for _, s in passed]
        ax.errorbar(xs, ys, yerr=[[0.0] * len(xs), highs], color=colour, marker="o", capsize=4, label=mode)
    headline = next(row for row in rows if row.headline)
    ax.axvline(
        headline.multiple, color="#c92a2a", linestyle="--", label=f"headline SLO {headline.multiple:g} u"
    )
    ax.set(xlabel="SLO on the ranking P99 (multiples of the host's unit u)", ylabel="highest load (req/s)")
    ax.set_title(
        f"Capacity against the SLO, mix {run.first_mix[0]}\nbars: up to the lowest failing load above",
        fontsize=9,
    )
    _save(fig, ax, path)
