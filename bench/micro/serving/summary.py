"""The run's results.json and summary.md."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.lib.context import commit
from bench.micro.serving.config import ServingConfig
from bench.micro.serving.pairs import Point, Shape


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys over xs (NaN with fewer than two distinct xs)."""
    if len(set(xs)) < 2:
        return float("nan")
    return float(np.polyfit(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), 1)[0])


def result_of(
    config: ServingConfig,
    lengths: list[int],
    todo: list[Shape],
    floor: list[Point],
    points: list[Point],
    null_model: list[Point],
    idle: dict,
    idle_cpu: dict,
) -> dict:
    """Each shape's rows: the ranker's (overhead shapes) and the null-model ranker's, each with the floor's
    CPU at that shape and what the ranker spends beyond it."""

    def row(point: Point, under: Point) -> dict:
        floor_ms = under.cpu_ms["total"]
        return {
            **dataclasses.asdict(point),
            "floor_ms": floor_ms,
            "ranker_own_ms": round(point.non_model_ms - floor_ms, 3),
        }

    floors = dict(zip((s.tag for s in todo), floor, strict=True))
    overhead = [s for s in todo if not s.capacity]
    rows = [row(p, floors[s.tag]) for s, p in zip(overhead, points, strict=True)]
    free = [row(p, floors[s.tag]) for s, p in zip(todo, null_model, strict=True)]
    base = [r for r in rows if r["candidates"] == config.candidates]
    at_first = [r for r in rows if r["length"] == lengths[0]]
    return {
        "configuration": dataclasses.asdict(config),
        "provenance": _provenance(),
        "idle_cpu_ms_per_s": {k: round(v, 3) for k, v in idle_cpu.items()},
        "points": rows,
        "null_model": [r for s, r in zip(todo, free, strict=True) if not s.capacity],
        "capacity": [r for s, r in zip(todo, free, strict=True) if s.capacity],
        "idle": idle,
        "non_model_ns_per_event": round(
            slope([r["length"] for r in base], [r["non_model_ms"] for r in base]) * 1e6, 1
        ),
        # Beyond the floor: the floor's own cost a pair grows at the long lengths' low rates (wake-ups).
        "beyond_floor_ns_per_event": round(
            slope([r["length"] for r in base], [r["ranker_own_ms"] for r in base]) * 1e6, 1
        ),
        "non_model_ns_per_candidate": round(
            slope([r["candidates"] for r in at_first], [r["non_model_ms"] for r in at_first]) * 1e6, 1
        ),
    }


def point_line(p: Point) -> str:
    return (
        f"L={p.length} C={p.candidates} rate={p.rate:.1f}/s: CPU/pair {p.cpu_ms['total']:.2f} ms "
        f"(event loop {p.cpu_ms['event_loop']:.2f}, device {p.cpu_ms['device']:.2f}, "
        f"other {p.cpu_ms['other']:.2f}); model {p.model_ms:.2f} (in process {p.in_process_model_ms:.2f}); "
        f"not the model {p.non_model_ms:.2f}; Rank P50/P99 {p.rank_p50_ms:.1f}/{p.rank_p99_ms:.1f} ms; "
        f"{p.sources} {p.errors or ''}"
    )


def _provenance() -> dict:
    import torch

    short, dirty = commit()
    return {
        "commit": short,
        "dirty": dirty,
        "torch": torch.__version__,
        "cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _table(rows: list[dict]) -> list[str]:
    # A GPU's busy share where a point read it (`--device cuda`; runs before it have no such key).
    gpu = any(p.get("gpu_busy") is not None for p in rows)
    lines = [
        "| long-term events | candidates | pairs/s | CPU per pair | model (service) | model (in process) "
        "| not the model | event loop | device | other | serving floor | beyond the floor | switches "
        "| page faults | Rank P50 / P99 | answers |" + (" GPU busy |" if gpu else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if gpu else ""),
    ]
    for p in rows:
        c = p["cpu_ms"]
        answers = ", ".join(f"{k.removeprefix('CACHE_SOURCE_').lower()} {v}" for k, v in p["sources"].items())
        answers += "".join(f", {k} {v}" for k, v in p["errors"].items())
        lines.append(
            f"| {p['length']} | {p['candidates']} | {p['rate']:.1f} | {c['total']:.2f} "
            f"| {p['model_ms']:.2f} | {p['in_process_model_ms']:.2f} | {p['non_model_ms']:.2f} "
            f"| {c['event_loop']:.2f} | {c['device']:.2f} | {c['other']:.2f} | {p['floor_ms']:.2f} "
            f"| {p['ranker_own_ms']:.2f} | {p['switches']:.0f} | {p['page_faults']:.0f} "
            f"| {p['rank_p50_ms']:.1f} / {p['rank_p99_ms']:.1f} | {answers} |"
            + (f" {_share(p.get('gpu_busy'))} |" if gpu else "")
        )
    return lines


def _share(fraction: float | None) -> str:
    return "no sample" if fraction is None else f"{fraction * 100:.0f} %"


def summary(result: dict) -> str:
    provenance, configuration = result["provenance"], result["configuration"]
    idle_cpu = result["idle_cpu_ms_per_s"]
    # Runs before the relay window's rename recorded it as `relay_delay_ms`.
    window = configuration.get("relay_window_ms", configuration.get("relay_delay_ms"))
    lines = [
        f"# Serving overhead at {provenance['commit']}{' (dirty)' if provenance['dirty'] else ''}",
        "",
        f"`python -m bench serving`, {configuration['model_preset']} "
        f"on {configuration.get('device', 'cpu')}, "
        f"{configuration['torch_threads']} torch thread, {configuration['short_term']} short-term events, "
        f"a Rank {window:g} ms after its PreInfer with the relay hint; "
        f"{provenance['cores']} cores, torch {provenance['torch']}, {provenance['date']}. "
        "CPU in ms per PreInfer + Rank pair; latency in ms from the Rank's intended send time. The "
        "serving floor is the same requests at the same rate answered by `bench.micro.null_ranker` "
        "(the services' server stack, no ranker). Idle, each process spends a second: "
        + ", ".join(f"{name} {ms:.1f} ms" for name, ms in idle_cpu.items())
        + ".",
        "",
        "## The ranker",
        "",
        *_table(result["points"]),
        "",
        f"Slope of the CPU that is not the model: {result['non_model_ns_per_event']} ns per history event, "
        f"{result['non_model_ns_per_candidate']} ns per candidate; of the CPU beyond the serving floor "
        f"(whose own per-pair cost grows at the long lengths' lower rates): "
        f"{result['beyond_floor_ns_per_event']} ns per history event.",
        "",
        "## The ranker with free model passes (`bench.micro.null_model`), same shapes and rates",
        "",
        *_table(result["null_model"]),
        "",
        "## Capacity: free model passes at production rates",
        "",
        *_table(result["capacity"]),
    ]
    if result["idle"]:
        lines += [
            "",
            "## A cached Rank on an idle ranker, one pair at a time",
            "",
            "| long-term events | through the service, P50 | in process, P50 | difference |",
            "|---|---|---|---|",
        ]
        for length, idle in result["idle"].items():
            service, alone = idle["service_p50_ms"], idle["in_process_p50_ms"]
            lines.append(f"| {length} | {service:.2f} ms | {alone:.2f} ms | {service - alone:+.2f} ms |")
    for p in result["points"]:
        if p["stages"]:
            lines += ["", f"Where the ranker's sampled CPU went at {p['length']} events (py-spy):", ""]
            lines += [f"- {stage}: {share * 100:.1f} %" for stage, share in p["stages"].items()]
    return "\n".join(lines) + "\n"


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "summary.md").write_text(summary(result))
