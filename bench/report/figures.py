"""What the reports derive from a run's results (verdicts, shares, cores, CPU per request, the points that
decided a sweep) and the markdown cells and tables they show them in."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from bench.lib import codec
from bench.lib.probes import LOAD_GENERATOR
from bench.lib.schema import Point, Run, Sweep
from services.common.contract import CACHE_SOURCES

# The services a point's CPU is split by (`cpu_service`), and the serving path's targets for RelayGR's best
# point, in ms of CPU per request.
CPU_SERVICES = ("rankers", "router", "trigger", "retrieval stub", "load generator")
CPU_TARGETS_MS = {"router": 0.6, "trigger": 0.4, "retrieval stub": 1.0}
# The sources the tables and plots show: the fleets keep their ring, so no prefix comes from a peer (a
# peer's answers, were there any, count in the total the shares divide by).
SHOWN_SOURCES = tuple(source for source in CACHE_SOURCES if source != "peer")
POINT_HEADER = (
    "measured/planned", "rank P50 ms", "rank P99 ms (95% CI)", "e2e P99 ms", "errors",
    "HBM / DRAM / ext / miss", "ranker cores", "foreign cores", "SLO",
)  # fmt: skip


def shares(counts: dict[str, int]) -> dict[str, float]:
    total = sum(counts.values())
    return {source: (counts.get(source, 0) / total if total else 0.0) for source in SHOWN_SOURCES}


def verdict(point: Point) -> str:
    """The load's verdict: this point's own, or the one pooled over its seeds, with their count (and
    `undecided` where the seed cap was reached)."""
    pooled = point.verdict
    if pooled is None:
        if point.meets_slo:
            return "meets"
        return "fails (stopped early)" if point.aborted else "fails"
    aborted = any(p.aborted for p in (point, *pooled.points))
    text = "meets" if pooled.meets_slo else ("fails (stopped early)" if aborted else "fails")
    seeds = len(pooled.seeds)
    if seeds > 1 or not pooled.decided:
        ended = "" if pooled.decided or pooled.stopped_early else ", undecided"
        text += f" ({seeds} seed{'s' if seeds > 1 else ''}{ended})"
    return text


def cores(point: Point, rankers: bool) -> float:
    """Cores the rankers (or every other process of ours) used during a point."""
    cost = point.cost
    return sum(s for name, s in cost.cpu_s.items() if name.startswith("ranker") == rankers) / cost.wall_s


def cpu_service(process: str) -> str:
    """The service a process of the fleet belongs to: every ranker counts as `rankers`, every retrieval
    stub (a universe's own stub included) as `retrieval stub`."""
    if process.startswith("ranker"):
        return "rankers"
    if process.startswith("retrieval-stub"):
        return "retrieval stub"
    return "load generator" if process == LOAD_GENERATOR else process


def requests_sent(run: Run, point: Point) -> int:
    """The requests a point sent, its warm-up's included (its cost covers both): the rate times the
    configured warm-up seconds, rounded as `bench.lib.driving.Driver.spec` plans it."""
    return round(point.rate * run.configuration.warmup_s) + point.measured


def cpu_ms_per_request(run: Run, point: Point) -> dict[str, float]:
    """Ms of CPU per request sent by each service of `CPU_SERVICES`, and `total` over every process."""
    seconds = dict.fromkeys(CPU_SERVICES, 0.0)
    for process, used in point.cost.cpu_s.items():
        service = cpu_service(process)
        seconds[service] = seconds.get(service, 0.0) + used
    seconds["total"] = sum(point.cost.cpu_s.values())
    sent = requests_sent(run, point)
    return {service: 1000 * used / sent for service, used in seconds.items()}


def cores_needed(run: Run, point: Point) -> float:
    """Cores our fleet needs at a point's offered load: its CPU per request times the load."""
    return cpu_ms_per_request(run, point)["total"] / 1000 * point.rate


def core_count(run: Run) -> int | None:
    """The machine's core count as the run recorded it (None when it recorded none)."""
    count = run.machine.cores
    return count if isinstance(count, int) and count > 0 else None


def point_at(sweep: Sweep, key: str, value: float | None) -> Point | None:
    """The sweep's point measured at `value` of `key` (`rate`, `long_term`; None: none there)."""
    return next((p for p in sweep.points if value is not None and getattr(p, key) == value), None)


def first_failure(sweep: Sweep, key: str) -> Point | None:
    """The failing point just above the best one (what stopped the sweep)."""
    best = sweep.best
    above = [p for p in sweep.points if not p.passes and (best is None or getattr(p, key) > best)]
    return min(above, key=lambda p: getattr(p, key)) if above else None


def within_noise(relay: Point | None, other: Point) -> bool:
    """Whether RelayGR's point is as good as another mode's passing one within the measurement's noise:
    it meets the SLO too, or its P99's 95% interval reaches into the other's."""
    if relay is None:
        return False
    if relay.passes:
        return True
    low, _ = relay.rank_p99_ci_ms
    _, other_high = other.rank_p99_ci_ms
    return low is not None and (other_high is None or low <= other_high)


def load_modes(run: Run) -> dict[str, Sweep]:
    """The first mix's load sweep of every mode: the baseline, RelayGR and each ablation."""
    _, first = run.first_mix
    return {"baseline": first.baseline, "relay": first.relay, **run.measured.ablations.sweeps}


def hit_rate_points(run: Run) -> dict[str, Point]:
    """RelayGR's point and each ablation's at the ablations' rate, where every one of their sweeps
    starts."""
    rate = run.measured.ablations.rate
    found = {name: point_at(sweep, "rate", rate) for name, sweep in load_modes(run).items()}
    return {name: point for name, point in found.items() if point is not None and name != "baseline"}


# ---- cells and tables ----


def ms(value: float | None) -> str:
    return "error" if value is None else f"{value:.1f}"


def times(value: float | None) -> str:
    return "n/a" if value is None else f"x{value:.2f}"


def share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def p99_with_ci(point: Point) -> str:
    """The P99 and its interval; a bound of None is infinite (failed requests decide it)."""
    low, high = ("∞" if bound is None else f"{bound:.1f}" for bound in point.rank_p99_ci_ms)
    return f"{ms(point.rank_ms.p99)} [{low}, {high}]"


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
        first, sent, ms(point.rank_ms.p50), p99_with_ci(point), ms(point.e2e_ms.p99), point.errors,
        " / ".join(f"{source_shares[s]:.0%}" for s in SHOWN_SOURCES), f"{cores(point, rankers=True):.2f}",
        f"{point.cost.foreign_cores:.2f}", verdict(point),
    ]  # fmt: skip


def sweep_table(sweep: Sweep, key: str) -> str:
    """A sweep's points by `key` (`long_term`, `rate`), each a row."""
    title, refined = "long-term length" if key == "long_term" else "load req/s", set(sweep.refined)
    rows = []
    for p in sorted(sweep.points, key=lambda p: getattr(p, key)):
        value = getattr(p, key)
        rows.append(point_row(p, f"{value:g} (refined)" if value in refined else f"{value:g}"))
    return table((title, *POINT_HEADER), rows)


def at_best_table(
    sweeps: dict[str, Sweep], header: Sequence[str], cells: Callable[[Point], list[Any]]
) -> str:
    """A row for each mode's best point: the mode, the load and `cells` of the point (`none` and blanks
    where the mode met the SLO at no load)."""
    rows = []
    for mode, sweep in sweeps.items():
        point = point_at(sweep, "rate", sweep.best)
        blanks = [""] * (len(header) - 2)
        rows.append([mode, "none", *blanks] if point is None else [mode, f"{point.rate:g}", *cells(point)])
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

    title = f"The machine's ceiling ({count or 'unknown'} cores) at each mode's best load:\n\n"
    return title + at_best_table(sweeps, header, cells)


def results_table(sweeps: dict[str, Sweep]) -> str:
    """Each mode's best load, its P99 there with the CI, the failure above it and the seeds' agreement."""
    baseline = sweeps["baseline"].best
    rows = []
    for mode, sweep in sweeps.items():
        best, failure = point_at(sweep, "rate", sweep.best), first_failure(sweep, "rate")
        rows.append([
            mode,
            "none" if sweep.best is None else f"{sweep.best:g}" + ("+" if sweep.at_grid_top else ""),
            times(sweep.best / baseline if sweep.best is not None and baseline else None),
            p99_with_ci(best) if best else "", f"{failure.rate:g}" if failure else "",
            p99_with_ci(failure) if failure else "",
            {None: "", True: "yes", False: "**no**"}[sweep.seeds_agree],
        ])  # fmt: skip
    header = (
        "mode", "best load req/s", "to the baseline", "rank P99 at best ms (95% CI)", "first failing load",
        "its rank P99 ms (95% CI)", "every seed agrees",
    )  # fmt: skip
    return table(header, rows)


def repeats_table(sweeps: dict[str, Sweep]) -> str:
    rows = [
        [mode, repeat.role.replace("_", " "), f"{repeat.rate:g}", ", ".join(str(s) for s in repeat.seeds),
         ", ".join(ms(p99) for p99 in repeat.rank_p99_ms),
         ", ".join("meets" if ok else "fails" for ok in repeat.meets_slo),
         "yes" if repeat.agree else "**no**"]
        for mode, sweep in sweeps.items()
        for repeat in sweep.repeats
    ]  # fmt: skip
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
