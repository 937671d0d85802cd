"""The gpu profile's outputs: results.json, report.md and two plots, from its results dictionary alone.

The report leads with the two headline ratios (a sweep the time budget cut short shows what it had
measured, never a ratio), then, at each mode's limit in each experiment, the GPU's busy fraction and the
host CPU per request by service (`bench.report.cpu_ms_per_request`): on a GPU the host's serving path is
the likely ceiling. Then the floor, the cached Rank, every point, and the machine with its GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import report
from bench.report import CPU_SERVICES, ms, point_row, table, times

PLOTS = {"length": "p99_vs_length.png", "load": "p99_vs_load.png"}
EXTRA_HEADER = ("GPU busy", "host CPU ms/request", "send lag P99 ms")


def write(results: dict[str, Any], out_dir: Path, plots: bool = True) -> None:
    """Writes results.json, report.md and (with `plots`) the plots into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    if plots:
        plot_all(results, out_dir)
    (out_dir / "report.md").write_text(render_markdown(results))


def busy(point: dict[str, Any] | None) -> str:
    gpu = (point or {}).get("gpu")
    if gpu is None:
        return "unknown (no GPU monitor)"
    return "no sample" if gpu["busy"] is None else f"{gpu['busy']:.0%}"


def limit(sweep: dict[str, Any], key: str) -> tuple[str, dict[str, Any] | None]:
    """A sweep's answer as text and the point measured there (the largest passing one when cut short)."""
    if sweep.get("cut_short"):
        passed, failed = sweep["passed_up_to"], sweep["failed_from"]
        text = "cut short: " + (f"passes at {passed:g}" if passed is not None else "nothing passed yet")
        text += f", fails at {failed:g}" if failed is not None else ""
        return text, report.point_at(sweep, key, passed)
    if sweep["best"] is None:
        return "none on the grid", None
    top = " (grid top: may be higher)" if sweep["at_grid_top"] else ""
    return f"{sweep['best']:g}{top}", report.point_at(sweep, key, sweep["best"])


def ratio_cell(entry: dict[str, Any]) -> str:
    if entry["ratio"] is not None:
        return times(entry["ratio"])
    if entry.get("ratio_at_least") is not None:
        return f"≥ {times(entry['ratio_at_least'])} (RelayGR cut short)"
    return "n/a (cut short)" if not entry.get("complete", True) else "n/a (baseline passed nowhere)"


def experiments(results: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(title, point key, entry with `baseline`, `relay`, `ratio`) of every experiment measured."""
    found = []
    length = results.get("length_sweep")
    if length is not None:
        title = f"longest length under the SLO at {length['rate']:g} req/s, events"
        found.append((title, "long_term", length))
    for label, mix in results.get("throughput_sweeps", {}).items():
        found.append((f"highest SLO-compliant load, {label}, req/s", "rate", mix))
    return found


def render_markdown(results: dict[str, Any]) -> str:
    c = results["configuration"]
    budget = results.get("time_budget", {})
    gpus = (results["machine"].get("gpu") or {}).get("gpus") or []
    gpu_names = ", ".join(f"{g['name']} ({g['memory_total_mib']} MiB, driver {g['driver']})" for g in gpus)
    versions = results["versions"]
    lines = [
        f"# RelayGR on a GPU: `{results['name']}` ({c['profile']} profile)",
        f"{results['started_at']}, {results['duration_s']:.0f} s of a {budget.get('seconds', 0):g} s budget; "
        f"GPU: {gpu_names or 'none found'}; {results['machine']['cores']} host cores "
        f"({results['machine']['cpu_model']}); torch {versions['torch']} "
        f"(CUDA {versions.get('torch_cuda')}); "
        f"preset `{c['model_preset']}`, {c['rankers']} ranker(s), SLO P99 {c['slo_ms']:g} ms, relay window "
        f"{c['preprocess_delay_ms']:g} ms; commit `{versions['git_commit']}`.",
    ]
    skipped = budget.get("skipped") or {}
    notes = [f"- skipped {name}: {why}" for name, why in skipped.items()]
    for title, _, entry in experiments(results):
        for mode in ("baseline", "relay"):
            if entry[mode].get("cut_short"):
                notes.append(f"- cut short by the time budget: {title}, {mode}: {entry[mode]['cut_reason']}")
    notes += [f"- error in {error}" for error in results.get("errors", [])]
    if notes:
        lines.append("**Not everything ran:**\n\n" + "\n".join(notes))
    rows = []
    for title, key, entry in experiments(results):
        base, _ = limit(entry["baseline"], key)
        relay, _ = limit(entry["relay"], key)
        rows.append([title, base, relay, ratio_cell(entry)])
    headline = table(("", "baseline", "RelayGR", "ratio"), rows) if rows else "Nothing measured."
    lines += ["## Headline", headline]
    lines.append(_at_limits(results))
    lines.append(_floor(results))
    for title, key, entry in experiments(results):
        for mode in ("baseline", "relay"):
            lines.append(f"### {title}: {mode}\n\n{_sweep_table(results, entry[mode], key)}")
    described = json.dumps({"machine": results["machine"], "versions": results["versions"]}, indent=1)
    lines.append(f"## Machine and versions\n\n```\n{described}\n```")
    return "\n\n".join(lines) + "\n"


def _at_limits(results: dict[str, Any]) -> str:
    services = [f"{service} ms" for service in CPU_SERVICES]
    header = ("experiment", "mode", "limit", "rank P99 ms", "GPU busy", *services, "host total ms",
              "host cores at that load")  # fmt: skip
    rows = []
    for title, key, entry in experiments(results):
        for mode in ("baseline", "relay"):
            text, point = limit(entry[mode], key)
            if point is None:
                rows.append([title, mode, text, "", "", *[""] * len(CPU_SERVICES), "", ""])
                continue
            used = report.cpu_ms_per_request(results, point)
            rows.append([
                title, mode, text, ms(point["rank_ms"]["p99"]), busy(point),
                *(f"{used[service]:.2f}" for service in CPU_SERVICES), f"{used['total']:.2f}",
                f"{report.cores_needed(results, point):.2f} of {results['machine']['cores']}",
            ])  # fmt: skip
    return (
        "## GPU busy and host CPU per request at each mode's limit\n\n"
        "GPU busy: NVML's share of time a kernel ran, over the point's measured requests. Host CPU: every "
        "process's CPU seconds over the point (warm-up included) per request sent; the rankers' share "
        "includes their Python serving path and the kernel launches.\n\n" + table(header, rows)
    )


def _floor(results: dict[str, Any]) -> str:
    floor = results.get("floor") or []
    parts = ["## Where the time goes"]
    if floor:
        rows = [[p["prefix_length"], f"{p['full_ms']:.2f}", f"{p['pre_infer_ms']:.2f}", f"{p['rank_ms']:.2f}"]
                for p in floor]  # fmt: skip
        header = ("long-term length", "full forward ms", "pre-infer ms", "cached rank ms")
        device = results["configuration"]["floor_device"]
        parts.append(f"In process (`--floor-device {device}`):\n\n" + table(header, rows))
    cached = results.get("cached_rank") or []
    if cached:
        rows = [[p["prefix_length"], p["request_kib"], ms(p["rank_ms_p50"]), ms(p["rank_ms_p99"]),
                 p["sources"]] for p in cached]  # fmt: skip
        header = ("long-term length", "Rank KiB", "P50 ms", "P99 ms", "sources")
        parts.append("Cached Rank through RelayGR's router, idle fleet:\n\n" + table(header, rows))
    return "\n\n".join(parts) if len(parts) > 1 else ""


def _sweep_table(results: dict[str, Any], sweep: dict[str, Any], key: str) -> str:
    rows = []
    for point in sorted(sweep["points"], key=lambda p: p[key]):
        row = point_row(point, f"{point[key]:g}")
        if point.get("cut"):
            row[-1] = "cut by the budget"
        total = report.cpu_ms_per_request(results, point)["total"]
        rows.append([*row, busy(point), f"{total:.2f}", f"{point['send_lag_p99_ms']:.1f}"])
    if not rows:
        return "No point measured."
    return table((key, *report.POINT_HEADER, *EXTRA_HEADER), rows)


def plot_all(results: dict[str, Any], out_dir: Path) -> None:
    for title, key, entry in experiments(results)[:2]:
        modes = {mode: entry[mode] for mode in ("baseline", "relay")}
        name = PLOTS["length"] if key == "long_term" else PLOTS["load"]
        xlabel = "long-term length (events)" if key == "long_term" else "offered load (Recommend calls/s)"
        if any(sweep["points"] for sweep in modes.values()):
            report._plot_sweeps(results, modes, key, xlabel, title, out_dir / name)
