"""Figures derived from a run's results: verdicts, shares, cores and CPU per request, the points that
decided a sweep. The markdown (`bench.report.markdown`, `bench.report.gpu`) and the plots read these."""

from __future__ import annotations

from bench.lib.probes import LOAD_GENERATOR
from bench.lib.schema import Point, Run, Sweep
from services.common.contract import CACHE_SOURCES

# The services a point's CPU is split by (`cpu_service`), and the serving path's targets for RelayGR's best
# point, in ms of CPU per request.
CPU_SERVICES = ("rankers", "router", "trigger", "retrieval stub", "load generator")
CPU_TARGETS_MS = {"router": 0.6, "trigger": 0.4, "retrieval stub": 1.0}


# The sources a run's tables and plots show: its fleets keep their ring, so no prefix comes from a peer (a
# peer's answers, were there any, count in the total the shares divide by).
SHOWN_SOURCES = tuple(source for source in CACHE_SOURCES if source != "peer")


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
    used = sum(s for name, s in cost.cpu_s.items() if name.startswith("ranker") == rankers)
    return used / cost.wall_s


def cpu_service(process: str) -> str:
    """The service a process of the fleet belongs to: every ranker counts as `rankers`, every retrieval
    stub (a universe's own stub included) as `retrieval stub`."""
    if process.startswith("ranker"):
        return "rankers"
    if process.startswith("retrieval-stub"):
        return "retrieval stub"
    return "load generator" if process == LOAD_GENERATOR else process


def requests_sent(run: Run, point: Point) -> int:
    """The requests a point sent, its warm-up's included (its cost covers both): the warm-up is the rate
    times the configured warm-up seconds, rounded as `bench.run.experiments` plans it."""
    return round(point.rate * run.configuration.warmup_s) + point.measured


def cpu_ms_per_request(run: Run, point: Point) -> dict[str, float]:
    """Ms of CPU per request sent by each service of `CPU_SERVICES`, and `total` over every process of
    ours."""
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
    """The machine's core count as the run recorded it (os.cpu_count(); None when it recorded none)."""
    count = run.machine.cores
    return count if isinstance(count, int) and count > 0 else None


def best_points(sweeps: dict[str, Sweep]) -> dict[str, Point | None]:
    """Each mode's point at its best load (None where it met the SLO at no load)."""
    return {mode: point_at(sweep, "rate", sweep.best) for mode, sweep in sweeps.items()}


def point_at(sweep: Sweep, key: str, value: float | None) -> Point | None:
    """The sweep's point measured at `value` of `key` (`rate`, `long_term`; None when it measured none
    there)."""
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
    """RelayGR's point and each ablation's at the ablations' rate (the grid load at or below RelayGR's
    best on the first mix, where every one of their sweeps starts)."""
    rate = run.measured.ablations.rate
    modes = {name: sweep for name, sweep in load_modes(run).items() if name != "baseline"}
    found = {name: point_at(sweep, "rate", rate) for name, sweep in modes.items()}
    return {name: point for name, point in found.items() if point is not None}
