"""`python -m bench.tracing`: the overhead of OpenTelemetry tracing on the relay fleet, and a picture.

Runs the same RelayGR fleet shape three times, a fresh fleet each (tracing is read at a process's start):
tracing off, then exporting with `--trace-sample-ratio` 0.01 and 1.0 (`--sample-ratios`). Each fleet gets
the same open-loop Recommend load, the same users and the same arrivals (`bench.points.run_point`), and
its processes' CPU is read around it (`bench.probes`); every service exports to one OTLP/gRPC receiver
process on loopback (`bench.tracing.otlp`). From the highest ratio's spans it picks one relayed request and
draws its timeline. Writes results.json, report.md and timeline.png to `--output`; the services' logs and the
received spans go to its tmp/ folder (not committed).

Defaults, and why:

- `cpu-small`, 2 rankers with one thread each, the benchmark's first length mix (median 1024, cap 2048
  events) and 100 ms relay window: the shape `python -m bench`'s CPU figures describe, so the ratios here
  read against the same per-request cost (about 22 ms of CPU). `cpu-tiny` would make the model's cost
  nearly vanish and every ratio an upper bound; the CPU added in ms per request is reported beside the
  ratios and is what carries over to another model.
- 10 Recommend/s: a fifth of the fleet's SLO-compliant limit on this machine (53.7/s), so latency
  measures the serving path and tracing's cost on it, not queueing in a saturated fleet.
- 5 s of warm-up (50 requests) and 800 measured requests per setting: 85 s of load each, a P99 from the 8
  slowest requests; with a fleet's start (about 5 s), settle and stop, the three settings take about 5
  minutes (measured: 93 s for 100 requests a setting on a busy 2-core machine).
- The SDK's batch export as shipped (`OTEL_BSP_SCHEDULE_DELAY`, 5 s unless set): each setting's CPU is
  read after `--settle-s` more seconds, so the last batch's export is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from bench import probes
from bench.context import git_commit, load_average
from bench.fleets import RELAY, BenchFleet, FleetShape
from bench.points import PointSpec, run_point
from bench.tracing.otlp import ReceiverProcess, SpanRecord
from bench.tracing.overhead import (
    RECEIVER,
    Setting,
    Timeline,
    TracingRun,
    count_spans,
    cpu_ms_per_request,
    markdown,
    overhead,
)
from bench.tracing.timeline import draw, group_traces, pick_relayed, relay_facts
from bench.workload import RevisitSampler, mix_universe
from services.common.config import check, load, setting
from services.launcher.procs import REPO_ROOT

PICTURE = "timeline.png"
# The benchmark's settings this command shares (bench.config's defaults and bench.experiments' constants).
SHORT_TERM = 16
MIX_SIGMA = 0.75
NUM_CANDIDATES = 128
REVISIT_PROBABILITY, REVISIT_WINDOW_S = 0.5, 5.0
RANK_TIMEOUT_MS = 1000.0
# The SDK's batch span processor's delay unless OTEL_BSP_SCHEDULE_DELAY says otherwise.
BSP_DEFAULT_DELAY_MS = 5000
# Other engineers' benchmarks and tests that `--quiet-wait-s` waits out (pgrep -f patterns).
BUSY_PATTERN = "bench.mlperf|pytest|python -m bench( |$)"
QUIET_POLL_S = 30.0


@dataclasses.dataclass(frozen=True)
class TracingBench:
    output: str = setting("bench/results/tracing", "results folder (relative to the repository root)")
    rate: float = setting(10.0, "offered Recommend load of every setting, calls/s (open loop)", above=0)
    requests: int = setting(800, "measured requests per setting, after the warm-up", above=0)
    warmup_s: float = setting(
        5.0, "seconds of load before the measured requests (not in the latencies)", minimum=0
    )
    sample_ratios: str = setting(
        "0.01,1", "trace sample ratios measured after tracing off (the picture uses the highest)"
    )
    model_preset: str = setting("cpu-small", "every ranker's model preset", choices=("cpu-tiny", "cpu-small"))
    rankers: int = setting(2, "rankers per fleet", above=0)
    relay_window_ms: float = setting(
        100.0, "the relay window: the stub's pre-processing time, the trigger's placement window", minimum=0
    )
    mix_median: int = setting(1024, "median long-term length of the users' lognormal mix", above=0)
    mix_max: int = setting(2048, "longest long-term history of the mix", above=0)
    load_seed: int = setting(0, "seed of arrivals and user draws (the same in every setting)")
    settle_s: float = setting(
        6.0, "seconds after the load before CPU is read (at least the export delay + 1)", minimum=0
    )
    quiet_wait_s: float = setting(
        0.0,
        "wait up to this many seconds, polling every 30 s, until no other benchmark or test runs "
        f"(pgrep -f '{BUSY_PATTERN}'); 0: do not wait",
        minimum=0,
    )  # fmt: skip

    def ratios(self) -> list[float]:
        values = [float(part) for part in self.sample_ratios.split(",") if part.strip()]
        if not values or not all(0 < value <= 1 for value in values):
            raise ValueError("--sample-ratios must list ratios in (0, 1]")
        return values


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
            hbm_budget_mb=256.0,
            dram_budget_mb=1024.0,
            slo_ms=100.0,
            ranker_args=(
                "--torch-threads 1 --pre-infer-chunk-tokens 512 --profile-lengths 128,256,512,2048 "
                f"--profile-repeats 1 --profile-candidates {NUM_CANDIDATES} "
                f"--profile-short-term {SHORT_TERM} --lease-ttl-ms 3000"
            ),
            max_long_term=c.mix_max,
            stub_args=f"--rank-timeout-ms {RANK_TIMEOUT_MS:g} --num-candidates {NUM_CANDIDATES}",
            startup_timeout_s=300.0,
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


def main(argv: Sequence[str] | None = None) -> None:
    config = load(TracingBench, argv, prog="python -m bench.tracing", description=__doc__)
    check(config)
    config.ratios()
    out_dir = (REPO_ROOT / config.output).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    busy = wait_until_quiet(config.quiet_wait_s, print) if config.quiet_wait_s else busy_processes()
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
    run = dataclasses.replace(run, wall_s=round(time.monotonic() - started, 1))
    (out_dir / "results.json").write_text(json.dumps(dataclasses.asdict(run), indent=1) + "\n")
    (out_dir / "report.md").write_text(markdown(run))
    for o in run.overhead:
        print(f"ratio {o.name} against off: Recommend P50 x{o.recommend_p50} P99 x{o.recommend_p99}, "
              f"CPU total x{o.cpu['total']} ({o.cpu_added_ms['total']:+.2f} ms/request)")  # fmt: skip
    print(f"wrote {out_dir / 'report.md'}")


if __name__ == "__main__":
    main()
