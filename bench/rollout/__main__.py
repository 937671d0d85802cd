"""`python -m bench rollout`: what the rankers' cache handoff saves through a rolling restart and a scale
out and in, handoff off against on, under steady open-loop Recommend load of returning users.

For each load seed it runs every mode (`--modes`; the order alternates from seed to seed) on a fresh fleet
with the same arrivals and users through the plan (`bench.rollout.config.plan`), and writes to `--output`:
summary.md (`markdown`), results.json (with the configuration and the plan), timeline.csv
(`write_timeline`) and timeline.png (`plot`, buckets of `--bucket-s`), raw/ (every call and metrics
sample, gzipped JSON lines) and the services' logs in tmp/.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import datetime
import gzip
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.lib import envelope
from bench.lib.context import git_commit, load_average, provenance
from bench.lib.intervals import Interval
from bench.report.plots import SOURCE_COLOURS
from bench.rollout.analysis import HITS, SOURCES
from bench.rollout.config import MEASURED_PHASES, Plan, RolloutConfig, describe, plan
from bench.rollout.run import RunRecord, run_once
from bench.rollout.summary import Figures, ModeFigures, RunSummary, figures, phase, summarize_run
from services.common.config import load
from services.launcher.procs import REPO_ROOT

# A run's fleet start and stop on this machine, beside its load: what the printed duration adds per run.
FLEET_OVERHEAD_S = 15.0
MODE_COLOURS = {"off": "#c92a2a", "on": "#1c7ed6"}
TIMELINE_FIELDS = ["mode", "seed", "start_s", "calls", *SOURCES, "failed", "recommend_p99_ms", "recompute_s"]


def jsonable(value: Any) -> Any:
    """`value` with dataclasses as dicts and infinite or NaN floats as None (JSON has neither)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def write_raw(record: RunRecord, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("calls", record.calls), ("samples", record.samples)):
        with gzip.open(folder / f"{record.mode}-s{record.seed}-{name}.jsonl.gz", "wt") as out:
            out.writelines(json.dumps(jsonable(row)) + "\n" for row in rows)


def _interval(value: Interval | None, scale: float = 1.0, unit: str = "", signed: bool = False) -> str:
    if value is None or value.value is None:
        return "n/a"

    def number(x: float | None) -> str:
        return "∞" if x is None else f"{x * scale:+.1f}" if signed else f"{x * scale:.1f}"

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


def _by_phase(m: ModeFigures) -> str:
    return ", ".join(f"{name} {count}" for name, count in m.failed_by_phase.items() if count) or "none"


def figure_rows(figures: Figures) -> list[str]:
    modes, c = figures.modes, figures.comparison
    head = ["| | " + " | ".join(f"handoff {m.mode}" for m in modes) + (" | on against off |" if c else " |")]
    head.append("|---" * (len(modes) + 1 + bool(c)) + "|")

    def row(label: str, cell, compared: str = "") -> str:
        return f"| {label} | " + " | ".join(cell(m) for m in modes) + (f" | {compared} |" if c else " |")

    p99 = ""
    if c is not None and c.rollout_p99_difference_ms is not None:
        p99 = f"{_interval(c.rollout_p99_difference_ms, unit=' ms', signed=True)} (x{c.rollout_p99_ratio})"
    return [
        *head,
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


def phase_rows(runs: Sequence[RunSummary], mode: str) -> list[str]:
    """One row per measured phase: the mode's seeds pooled (P99s per seed)."""
    mine = sorted((run for run in runs if run.mode == mode), key=lambda run: run.seed)
    rows = [
        f"**Handoff {mode}** (seeds {', '.join(str(run.seed) for run in mine)} pooled; latencies by seed)",
        "",
        f"| phase | calls | failed | {' / '.join(SOURCES)} | misses by reason | returning calls that "
        "hit | Recommend P99, ms | Rank P99, ms | device s recomputing | read-throughs | handoff received |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in MEASURED_PHASES:
        stats = [phase(run, name) for run in mine]
        answered = sum(sum(s.sources.values()) for s in stats) or 1
        sources = " / ".join(f"{100 * sum(s.sources[k] for s in stats) / answered:.1f}" for k in SOURCES)
        misses, rankers = collections.Counter(), collections.Counter()
        for s in stats:
            misses.update(s.miss_reasons)
            rankers.update(s.rankers)
        reads = ", ".join(
            f"{k.split('/')[1]} {v:g}"
            for k, v in sorted(rankers.items())
            if k.startswith("read_through/") and v
        )
        again, hits = sum(s.returning for s in stats), sum(s.returning_hits for s in stats)
        rows.append(
            f"| {name} | {sum(s.calls for s in stats)} | {sum(s.failed for s in stats)} | {sources} % | "
            f"{', '.join(f'{k} {v}' for k, v in misses.most_common()) or 'none'} | "
            f"{100 * hits / again if again else 0:.1f} % of {again} | "
            f"{' / '.join(str(s.recommend_ms['p99'] or '∞') for s in stats)} | "
            f"{' / '.join(str(s.rank_ms['p99'] or '∞') for s in stats)} | "
            f"{sum(s.recompute_s for s in stats):.2f} | {reads or 'none'} | "
            f"{_mib(rankers.get('handoff_received_bytes', 0.0))} |"
        )  # fmt: skip
    return rows


def drain_rows(runs: Sequence[RunSummary]) -> list[str]:
    rows = [
        "| mode | seed | change | SIGTERM at, s | gone after, s | Ready after, s | resident users: next "
        "hit | held (HBM + DRAM) | peers received | sent entries | handoff s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in sorted(runs, key=lambda run: (run.seed, run.order)):
        drained = [c for c in run.changes if c.signalled_s is not None]
        for drain, change in zip(run.drains, drained, strict=True):
            sent = ", ".join(f"{k.split('/')[1]} {v:g}" for k, v in drain.sent.items() if "/" in k and v)
            ready = f"{change.ready_s - change.exited_s:.1f}" if change.ready_s is not None else "-"
            rows.append(
                f"| {run.mode} | {run.seed} | {change.action} {change.ranker} | {change.signalled_s:.1f} | "
                f"{change.exited_s - change.signalled_s:.1f} | {ready} | {drain.hits} of {drain.resident} | "
                f"{_mib(sum(drain.resident_bytes.values()))} | {_mib(drain.received_bytes)} | "
                f"{sent or 'none'} | {drain.sent.get('handoff_duration_s', 0):.2f} |"
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
            *(f"| {s['seed']} | {s['off_p99_ms']} | {s['on_p99_ms']} | {s['ratio']} | "
              f"{s['off_drained_hit']} | {s['on_drained_hit']} |" for s in figures.comparison.per_seed),
            "",
        ]  # fmt: skip
    lines += ["## By phase", ""]
    for mode in modes:
        lines += [*phase_rows(runs, mode), ""]
    lines += ["## Drains", "", *drain_rows(runs), "", "## Runs", "", *run_rows(runs), ""]
    lines += ["![timeline](timeline.png)", "", "The timeline's buckets: `timeline.csv`.", ""]
    return "\n".join(lines)


def write_timeline(runs: Sequence[RunSummary], path: Path) -> None:
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, TIMELINE_FIELDS)
        writer.writeheader()
        writer.writerows(
            {
                "mode": run.mode, "seed": run.seed, "start_s": b.start_s, "calls": b.calls, **b.sources,
                "failed": b.failed, "recompute_s": b.recompute_s,
                "recommend_p99_ms": "" if b.recommend_p99_ms is None else b.recommend_p99_ms,
            }
            for run in runs
            for b in run.timeline
        )  # fmt: skip


def plot(runs: Sequence[RunSummary], plan: Plan, path: Path) -> None:
    """Per mode, the seeds pooled bucket by bucket: the share of answered calls that hit, the mean of the
    seeds' Recommend P99s, and the device seconds a second spent recomputing prefixes; the phases shaded,
    the planned fleet changes marked."""
    fig, axes = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
    for mode in sorted({run.mode for run in runs}):
        mine = [run for run in runs if run.mode == mode]
        hit, p99, recompute = [], [], []
        for group in zip(*(run.timeline for run in mine), strict=True):
            answered = sum(sum(b.sources.values()) for b in group)
            hits = sum(b.sources.get(s, 0) for b in group for s in HITS)
            hit.append(100 * hits / answered if answered else float("nan"))
            p99s = [b.recommend_p99_ms for b in group if b.recommend_p99_ms is not None]
            p99.append(sum(p99s) / len(p99s) if p99s else float("nan"))
            recompute.append(sum(b.recompute_s for b in group) / len(group))
        style = {"color": MODE_COLOURS.get(mode, SOURCE_COLOURS["miss"]), "label": f"handoff {mode}",
                 "drawstyle": "steps-post"}  # fmt: skip
        for ax, values in zip(axes, (hit, p99, recompute), strict=True):
            ax.plot([b.start_s for b in mine[0].timeline], values, **style)
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


def main(argv: Sequence[str] | None = None) -> int:
    c = config = load(RolloutConfig, argv, prog="python -m bench rollout", description=__doc__)
    made = plan(config)
    out_dir = (REPO_ROOT / config.output).resolve()
    modes = config.mode_names()
    print(describe(made, config.seeds * len(modes), FLEET_OVERHEAD_S), flush=True)
    started, started_at = time.monotonic(), datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    load_at_start = load_average()

    def log(text: str) -> None:
        print(f"[{time.monotonic() - started:6.0f}s] {text}", flush=True)

    summaries = []
    for k, seed in enumerate(config.seed_list()):
        for order, mode in enumerate(modes if k % 2 == 0 else modes[::-1]):
            record = run_once(
                config, made, mode, seed, order, out_dir / "tmp" / "logs" / f"{mode}-s{seed}", log
            )
            write_raw(record, out_dir / "raw")
            summary = summarize_run(record, made, config)
            summaries.append(summary)
            rollout = phase(summary, "rollout")
            hits = sum(d.hits for d in summary.drains), sum(d.resident for d in summary.drains)
            log(
                f"{mode} seed {seed}: {len(record.calls)} calls, {sum(not x.ok for x in record.calls)} "
                f"failed; drained users' next call hit {hits[0]} of {hits[1]}; rollout Recommend P99 "
                f"{rollout.recommend_ms['p99']} ms, {rollout.recompute_s:g} device s recomputing"
            )
    found = figures(summaries, config)
    users = (
        f"a closed population of {c.population} users (every one first seen in the warm-up)"
        if c.population
        else f"{c.revisit_probability:g} of them from a user of the last {c.revisit_window_s:g} s"
    )
    header = [
        f"{started_at.isoformat()}, commit {git_commit()}, {len(summaries)} runs in "
        f"{(time.monotonic() - started) / 60:.1f} min; load average at the start {load_at_start}, at the end "
        f"{load_average()}.",
        "",
        f"`{c.model_preset}`, {c.rankers} rankers and spare {made.spare}, {c.rate:g} Recommend/s open loop, "
        f"{users}, {c.long_term} long-term events a user, DRAM TTL {c.dram_ttl_s:g} s, relay "
        f"{'on' if c.relay else 'off'}; handoff off: `{c.handoff_off_flags}`, on: the rankers' defaults; "
        f"seeds {c.seed_list()}.",
        "",
        describe(made, len(summaries), FLEET_OVERHEAD_S).splitlines()[0] + ".",
    ]
    results = {
        "configuration": dataclasses.asdict(config), "plan": made, "started_at": started_at.isoformat(),
        "git_commit": git_commit(), "figures": found,
        "runs": [dataclasses.replace(s, timeline=[]) for s in summaries],
    }  # fmt: skip
    header_fields = {"duration_s": round(time.monotonic() - started, 1), **provenance()}
    envelope.write(out_dir / "results.json", "rollout", jsonable(results), **header_fields)
    (out_dir / "summary.md").write_text(markdown(header, found, summaries, modes))
    write_timeline(summaries, out_dir / "timeline.csv")
    plot(summaries, made, out_dir / "timeline.png")
    print("\n".join(figure_rows(found)))
    print(f"wrote {out_dir / 'summary.md'}")
    return 0
