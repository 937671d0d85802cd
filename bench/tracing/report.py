"""results.json of `python -m bench tracing` (`TracingRun`: each setting's latencies, CPU and spans, and
their overhead against tracing off) and its report.md (`markdown`), which `python -m bench report` also
renders from a committed run."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence

from bench.report.figures import cpu_service
from bench.tracing.otlp import SpanRecord
from bench.tracing.timeline import Timeline, group_traces, root

BSP_DEFAULT_DELAY_MS = 5000  # the SDK's batch span processor's delay unless OTEL_BSP_SCHEDULE_DELAY says
QUIET_POLL_S = 30.0
RECEIVER = "otlp receiver"
SERVICES = ("retrieval stub", "trigger", "router", "rankers")
# CPU columns: the fleet's services and their total, then the processes beside the fleet.
CPU_COLUMNS = (*SERVICES, "total", "load generator", RECEIVER)


def cpu_ms_per_request(cpu_s: Mapping[str, float], requests: int) -> dict[str, float]:
    """Ms of CPU per request by column of `CPU_COLUMNS`, from each process's CPU seconds."""
    seconds = dict.fromkeys(CPU_COLUMNS, 0.0)
    for process, used in cpu_s.items():
        seconds[cpu_service(process)] = seconds.get(cpu_service(process), 0.0) + used
    seconds["total"] = sum(seconds[service] for service in SERVICES)
    return {column: round(1000 * used / requests, 3) if requests else 0.0 for column, used in seconds.items()}


@dataclasses.dataclass(frozen=True)
class SpanCounts:
    """What the receiver got in one setting."""

    spans: int
    traces: int  # distinct trace ids
    roots: int  # traces whose Recommend (root) span arrived
    orphans: int  # spans whose parent is in no span received (a lost or never-exported parent)
    spans_per_trace: float | None
    by_name: dict[str, int]  # spans by "service span-name"


def count_spans(spans: Sequence[SpanRecord]) -> SpanCounts:
    traces, ids = group_traces(spans), {span.span_id for span in spans}
    by_name = Counter(f"{span.service.removeprefix('relaygr-')} {span.name}" for span in spans)
    return SpanCounts(
        spans=len(spans), traces=len(traces), roots=sum(root(trace) is not None for trace in traces.values()),
        orphans=sum(1 for span in spans if span.parent_id and span.parent_id not in ids),
        spans_per_trace=round(len(spans) / len(traces), 2) if traces else None,
        by_name=dict(sorted(by_name.items())),
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting's measurement."""

    name: str  # off, or the sample ratio
    sample_ratio: float | None  # None: tracing off
    rate: float
    requests: int  # sent, warm-up included (what the CPU is divided by)
    measured: int  # of those, measured (latency)
    errors: int
    recommend_ms: dict[str, float | None]  # end-to-end Recommend latency percentiles (p50, p90, p99)
    rank_ms: dict[str, float | None]  # the Rank stage, as the stub timed it
    cache_sources: dict[str, int]
    cpu_ms: dict[str, float]  # per request, by `CPU_COLUMNS`
    foreign_cores: float  # cores other users of the machine took meanwhile
    send_lag_p99_ms: float
    wall_s: float
    received: SpanCounts


@dataclasses.dataclass(frozen=True)
class Overhead:
    """One setting against tracing off: ratios (setting / off) and CPU added per request (ms)."""

    name: str
    recommend_p50: float | None
    recommend_p99: float | None
    rank_p50: float | None
    rank_p99: float | None
    cpu: dict[str, float | None]  # ratio by service and total
    cpu_added_ms: dict[str, float]  # setting minus off, ms per request, by service and total


def ratio(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else round(value / base, 3)


def overhead(setting: Setting, off: Setting) -> Overhead:
    columns, latencies = (*SERVICES, "total"), ("recommend_ms", "rank_ms")
    return Overhead(
        setting.name,
        *(ratio(getattr(setting, f)[p], getattr(off, f)[p]) for f in latencies for p in ("p50", "p99")),
        cpu={c: ratio(setting.cpu_ms[c], off.cpu_ms[c]) for c in columns},
        cpu_added_ms={c: round(setting.cpu_ms[c] - off.cpu_ms[c], 3) for c in columns},
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class TracingRun:
    """results.json of `python -m bench tracing`."""

    started_at: str
    wall_s: float
    git_commit: str
    machine: dict[str, object]  # cores, load average at start and end, other benchmarks seen at start
    configuration: dict[str, object]  # the command's settings, the fleet's shape and the universe
    settings: list[Setting]
    overhead: list[Overhead]
    timeline: Timeline | None


def fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def times(value: float | None) -> str:
    return "n/a" if value is None else f"x{value:.2f}"


def markdown(run: TracingRun) -> str:
    """report.md: the overhead tables, the picture and the trace it draws."""
    c, m = run.configuration, run.machine
    lines = [
        "# Tracing overhead and one relayed request's timeline",
        "",
        f"`python -m bench tracing` at {run.git_commit}, {run.started_at}, {run.wall_s:.0f} s. One fresh "
        f"RelayGR fleet per setting ({c['rankers']} `{c['model_preset']}` rankers, router, trigger, "
        f"retrieval stub), each at the same open-loop load: {c['rate']:g} Recommend/s, {c['warmup']} warm-up "
        f"+ {c['requests']} measured requests, mix `{c['universe']}`, relay window "
        f"{c['relay_window_ms']:g} ms, the same users and arrivals in every setting. Spans go over "
        f"OTLP/gRPC to a receiver process on loopback (the SDK's batch processor, schedule delay "
        f"{c['bsp_schedule_delay_ms']} ms).",
        "",
        f"Machine: {m['cores']} cores, load average at start {m['load_average_at_start']}, at end "
        f"{m['load_average_at_end']}; other benchmarks or tests running at start: "
        f"{m['busy_at_start'] or 'none'}. On a shared CPU only the ratios count.",
        "",
        "| setting | Recommend P50 / P99 ms | Rank P50 / P99 ms | errors | CPU ms/request: stub | trigger "
        "| router | rankers | **total** | spans (traces) | foreign cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *(f"| {s.name} | {fmt(s.recommend_ms['p50'], 1)} / {fmt(s.recommend_ms['p99'], 1)} | "
          f"{fmt(s.rank_ms['p50'], 1)} / {fmt(s.rank_ms['p99'], 1)} | {s.errors} | "
          f"{s.cpu_ms['retrieval stub']:.2f} | {s.cpu_ms['trigger']:.2f} | {s.cpu_ms['router']:.2f} | "
          f"{s.cpu_ms['rankers']:.2f} | **{s.cpu_ms['total']:.2f}** | {s.received.spans} "
          f"({s.received.traces}) | {s.foreign_cores:.2f} |" for s in run.settings),
        "",
        "Against tracing off, measured in the same run (ratios; CPU added in ms per request):",
        "",
        "| setting | Recommend P50 | Recommend P99 | Rank P99 | CPU stub | trigger | router | rankers "
        "| **total** | CPU added, total ms/request |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(f"| {o.name} | {times(o.recommend_p50)} | {times(o.recommend_p99)} | {times(o.rank_p99)} | "
          f"{times(o.cpu['retrieval stub'])} | {times(o.cpu['trigger'])} | {times(o.cpu['router'])} | "
          f"{times(o.cpu['rankers'])} | **{times(o.cpu['total'])}** | {o.cpu_added_ms['total']:+.2f} |"
          for o in run.overhead),
        "",
        "CPU per request counts every request sent (warm-up included) and the fleet's four services; the "
        "load generator and the OTLP receiver are beside the fleet:",
        "",
        "| setting | load generator ms/request | OTLP receiver ms/request | spans/trace | orphan spans |",
        "|---|---|---|---|---|",
        *(f"| {s.name} | {s.cpu_ms['load generator']:.2f} | {s.cpu_ms[RECEIVER]:.2f} | "
          f"{fmt(s.received.spans_per_trace, 1)} | {s.received.orphans} |" for s in run.settings),
        "",
        "## One relayed request",
        "",
    ]  # fmt: skip
    if run.timeline is None:
        return "\n".join([*lines, "No complete relayed trace was received: no picture.", ""])
    f = run.timeline.facts
    lines += [
        f"![timeline]({run.timeline.picture})",
        "",
        f"Trace `{f.trace_id}` (from the highest sample ratio's run: the relayed trace whose Recommend "
        f"took closest to the median, preferring PreInfers that computed the whole prefix): Recommend "
        f"{f.recommend_ms:.1f} ms, {f.long_term_length} long-term events on {f.instance}, the PreInfer's "
        f"production `{f.production_kind}`. The prefix was computed from {f.compute_ms[0]:.1f} to "
        f"{f.compute_ms[1]:.1f} ms, {f.compute_in_window:.0%} of it inside the pre-processing window "
        f"({f.window_ms[0]:.1f} to {f.window_ms[1]:.1f} ms); the ranker's Rank ({f.rank_ms[0]:.1f} to "
        f"{f.rank_ms[1]:.1f} ms) waited {f.prefix_wait_ms:.2f} ms for it (`{f.production}`).",
    ]
    return "\n".join(lines) + "\n"
