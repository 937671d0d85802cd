"""The tracing benchmark's run (`python -m bench tracing`): one fresh RelayGR fleet per setting, the same
load on each, the CPU read around it, the spans received (`TracingOverhead`), assembled with the run's
context into a `TracingRun` (`record`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import os
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from bench.lib import probes
from bench.lib.context import git_commit, load_average
from bench.lib.fleets import RELAY, BenchFleet, FleetShape
from bench.lib.points import PointSpec, run_point
from bench.lib.workload import RevisitSampler, mix_universe
from bench.tracing.config import (
    BUSY_PATTERN,
    MIX_SIGMA,
    NUM_CANDIDATES,
    RANK_TIMEOUT_MS,
    REVISIT_PROBABILITY,
    REVISIT_WINDOW_S,
    SHORT_TERM,
    TracingBench,
)  # fmt: skip
from bench.tracing.otlp import ReceiverProcess, SpanRecord
from bench.tracing.overhead import (
    RECEIVER,
    Setting,
    Timeline,
    TracingRun,
    count_spans,
    cpu_ms_per_request,
    overhead,
)
from bench.tracing.timeline import draw, group_traces, pick_relayed, relay_facts

PICTURE = "timeline.png"
# The SDK's batch span processor's delay unless OTEL_BSP_SCHEDULE_DELAY says otherwise.
BSP_DEFAULT_DELAY_MS = 5000
QUIET_POLL_S = 30.0


@contextlib.contextmanager
def environ(values: Mapping[str, str]) -> Iterator[None]:
    """`values` set in os.environ (which the fleet's children inherit) inside the block, restored after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def busy_processes() -> list[str]:
    """Command lines of other benchmarks and tests running now (this process and its children excluded)."""
    answer = subprocess.run(["pgrep", "-af", BUSY_PATTERN], capture_output=True, text=True, check=False)
    ours = {os.getpid(), os.getppid()}
    found = []
    for line in answer.stdout.splitlines():
        pid, _, command = line.partition(" ")
        if pid.isdigit() and int(pid) not in ours:
            found.append(command[:120])
    return found


def wait_until_quiet(limit_s: float, log) -> list[str]:
    """Polls until no other benchmark or test runs, for at most `limit_s`; what still runs then."""
    deadline = time.monotonic() + limit_s
    busy = busy_processes()
    while busy and time.monotonic() < deadline:
        log(f"waiting for a quiet machine: {len(busy)} other benchmark/test process(es) running")
        time.sleep(min(QUIET_POLL_S, max(deadline - time.monotonic(), 0.0)))
        busy = busy_processes()
    return busy


class TracingOverhead:
    """Runs the settings one fresh fleet each; `log` receives one line per step."""

    def __init__(self, config: TracingBench, out_dir: Path, log=print) -> None:
        self.config = c = config
        self.out_dir = out_dir
        self._log = log
        self._started = time.monotonic()
        self.universe = mix_universe(c.mix_median, MIX_SIGMA, c.mix_max, SHORT_TERM, 0)
        self.shape = FleetShape(
            rankers=c.rankers,
            model_preset=c.model_preset,
            hbm_budget_mb=c.hbm_budget_mb,
            dram_budget_mb=c.dram_budget_mb,
            slo_ms=100.0,
            ranker_args=(
                f"--torch-threads {c.torch_threads} --pre-infer-chunk-tokens 512 "
                "--profile-lengths 128,256,512,2048 --profile-repeats 1 "
                f"--profile-candidates {NUM_CANDIDATES} --profile-short-term {SHORT_TERM} --lease-ttl-ms 3000"
            ),
            max_long_term=c.mix_max,
            stub_args=f"--rank-timeout-ms {RANK_TIMEOUT_MS:g} --num-candidates {NUM_CANDIDATES}",
            startup_timeout_s=c.startup_timeout_s,
        )
        self.spec = PointSpec(
            rate=c.rate,
            warmup=round(c.rate * c.warmup_s),
            measured=c.requests,
            timeout_s=(c.relay_window_ms + RANK_TIMEOUT_MS) / 1000 + 1.0,
            slo_ms=float("inf"),  # no verdict here: a slow point is measured to its end, never cut short
            max_error_fraction=0.1,
            seed=c.load_seed,
        )

    def log(self, text: str) -> None:
        self._log(f"[{time.monotonic() - self._started:5.0f}s] {text}")

    def measure(self, name: str, ratio: float | None) -> tuple[Setting, list[SpanRecord]]:
        """One setting: a receiver, a fresh fleet exporting to it (or not), the load, the CPU read after
        the settle; the spans once the fleet has stopped (each service exports its last batch then)."""
        c = self.config
        tmp = self.out_dir / "tmp"
        with ReceiverProcess(tmp / f"spans-{name}.jsonl") as receiver:
            exported = {
                "RELAYGR_OTLP_ENDPOINT": receiver.endpoint if ratio is not None else "",
                "RELAYGR_TRACE_SAMPLE_RATIO": f"{ratio if ratio is not None else 0.01:g}",
            }
            with environ(exported):  # the fleet's processes take their environment when it is built
                fleet = BenchFleet(RELAY, self.shape, self.universe, c.relay_window_ms, tmp / "logs" / name)
            self.log(f"{name}: starting the fleet")
            with fleet:
                address = fleet.stub(self.universe, c.relay_window_ms)
                pids = {**fleet.pids(), RECEIVER: receiver.pid}
                sampler = RevisitSampler(
                    "tracing", c.rate, REVISIT_PROBABILITY, REVISIT_WINDOW_S, c.load_seed
                )
                self.log(f"{name}: {self.spec.warmup} + {self.spec.measured} requests at {c.rate:g}/s")
                before = probes.snapshot(pids, fleet.ranker_metrics())
                point = asyncio.run(run_point(address, sampler, self.spec))
                time.sleep(c.settle_s)
                cost = probes.difference(before, probes.snapshot(pids, fleet.ranker_metrics()))
            receiver.stop()
            spans = receiver.records()
        requests = self.spec.warmup + point.measured
        result = Setting(
            name=name,
            sample_ratio=ratio,
            rate=c.rate,
            requests=requests,
            measured=point.measured,
            errors=point.errors,
            recommend_ms=dataclasses.asdict(point.e2e_ms),
            rank_ms=dataclasses.asdict(point.rank_ms),
            cache_sources=point.cache_sources,
            cpu_ms=cpu_ms_per_request(cost["cpu_s"], requests),
            foreign_cores=cost["foreign_cores"],
            send_lag_p99_ms=point.send_lag_p99_ms,
            wall_s=cost["wall_s"],
            received=count_spans(spans),
        )
        self.log(
            f"{name}: Recommend P50 {result.recommend_ms['p50']} P99 {result.recommend_ms['p99']} ms, "
            f"{result.errors} errors, CPU {result.cpu_ms['total']:.2f} ms/request, "
            f"{result.received.spans} spans in {result.received.traces} traces, "
            f"foreign cores {result.foreign_cores:.2f}"
        )
        return result, spans

    def run(self) -> tuple[list[Setting], list[SpanRecord]]:
        """Every setting in turn (off first); the spans of the highest ratio's."""
        settings: list[Setting] = []
        spans: list[SpanRecord] = []
        for ratio in [None, *sorted(self.config.ratios())]:
            setting_, received = self.measure("off" if ratio is None else f"{ratio:g}", ratio)
            settings.append(setting_)
            spans = received
        return settings, spans


def timeline(spans: list[SpanRecord], out_dir: Path) -> Timeline | None:
    """The picked relayed trace drawn to `out_dir`/timeline.png (None when no trace qualifies)."""
    trace_id = pick_relayed(spans)
    if trace_id is None:
        return None
    trace = sorted(group_traces(spans)[trace_id], key=lambda s: (s.start_ns, s.span_id))
    facts = relay_facts(trace)
    title = (
        f"One relayed Recommend: {facts.long_term_length} long-term events, the PreInfer's production "
        f"{facts.production_kind}, the Rank's prefix {facts.production} (trace {trace_id[:12]}…)"
    )
    draw(trace, out_dir / PICTURE, title)
    return Timeline(picture=PICTURE, facts=facts, spans=trace)


def record(config: TracingBench, out_dir: Path, busy: list[str]) -> TracingRun:
    """Every setting measured (`TracingOverhead`), with the run's context and the timeline picture drawn to
    `out_dir`; `busy`: the other benchmarks and tests running at the start."""
    started_at = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
    load_at_start = load_average()
    started = time.monotonic()
    bench = TracingOverhead(config, out_dir, log=lambda line: print(line, flush=True))
    settings, spans = bench.run()
    off = settings[0]
    delay_ms = int(os.environ.get("OTEL_BSP_SCHEDULE_DELAY", BSP_DEFAULT_DELAY_MS))
    run = TracingRun(
        started_at=started_at,
        wall_s=0.0,
        git_commit=git_commit(),
        machine={
            "cores": os.cpu_count(),
            "load_average_at_start": load_at_start,
            "load_average_at_end": load_average(),
            "busy_at_start": busy,
        },
        configuration={
            **dataclasses.asdict(config),
            "warmup": bench.spec.warmup,
            "universe": bench.universe.label,
            "fleet": dataclasses.asdict(bench.shape),
            "bsp_schedule_delay_ms": delay_ms,
        },
        settings=settings,
        overhead=[overhead(s, off) for s in settings[1:]],
        timeline=timeline(spans, out_dir),
    )
    return dataclasses.replace(run, wall_s=round(time.monotonic() - started, 1))
