"""What `python -m bench rollout` writes: summary.md (`markdown`), timeline.csv (`timeline_rows`) and
timeline.png (`plot`), from the runs' summaries and the figures across them."""

from __future__ import annotations

import collections
import csv
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.lib.intervals import Interval
from bench.report.plots import SOURCE_COLOURS
from bench.rollout.analysis import HITS, SOURCES
from bench.rollout.plan import MEASURED_PHASES, Plan
from bench.rollout.summary import Figures, ModeFigures, RunSummary, phase

MODE_COLOURS = {"off": "#c92a2a", "on": "#1c7ed6"}
TIMELINE_FIELDS = ["mode", "seed", "start_s", "calls", *SOURCES, "failed", "recommend_p99_ms", "recompute_s"]


def _interval(value: Interval | None, scale: float = 1.0, unit: str = "", signed: bool = False) -> str:
    if value is None or value.value is None:
        return "n/a"

    def number(x: float | None) -> str:
        if x is None:
            return "∞"
        return f"{x * scale:+.1f}" if signed else f"{x * scale:.1f}"

    return f"{number(value.value)}{unit} [{number(value.low)}, {number(value.high)}]"


def _share(figure: dict) -> str:
    if not figure or not figure["of"]:
        return "none"
    return f"{_interval(figure['share'], 100, ' %')} ({figure['hits']} of {figure['of']})"


def _count(pair: Sequence[int]) -> str:
    hits, total = pair
    return f"{hits} of {total} ({100 * hits / total:.1f} %)" if total else "none"


def _mib(value: float) -> str:
    return f"{value / 2**20:.1f} MiB"


def figure_rows(figures: Figures) -> list[str]:
    modes = figures.modes
    c = figures.comparison
    head = ["| | " + " | ".join(f"handoff {m.mode}" for m in modes) + (" | on against off |" if c else " |")]
    head.append("|---" * (len(modes) + 1 + bool(c)) + "|")

    def row(label: str, cell, compared: str = "") -> str:
        return f"| {label} | " + " | ".join(cell(m) for m in modes) + (f" | {compared} |" if c else " |")

    p99 = ""
    if c is not None and c.rollout_p99_difference_ms is not None:
        p99 = f"{_interval(c.rollout_p99_difference_ms, unit=' ms', signed=True)} (x{c.rollout_p99_ratio})"
    rows = [
        row("(1) drained rankers' resident users whose next call hit", lambda m: _share(m.drained),
            _interval(c.drained_difference, 100, " pp", signed=True) if c else ""),
        row("… answered by the draining ranker itself", lambda m: _count(m.drained_draining)),
        row("… answered by another ranker (it was down)", lambda m: _count(m.drained_moved)),
        row("… answered by the ranker restarted", lambda m: _count(m.drained_back)),
        row("(2) failed calls, measured phases", lambda m: f"{m.failed} ({_by_phase(m)})"),
        row("(3) Recommend P99 during the rolling restart, ms", lambda m: _interval(m.rollout_p99_ms), p99),
        row("(4) the spare's returning users: first call to it hit", lambda m: _share(m.scale_out_first)),
        row("… every returning call it answered hit", lambda m: _count(m.scale_out_calls)),
        row("steady phase: returning calls that hit", lambda m: _share(m.steady_returning)),
        row("device seconds recomputing prefixes, rollout (mean per run)",
            lambda m: f"{m.recompute_s['rollout']:g} s"),
        row("a drain: bytes its peers received / bytes it held", lambda m: f"{_mib(m.received_bytes)} / "
            f"{_mib(m.resident_bytes)}"),
    ]  # fmt: skip
    return head + rows


def _by_phase(m: ModeFigures) -> str:
    return ", ".join(f"{name} {count}" for name, count in m.failed_by_phase.items() if count) or "none"


def phase_rows(runs: Sequence[RunSummary], mode: str) -> list[str]:
    """One row per measured phase: the mode's seeds pooled (P99s per seed)."""
    mine = sorted((run for run in runs if run.mode == mode), key=lambda run: run.seed)
    recorded = {k for run in mine for name in MEASURED_PHASES for k in phase(run, name).sources}
    kinds = [k for k in SOURCES if k in recorded]  # a run from before the peer was a source has none
    rows = [
        f"**Handoff {mode}** (seeds {', '.join(str(run.seed) for run in mine)} pooled; latencies by seed)",
        "",
        f"| phase | calls | failed | {' / '.join(kinds)} | misses by reason | returning calls that "
        "hit | Recommend P99, ms | Rank P99, ms | device s recomputing | read-throughs | handoff received |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in MEASURED_PHASES:
        stats = [phase(run, name) for run in mine]
        answered = sum(sum(s.sources.values()) for s in stats) or 1
        sources = " / ".join(f"{100 * sum(s.sources.get(k, 0) for s in stats) / answered:.1f}" for k in kinds)
        misses = collections.Counter()
        rankers = collections.Counter()
        for s in stats:
            misses.update(s.miss_reasons)
            rankers.update(s.rankers)
        reads = ", ".join(
            f"{k.split('/')[1]} {v:g}"
            for k, v in sorted(rankers.items())
            if k.startswith("read_through/") and v
        )
        received = rankers.get("handoff_received_bytes", 0.0)
        again, hits = sum(s.returning for s in stats), sum(s.returning_hits for s in stats)
        rows.append(
            f"| {name} | {sum(s.calls for s in stats)} | {sum(s.failed for s in stats)} | {sources} % | "
            f"{', '.join(f'{k} {v}' for k, v in misses.most_common()) or 'none'} | "
            f"{100 * hits / again if again else 0:.1f} % of {again} | "
            f"{' / '.join(str(s.recommend_ms['p99'] or '∞') for s in stats)} | "
            f"{' / '.join(str(s.rank_ms['p99'] or '∞') for s in stats)} | "
            f"{sum(s.recompute_s for s in stats):.2f} | {reads or 'none'} | {_mib(received)} |"
        )  # fmt: skip
    return rows


def drain_rows(runs: Sequence[RunSummary]) -> list[str]:
    rows = [
        "| mode | seed | change | SIGTERM at, s | gone after, s | Ready after, s | resident users: next "
        "hit | held (HBM + DRAM) | peers received | sent entries | handoff s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in sorted(runs, key=lambda run: (run.seed, run.order)):
        for drain, change in zip(
            run.drains, [c for c in run.changes if c.signalled_s is not None], strict=True
        ):
            sent = ", ".join(f"{k.split('/')[1]} {v:g}" for k, v in drain.sent.items() if "/" in k and v)
            ready = f"{change.ready_s - change.exited_s:.1f}" if change.ready_s is not None else "-"
            held = _mib(sum(drain.resident_bytes.values()))
            rows.append(
                f"| {run.mode} | {run.seed} | {change.action} {change.ranker} | {change.signalled_s:.1f} | "
                f"{change.exited_s - change.signalled_s:.1f} | {ready} | {drain.hits} of {drain.resident} | "
                f"{held} | {_mib(drain.received_bytes)} | {sent or 'none'} | "
                f"{drain.sent.get('handoff_duration_s', 0):.2f} |"
            )
    return rows


def run_rows(runs: Sequence[RunSummary]) -> list[str]:
    rows = ["| mode | seed | order | wall s | latest change, s late | send lag P99 ms | machine busy cores |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    for run in sorted(runs, key=lambda run: (run.seed, run.order)):
        rows.append(f"| {run.mode} | {run.seed} | {run.order} | {run.wall_s:g} | {run.latest_change_s:g} | "
                    f"{run.send_lag_p99_ms:g} | {run.machine_busy_cores:g} |")  # fmt: skip
    return rows


def markdown(header: list[str], figures: Figures, runs: Sequence[RunSummary], modes: list[str]) -> str:
    lines = ["# Cache handoff through a rollout (`python -m bench rollout`)", "", *header, ""]
    lines += ["## The figures", "", *figure_rows(figures), ""]
    if figures.comparison is not None:
        lines += [
            "Per seed (the rolling restart's Recommend P99, ms, and the drained users' next-call hit share):",
            "",
            "| seed | off P99 | on P99 | on / off | off hit | on hit |",
            "|---|---|---|---|---|---|",
        ]
        for s in figures.comparison.per_seed:
            lines.append(f"| {s['seed']} | {s['off_p99_ms']} | {s['on_p99_ms']} | {s['ratio']} | "
                         f"{s['off_drained_hit']} | {s['on_drained_hit']} |")  # fmt: skip
        lines.append("")
    lines += ["## By phase", ""]
    for mode in modes:
        lines += [*phase_rows(runs, mode), ""]
    lines += ["## Drains", "", *drain_rows(runs), "", "## Runs", "", *run_rows(runs), ""]
    lines += ["![timeline](timeline.png)", "", "The timeline's buckets: `timeline.csv`.", ""]
    return "\n".join(lines)


def timeline_rows(runs: Sequence[RunSummary]) -> list[dict]:
    return [
        {
            "mode": run.mode, "seed": run.seed, "start_s": b.start_s, "calls": b.calls, **b.sources,
            "failed": b.failed, "recommend_p99_ms": "" if b.recommend_p99_ms is None else b.recommend_p99_ms,
            "recompute_s": b.recompute_s,
        }
        for run in runs
        for b in run.timeline
    ]  # fmt: skip


def write_timeline(runs: Sequence[RunSummary], path: Path) -> None:
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, TIMELINE_FIELDS)
        writer.writeheader()
        writer.writerows(timeline_rows(runs))


def plot(runs: Sequence[RunSummary], plan: Plan, path: Path) -> None:
    """Per mode, the seeds pooled bucket by bucket: the share of answered calls that hit, the mean of the
    seeds' Recommend P99s, and the device seconds a second spent recomputing prefixes; the phases shaded,
    the planned fleet changes marked."""
    fig, axes = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
    for mode in sorted({run.mode for run in runs}):
        mine = [run for run in runs if run.mode == mode]
        starts = [b.start_s for b in mine[0].timeline]
        buckets = list(zip(*(run.timeline for run in mine), strict=True))
        hit, p99, recompute = [], [], []
        for group in buckets:
            answered = sum(sum(b.sources.values()) for b in group)
            hits = sum(b.sources.get(s, 0) for b in group for s in HITS)
            hit.append(100 * hits / answered if answered else float("nan"))
            p99s = [b.recommend_p99_ms for b in group if b.recommend_p99_ms is not None]
            p99.append(sum(p99s) / len(p99s) if p99s else float("nan"))
            recompute.append(sum(b.recompute_s for b in group) / len(group))
        style = {
            "color": MODE_COLOURS.get(mode, SOURCE_COLOURS["miss"]),
            "label": f"handoff {mode}",
            "drawstyle": "steps-post",
        }
        axes[0].plot(starts, hit, **style)
        axes[1].plot(starts, p99, **style)
        axes[2].plot(starts, recompute, **style)
    for ax in axes:
        for k, p in enumerate(plan.phases):
            ax.axvspan(p.start_s, p.end_s, color="#f1f3f5" if k % 2 else "white", zorder=0)
        for change in plan.changes:
            ax.axvline(change.at_s, color="#868e96", linestyle=":", linewidth=1)
    for p in plan.phases:
        axes[0].text((p.start_s + p.end_s) / 2, 101, p.name, ha="center", va="bottom", fontsize=8)
    axes[0].set_ylabel("calls that hit, %")
    axes[0].set_ylim(0, 108)
    axes[1].set_ylabel("Recommend P99, ms")
    axes[2].set_ylabel("device s/s recomputing")
    axes[2].set_xlabel("seconds since the load started (dotted: restart, scale-out, scale-in)")
    axes[0].legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
