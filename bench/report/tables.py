"""The report's markdown tables and cells: a sweep's points, each mode's answer, CPU per request and the
machine's ceiling at each mode's best load, and the verdict points measured again."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from bench.lib import codec
from bench.lib.schema import Point, Run, Sweep
from bench.report.figures import (
    CPU_SERVICES,
    CPU_TARGETS_MS,
    SHOWN_SOURCES,
    best_points,
    core_count,
    cores,
    cores_needed,
    cpu_ms_per_request,
    first_failure,
    point_at,
    requests_sent,
    shares,
    verdict,
)  # fmt: skip

POINT_HEADER = (
    "measured/planned", "rank P50 ms", "rank P99 ms (95% CI)", "e2e P99 ms", "errors",
    "HBM / DRAM / ext / miss", "ranker cores", "foreign cores", "SLO",
)  # fmt: skip


def ms(value: float | None) -> str:
    return "error" if value is None else f"{value:.1f}"


def times(value: float | None) -> str:
    return "n/a" if value is None else f"x{value:.2f}"


def bound_ms(value: float | None) -> str:
    """A confidence bound: None stands for an infinite one (failed requests decide it)."""
    return "∞" if value is None else f"{value:.1f}"


def share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def p99_with_ci(point: Point) -> str:
    low, high = point.rank_p99_ci_ms
    return f"{ms(point.rank_ms.p99)} [{bound_ms(low)}, {bound_ms(high)}]"


def machine_cores(run: Run) -> str:
    count = core_count(run)
    return "unknown" if count is None else str(count)


def table(header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(str(cell) for cell in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def point_row(point: Point, first: Any) -> list[Any]:
    source_shares = shares(point.cache_sources)
    sent = f"{point.measured}/{point.planned}"
    if point.abandoned:
        sent += f" ({point.abandoned} abandoned)"
    return [
        first,
        sent,
        ms(point.rank_ms.p50),
        p99_with_ci(point),
        ms(point.e2e_ms.p99),
        point.errors,
        " / ".join(f"{source_shares[s]:.0%}" for s in SHOWN_SOURCES),
        f"{cores(point, rankers=True):.2f}",
        f"{point.cost.foreign_cores:.2f}",
        verdict(point),
    ]


def sweep_table(sweep: Sweep, key: str, title: str) -> str:
    refined = set(sweep.refined)
    rows = []
    for p in sorted(sweep.points, key=lambda p: getattr(p, key)):
        value = getattr(p, key)
        rows.append(point_row(p, f"{value:g} (refined)" if value in refined else f"{value:g}"))
    return table((title, *POINT_HEADER), rows)


def best_cell(sweep: Sweep) -> str:
    return "none" if sweep.best is None else f"{sweep.best:g}"


def ratio_cell(ratio: float | None, baseline: Sweep, relay: Sweep, key: str, unit: str) -> str:
    """A headline ratio, said as the bound it is where a sweep ran off its grid: RelayGR met the SLO at
    the grid's end (the ratio is at least this), or the baseline met it nowhere (at least RelayGR's best
    over the lowest value the baseline failed at)."""
    if ratio is None and baseline.best is None and relay.best is not None and baseline.points:
        lowest = min(getattr(p, key) for p in baseline.points)
        return (
            f"> x{relay.best / lowest:.2f} (the baseline met the SLO nowhere; it failed even at "
            f"{lowest:g} {unit})"
        )
    at_top = " (lower bound: RelayGR met the SLO at the grid's end)" if relay.at_grid_top else ""
    return times(ratio) + at_top


def at_best_table(
    sweeps: dict[str, Sweep], header: Sequence[str], cells: Callable[[Point], list[Any]]
) -> str:
    """A row for each mode's best point: the mode, the load and `cells` of the point (`none` and blanks
    where the mode met the SLO at no load)."""
    blanks = [""] * (len(header) - 2)
    rows = [
        [mode, "none", *blanks] if point is None else [mode, f"{point.rate:g}", *cells(point)]
        for mode, point in best_points(sweeps).items()
    ]
    return table(header, rows)


def cpu_per_request_table(run: Run, sweeps: dict[str, Sweep]) -> str:
    targets = [f" (target ≤ {CPU_TARGETS_MS[s]:g})" if s in CPU_TARGETS_MS else "" for s in CPU_SERVICES]
    header = (
        "mode", "best load req/s", "requests (warm-up included)",
        *(f"{service} ms{target}" for service, target in zip(CPU_SERVICES, targets, strict=True)), "total ms",
    )  # fmt: skip

    def cells(point: Point) -> list[Any]:
        used = cpu_ms_per_request(run, point)
        return [requests_sent(run, point), *(f"{used[c]:.2f}" for c in (*CPU_SERVICES, "total"))]

    return "CPU per request at each mode's best load, ms:\n\n" + at_best_table(sweeps, header, cells)


def ceiling_table(run: Run, sweeps: dict[str, Sweep]) -> str:
    count = core_count(run)
    header = (
        "mode", "best load req/s", "fleet CPU ms/request", "cores needed (CPU/request x load)",
        "of the machine's cores", "cores used, measured", "foreign cores", "needed + foreign, of the machine",
    )  # fmt: skip

    def cells(point: Point) -> list[Any]:
        needed, foreign = cores_needed(run, point), point.cost.foreign_cores
        return [
            f"{cpu_ms_per_request(run, point)['total']:.2f}", f"{needed:.2f}",
            share(needed / count if count else None),
            f"{cores(point, rankers=True) + cores(point, rankers=False):.2f}", f"{foreign:.2f}",
            share((needed + foreign) / count if count else None),
        ]  # fmt: skip

    title = f"The machine's ceiling ({machine_cores(run)} cores) at each mode's best load:\n\n"
    return title + at_best_table(sweeps, header, cells)


def results_table(sweeps: dict[str, Sweep]) -> str:
    """Each mode's best load, its P99 there with the CI, the failure above it and the seeds' agreement."""
    baseline = sweeps["baseline"].best
    rows = []
    for mode, sweep in sweeps.items():
        best, failure = point_at(sweep, "rate", sweep.best), first_failure(sweep, "rate")
        agree = {None: "", True: "yes", False: "**no**"}[sweep.seeds_agree]
        rows.append([
            mode,
            "none" if sweep.best is None else f"{sweep.best:g}" + ("+" if sweep.at_grid_top else ""),
            times(sweep.best / baseline if sweep.best is not None and baseline else None),
            p99_with_ci(best) if best else "",
            f"{failure.rate:g}" if failure else "",
            p99_with_ci(failure) if failure else "",
            agree,
        ])  # fmt: skip
    header = (
        "mode", "best load req/s", "to the baseline", "rank P99 at best ms (95% CI)", "first failing load",
        "its rank P99 ms (95% CI)", "every seed agrees",
    )  # fmt: skip
    return table(header, rows)


def repeats_table(sweeps: dict[str, Sweep]) -> str:
    rows = []
    for mode, sweep in sweeps.items():
        for repeat in sweep.repeats:
            rows.append([
                mode, repeat.role.replace("_", " "), f"{repeat.rate:g}",
                ", ".join(str(seed) for seed in repeat.seeds),
                ", ".join(ms(p99) for p99 in repeat.rank_p99_ms),
                ", ".join("meets" if ok else "fails" for ok in repeat.meets_slo),
                "yes" if repeat.agree else "**no**",
            ])  # fmt: skip
    if not rows:
        return ""
    header = ("mode", "point", "load req/s", "load seeds", "rank P99 ms per seed", "verdicts", "agree")
    return "Verdict points measured again with other load seeds (other users and arrivals):\n\n" + table(
        header, rows
    )


def machine_section(run: Run) -> str:
    """The machine and the versions, as results.json has them."""
    described = json.dumps(
        {"machine": codec.to_json(run.machine), "versions": codec.to_json(run.versions)}, indent=1
    )
    return f"## Machine and versions\n\n```\n{described}\n```"
