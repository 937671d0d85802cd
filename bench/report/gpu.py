"""The gpu profile's report.md and two plots, from its results alone (`GpuRun`).

The report leads with the two headline ratios (a sweep the time budget cut short shows what it had
measured, never a ratio), then, at each mode's limit in each experiment, the GPU's busy fraction and the
host CPU per request by service (`figures.cpu_ms_per_request`): on a GPU the host's serving path is the
likely ceiling. Then the floor, the cached Rank, every point, and the machine with its GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from bench.lib.schema_gpu import BudgetedSweep, GpuLengthSweep, GpuMix, GpuPoint, GpuRun
from bench.report.figures import (
    CPU_SERVICES,
    POINT_HEADER,
    cores_needed,
    cpu_ms_per_request,
    machine_section,
    ms,
    point_at,
    point_row,
    table,
    times,
)  # fmt: skip
from bench.report.plots import PLOTS, plot_sweeps


def busy(point: GpuPoint | None) -> str:
    gpu = None if point is None else point.gpu
    if gpu is None:
        return "unknown (no GPU monitor)"
    return "no sample" if gpu.busy is None else f"{gpu.busy:.0%}"


def limit(sweep: BudgetedSweep, key: str) -> tuple[str, GpuPoint | None]:
    """A sweep's answer as text and the point measured there (the largest passing one when cut short)."""
    if sweep.cut_short:
        passed, failed = sweep.passed_up_to, sweep.failed_from
        text = "cut short: " + (f"passes at {passed:g}" if passed is not None else "nothing passed yet")
        text += f", fails at {failed:g}" if failed is not None else ""
        return text, cast(GpuPoint | None, point_at(sweep, key, passed))
    if sweep.best is None:
        return "none on the grid", None
    top = " (grid top: may be higher)" if sweep.at_grid_top else ""
    return f"{sweep.best:g}{top}", cast(GpuPoint | None, point_at(sweep, key, sweep.best))


def ratio_cell(entry: GpuLengthSweep | GpuMix) -> str:
    if entry.ratio is not None:
        return times(entry.ratio)
    if entry.ratio_at_least is not None:
        return f"≥ {times(entry.ratio_at_least)} (RelayGR cut short)"
    return "n/a (cut short)" if not entry.complete else "n/a (baseline passed nowhere)"


def experiments(run: GpuRun) -> list[tuple[str, str, GpuLengthSweep | GpuMix]]:
    """(title, point key, entry with `baseline`, `relay`, `ratio`) of every experiment measured."""
    length = run.measured.length_sweep
    found = [] if length is None else [(f"longest length under the SLO at {length.rate:g} req/s, events",
                                        "long_term", length)]  # fmt: skip
    return found + [(f"highest SLO-compliant load, {label}, req/s", "rate", mix)
                    for label, mix in run.measured.throughput_sweeps.items()]  # fmt: skip


def sweeps(run: GpuRun) -> list[tuple[str, str, str, BudgetedSweep]]:
    """(experiment's title, point key, mode, sweep) of every sweep measured."""
    return [(title, key, mode, sweep) for title, key, entry in experiments(run)
            for mode, sweep in (("baseline", entry.baseline), ("relay", entry.relay))]  # fmt: skip


def render_markdown(run: GpuRun) -> str:
    c, machine, versions = run.configuration, run.machine, run.versions
    budget = run.measured.time_budget
    gpus = (machine.gpu or {}).get("gpus") or []
    gpu_names = ", ".join(f"{g['name']} ({g['memory_total_mib']} MiB, driver {g['driver']})" for g in gpus)
    lines = [
        f"# RelayGR on a GPU: `{run.name}` ({c.profile} profile)",
        f"{run.started_at}, {run.duration_s:.0f} s of a {budget.seconds if budget else 0:g} s budget; "
        f"GPU: {gpu_names or 'none found'}; {machine.cores} host cores ({machine.cpu_model}); torch "
        f"{versions.torch} (CUDA {versions.torch_cuda}); preset `{c.model_preset}`, {c.rankers} ranker(s), "
        f"SLO P99 {c.slo_ms:g} ms, relay window {c.relay_window_ms:g} ms; commit `{versions.git_commit}`.",
    ]
    notes = [f"- skipped {name}: {why}" for name, why in (budget.skipped if budget else {}).items()]
    notes += [f"- cut short by the time budget: {title}, {mode}: {sweep.cut_reason}"
              for title, _, mode, sweep in sweeps(run) if sweep.cut_short]  # fmt: skip
    notes += [f"- error in {error}" for error in run.measured.errors]
    if notes:
        lines.append("**Not everything ran:**\n\n" + "\n".join(notes))
    rows = [[title, limit(entry.baseline, key)[0], limit(entry.relay, key)[0], ratio_cell(entry)]
            for title, key, entry in experiments(run)]  # fmt: skip
    lines += [
        "## Headline",
        table(("", "baseline", "RelayGR", "ratio"), rows) if rows else "Nothing measured.",
    ]
    lines += [_at_limits(run), _floor(run)]
    lines += [
        f"### {title}: {mode}\n\n{_sweep_table(run, sweep, key)}" for title, key, mode, sweep in sweeps(run)
    ]
    return "\n\n".join([*lines, machine_section(run)]) + "\n"


def _at_limits(run: GpuRun) -> str:
    services = [f"{service} ms" for service in CPU_SERVICES]
    header = ("experiment", "mode", "limit", "rank P99 ms", "GPU busy", *services, "host total ms",
              "host cores at that load")  # fmt: skip
    rows = []
    for title, key, mode, sweep in sweeps(run):
        text, point = limit(sweep, key)
        if point is None:
            rows.append([title, mode, text, "", "", *[""] * len(CPU_SERVICES), "", ""])
            continue
        used = cpu_ms_per_request(run, point)
        rows.append([
            title, mode, text, ms(point.rank_ms.p99), busy(point),
            *(f"{used[service]:.2f}" for service in CPU_SERVICES), f"{used['total']:.2f}",
            f"{cores_needed(run, point):.2f} of {run.machine.cores}",
        ])  # fmt: skip
    return (
        "## GPU busy and host CPU per request at each mode's limit\n\n"
        "GPU busy: NVML's share of time a kernel ran, over the point's measured requests. Host CPU: every "
        "process's CPU seconds over the point (warm-up included) per request sent; the rankers' share "
        "includes their Python serving path and the kernel launches.\n\n" + table(header, rows)
    )


def _floor(run: GpuRun) -> str:
    floor = run.measured.floor
    parts = ["## Where the time goes"]
    if floor:
        rows = [[p.prefix_length, f"{p.full_ms:.2f}", f"{p.pre_infer_ms:.2f}", f"{p.rank_ms:.2f}"]
                for p in floor]  # fmt: skip
        header = ("long-term length", "full forward ms", "pre-infer ms", "cached rank ms")
        device = run.configuration.floor_device
        parts.append(f"In process (`--floor-device {device}`):\n\n" + table(header, rows))
    cached = run.measured.cached_rank
    if cached:
        rows = [[p.prefix_length, p.request_kib, ms(p.rank_ms_p50), ms(p.rank_ms_p99), p.sources]
                for p in cached]  # fmt: skip
        header = ("long-term length", "Rank KiB", "P50 ms", "P99 ms", "sources")
        parts.append("Cached Rank through RelayGR's router, idle fleet:\n\n" + table(header, rows))
    return "\n\n".join(parts) if len(parts) > 1 else ""


def _sweep_table(run: GpuRun, sweep: BudgetedSweep, key: str) -> str:
    rows = []
    for point in sorted(sweep.points, key=lambda p: getattr(p, key)):
        row = point_row(point, f"{getattr(point, key):g}")
        if point.cut:
            row[-1] = "cut by the budget"
        total = cpu_ms_per_request(run, point)["total"]
        rows.append([*row, busy(point), f"{total:.2f}", f"{point.send_lag_p99_ms:.1f}"])
    if not rows:
        return "No point measured."
    return table((key, *POINT_HEADER, "GPU busy", "host CPU ms/request", "send lag P99 ms"), rows)


def plot_all(run: GpuRun, out_dir: Path) -> None:
    """P99 against length and against load on the first mix, where a sweep measured any point."""
    for title, key, entry in experiments(run)[:2]:
        pair = {"baseline": entry.baseline, "relay": entry.relay}
        if entry.baseline.points or entry.relay.points:
            name = PLOTS["length" if key == "long_term" else "load"]
            plot_sweeps(pair, key, title, out_dir / name, run.configuration.slo_ms)
