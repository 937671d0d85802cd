"""The run's results.json and summary.md."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from bench.lib import envelope
from bench.lib.context import commit, provenance
from bench.micro.serving.config import ServingConfig
from bench.micro.serving.point import Point

PROCESSES = {"floor": "serving floor", "null_model": "ranker, free passes", "ranker": "ranker, real passes"}
HOW = {
    "ranks_alone": "Ranks alone",
    "direct": "pairs, straight",
    "through_trigger": "pairs, through a trigger",
}


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys over xs (NaN with fewer than two distinct xs)."""
    if len(set(xs)) < 2:
        return float("nan")
    return float(np.polyfit(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), 1)[0])


def result_of(config: ServingConfig, measured: dict) -> dict:
    """results.json of `run`'s `measured` (by key below): each ranker's point (the ranker's, with real
    passes; the null-model ranker's, with free ones) with the serving floor's CPU at the same length and
    rate, and what the ranker spends beyond it."""
    floors = {(p.length, p.rate): p for p in measured["floor"]}

    def row(point: Point) -> dict:
        floor_ms = floors[(point.length, point.rate)].cpu_ms["total"]
        return {**dataclasses.asdict(point), "floor_ms": floor_ms,
                "ranker_own_ms": round(point.non_model_ms - floor_ms, 3)}  # fmt: skip

    import torch

    short, dirty = commit()
    provenance = {"commit": short, "dirty": dirty, "torch": torch.__version__, "cores": os.cpu_count()}
    provenance["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    searches = measured["searches"]
    rows = [row(p) for p in measured["points"]]
    lows = [r for r in rows if r["load"] == "low"]
    lengths = [r["length"] for r in lows]
    return {
        "configuration": dataclasses.asdict(config),
        "provenance": {**provenance, **measured["placement"]},
        "idle_cpu_ms_per_s": {k: round(v, 3) for k, v in measured["idle_cpu"].items()},
        # Of each process (floor, null_model, ranker), at each length: the rate found and the search's steps.
        "capacity": {
            name: {
                str(length): {
                    "pairs_per_s": round(rate, 2),
                    "search": [dataclasses.asdict(p) for p in searches[name][length]],
                }
                for length, rate in found.items()
            }
            for name, found in measured["capacity"].items()
        },
        "floor": [dataclasses.asdict(p) for p in measured["floor"]],
        "points": rows,
        "null_model": [row(p) for p in measured["null_model"]],
        "idle": measured["idle"],
        "coalescing": measured["coalescing"],
        "non_model_ns_per_event": round(slope(lengths, [r["non_model_ms"] for r in lows]) * 1e6, 1),
        "beyond_floor_ns_per_event": round(slope(lengths, [r["ranker_own_ms"] for r in lows]) * 1e6, 1),
    }


def point_line(p: Point) -> str:
    c = p.cpu_ms
    return (
        f"L={p.length} {p.load} {p.rate:.1f}/s (answered {p.achieved_rate:.1f}/s): CPU/pair {c['total']:.2f} "
        f"ms (event loop {c['event_loop']:.2f}, device {c['device']:.2f}, other {c['other']:.2f}); model "
        f"{p.model_ms:.2f} (in process {p.in_process_model_ms:.2f}); not the model {p.non_model_ms:.2f}; "
        f"Rank P50/P99 {p.rank_p50_ms:.1f}/{p.rank_p99_ms:.1f} ms; generator {p.generator_cores * 100:.0f} % "
        f"of a core; {p.sources} {p.errors or ''}"
    )


def _md(header: str, rows: Iterable[str]) -> list[str]:
    """A markdown table: `header`'s cells (' | ' between them) and its rows, already written."""
    return [f"| {header} |", "|" + "---|" * (header.count(" | ") + 1), *rows]


def _table(rows: list[dict]) -> list[str]:
    gpu = any(p.get("gpu_busy") is not None for p in rows)  # a GPU's busy share, where a point read it
    header = (
        "long-term events | load | pairs/s (answered) | CPU per pair | model (service) | model (in process) "
        "| not the model | event loop | device | other | serving floor | beyond the floor | switches "
        "| page faults | Rank P50 / P99 | generator | answers" + (" | GPU busy" if gpu else "")
    )
    return _md(header, (
        f"| {p['length']} | {p['load']} | {p['rate']:.1f} ({p['achieved_rate']:.1f}) | {c['total']:.2f} "
        f"| {p['model_ms']:.2f} | {p['in_process_model_ms']:.2f} | {p['non_model_ms']:.2f} "
        f"| {c['event_loop']:.2f} | {c['device']:.2f} | {c['other']:.2f} | {p['floor_ms']:.2f} "
        f"| {p['ranker_own_ms']:.2f} | {p['switches']:.0f} | {p['page_faults']:.0f} "
        f"| {p['rank_p50_ms']:.1f} / {p['rank_p99_ms']:.1f} | {_share(p['generator_cores'])} "
        f"| {_answers(p)} |" + (f" {_share(p.get('gpu_busy'))} |" if gpu else "")
        for p, c in ((p, p["cpu_ms"]) for p in rows)
    ))  # fmt: skip


def _answers(p: dict) -> str:
    answers = ", ".join(f"{k.removeprefix('CACHE_SOURCE_').lower()} {v}" for k, v in p["sources"].items())
    return answers + "".join(f", {k} {v}" for k, v in p["errors"].items())


def _share(fraction: float | None) -> str:
    return "no sample" if fraction is None else f"{fraction * 100:.0f} %"


def _beyond(result: dict) -> list[str]:
    """The ranker's own code beyond the floor, by length and load, with free and with real passes."""
    real = {(r["length"], r["load"]): r for r in result["points"]}
    header = (
        "long-term events | load | free passes: pairs/s | beyond the floor | Rank P99 | real passes: pairs/s "
        "| beyond the floor | Rank P99"
    )
    return _md(header, (
        f"| {f['length']} | {f['load']} | {f['rate']:.1f} | {f['ranker_own_ms']:.2f} ms "
        f"| {f['rank_p99_ms']:.1f} ms | {r['rate']:.1f} | {r['ranker_own_ms']:.2f} ms "
        f"| {r['rank_p99_ms']:.1f} ms |"
        for f, r in ((f, real[(f["length"], f["load"])]) for f in result["null_model"])
    ))  # fmt: skip


def _capacity(result: dict) -> list[str]:
    p99 = result["configuration"]["capacity_p99_ms"]

    def held(step: dict) -> str:  # as the search judged it: twice a pair's real passes on top of the P99
        return "held" if Point(**step).holds(p99 + 2 * step["in_process_model_ms"]) else "not"

    header = (
        "process | long-term events | capacity, pairs/s | the search's steps (pairs/s: Rank P99, held or not)"
    )
    return _md(header, (
        f"| {PROCESSES[name]} | {length} | {one['pairs_per_s']:.1f} | "
        + ", ".join(f"{s['rate']:.1f}: {s['rank_p99_ms']:.1f} ms {held(s)}" for s in one["search"]) + " |"
        for name, found in result["capacity"].items()
        for length, one in found.items()
    ))  # fmt: skip


def _coalescing(result: dict) -> list[str]:
    """Per process: the Ranks alone, then by window pairs straight to it and through a trigger."""
    rows = []
    for name, found in result["coalescing"].items():
        single = next((r["pre_infer_ms"] for r in found if r["how"] == "direct" and not r["window_ms"]), None)
        for row in found:
            own, through = row["pre_infer_ms"], row["how"] == "through_trigger"
            ratio = f"x{own / single:.2f}" if own is not None and single else ""
            admit = f"{row['admit_p50_ms']:.1f} / {row['admit_p99_ms']:.1f} ms" if through else ""
            ready = f"{row['ready'] / max(1, sum(row['sources'].values())) * 100:.1f} %" if through else ""
            rows.append(
                f"| {PROCESSES[name]} | {HOW[row['how']]} | {row['window_ms']:g} ms | {row['rate']:.0f} "
                f"| {row['per_call'] or ''} | {row['non_model_ms']:.3f} ms "
                f"| {'' if own is None else f'{own:.3f} ms'} | {ratio} | {admit} "
                f"| {ready} | {row['rank_p99_ms']:.1f} ms | {_answers(row)} |"
            )
    return [
        "## Coalesced PreInfers, at each ranker's capacity rate (the floor at the free-pass ranker's; first "
        "length)",
        "",
        "The Ranks alone run on prefixes pre-inferred before the clock. Pairs straight to the process send "
        "the PreInfers within each window as one PreInferBatch; a PreInfer's own CPU is the pair's less the "
        "Rank's alone, and against a single call's. Through a trigger (admitting all, its coalescing window "
        "as given): the Admit's latency from the client, the Ranks whose prefix was ready in HBM on arrival.",
        "",
        *_md("process | how | window | pairs/s | PreInfers a call | CPU not the model, a pair | the PreInfer "
             "| against a single one | Admit P50 / P99 | ready | Rank P99 | answers", rows),
    ]  # fmt: skip


def summary(result: dict) -> str:
    provenance, configuration = result["provenance"], result["configuration"]
    placement = (
        f"the ranker on CPUs {provenance['ranker_cpus']}, the load generator (a process of its own) on "
        f"{provenance['generator_cpus']}"
        if provenance.get("ranker_cpus")
        else "the ranker and the load generator sharing the one CPU"
    )
    idle_cpu = ", ".join(f"{name} {ms:.1f} ms" for name, ms in result["idle_cpu_ms_per_s"].items())
    lines = [
        f"# Serving overhead at {provenance['commit']}{' (dirty)' if provenance['dirty'] else ''}",
        "",
        f"`python -m bench serving`, {configuration['model_preset']} on {configuration['device']}, "
        f"{configuration['torch_threads']} torch thread, {configuration['short_term']} short-term events, "
        f"{configuration['candidates']} candidates, a Rank {configuration['relay_window_ms']:g} ms after its "
        f"PreInfer with the relay hint; {provenance['cores']} cores ({placement}), torch "
        f"{provenance['torch']}, {provenance['date']}. CPU in ms per PreInfer + Rank pair; latency in ms "
        "from the Rank's intended send time. The serving floor is the same requests at the same rate "
        "answered by `bench.micro.null_ranker` (the services' server stack, no ranker); the loads are "
        f"`low` ({configuration['rate']:g} pairs/s, or less for a process that cannot carry it), `half` and "
        "`capacity` (of the driven process's capacity at that length). The generator column is its "
        f"process's CPU over the point, in share of a core. Idle, each process spends a second: {idle_cpu}.",
        "",
        "## The ranker's own code beyond the serving floor",
        "",
        *_beyond(result),
        "",
        "## Capacities (every Rank answered from its prefix in HBM, within "
        f"{configuration['capacity_p99_ms']:g} ms at P99 plus twice a pair's real passes, at 95 % of the "
        "rate)",
        "",
        *_capacity(result),
        "",
        "## The ranker",
        "",
        *_table(result["points"]),
        "",
        f"Slope at the low rate of the CPU that is not the model: {result['non_model_ns_per_event']} ns per "
        f"history event; of the CPU beyond the serving floor: {result['beyond_floor_ns_per_event']} ns.",
        "",
        "## The ranker with free model passes (`bench.micro.null_model`)",
        "",
        *_table(result["null_model"]),
    ]
    if any(result.get("coalescing", {}).values()):
        lines += ["", *_coalescing(result)]
    if result["idle"]:
        lines += ["", "## A cached Rank on an idle ranker, one pair at a time", ""]
        idle = [(length, i["service_p50_ms"], i["in_process_p50_ms"]) for length, i in result["idle"].items()]
        lines += _md("long-term events | through the service, P50 | in process, P50 | difference", (
            f"| {length} | {s:.2f} ms | {a:.2f} ms | {s - a:+.2f} ms |" for length, s, a in idle
        ))  # fmt: skip
    for p in result["points"] + result["null_model"]:
        if p["stages"]:
            where = f"{p['length']} events, {p['load']}, {'real' if p in result['points'] else 'free'} passes"
            lines += ["", f"Where the ranker's sampled CPU went at {where} (py-spy):", ""]
            lines += [f"- {stage}: {share * 100:.1f} %" for stage, share in p["stages"].items()]
    return "\n".join(lines) + "\n"


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    envelope.write(out / "results.json", "serving", result, **provenance())
    (out / "summary.md").write_text(summary(result))
