"""`python -m bench tracing`: what OpenTelemetry tracing costs the relay fleet, and one relayed request's
timeline.

One fresh RelayGR fleet per setting (tracing is read at a process's start): off, then exporting at each of
`--sample-ratios` to one OTLP/gRPC receiver process on loopback (`bench.tracing.otlp`). Each gets the same
open-loop Recommend load, users and arrivals (`bench.lib.points.run_point`; the users and the ranker flags
as `python -m bench run`'s), its processes' CPU read around it (`bench.lib.probes`) and split by
service (`cpu_ms_per_request`, warm-up included; `total` is the fleet's four services, not the load
generator or the receiver); `overhead` divides each setting's latencies and CPU by tracing off's and gives
the CPU added per request in ms. From the highest ratio's spans it draws one relayed request
(`bench.tracing.timeline`). Writes results.json, report.md and timeline.png to `--output`; logs and spans
go to its tmp/.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from unittest import mock

from bench.lib import envelope, probes
from bench.lib.context import git_commit, load_average, provenance
from bench.lib.driving import LEASE_TTL_MS, NUM_CANDIDATES
from bench.lib.fleets import RELAY, BenchFleet, FleetShape
from bench.lib.points import PointSpec, run_point
from bench.lib.workload import RevisitSampler, Universe, mix_universe
from bench.tracing.config import BUSY_PATTERN, TracingBench
from bench.tracing.otlp import ReceiverProcess, SpanRecord
from bench.tracing.report import (
    BSP_DEFAULT_DELAY_MS,
    QUIET_POLL_S,
    RECEIVER,
    Setting,
    TracingRun,
    count_spans,
    cpu_ms_per_request,
    markdown,
    overhead,
)  # fmt: skip
from bench.tracing.timeline import picture
from services.common.config import load
from services.launcher.procs import REPO_ROOT


def busy_processes(wait_s: float = 0.0) -> list[str]:
    """Command lines of the other benchmarks and tests running (this process and its parent excluded), once
    none runs or `wait_s` has passed, polling every `QUIET_POLL_S`."""
    deadline = time.monotonic() + wait_s
    while True:
        answer = subprocess.run(["pgrep", "-af", BUSY_PATTERN], capture_output=True, text=True, check=False)
        found = (line.partition(" ") for line in answer.stdout.splitlines())
        ours = (os.getpid(), os.getppid())
        busy = [command[:120] for pid, _, command in found if pid.isdigit() and int(pid) not in ours]
        if not busy or time.monotonic() >= deadline:
            return busy
        print(f"waiting for a quiet machine: {len(busy)} other benchmark/test process(es) running")
        time.sleep(min(QUIET_POLL_S, max(deadline - time.monotonic(), 0.0)))


def measure(
    c: TracingBench, shape: FleetShape, universe: Universe, spec: PointSpec, tmp: Path, ratio: float | None,
    log: Callable[[str], None],
) -> tuple[Setting, list[SpanRecord]]:  # fmt: skip
    """One setting: a receiver, a fresh fleet exporting to it (None: not), the load, the CPU read after the
    settle; the spans once the fleet has stopped (each service exports its last batch then)."""
    name = "off" if ratio is None else f"{ratio:g}"
    with ReceiverProcess(tmp / f"spans-{name}.jsonl") as receiver:
        exported = {
            "RELAYGR_OTLP_ENDPOINT": receiver.endpoint if ratio is not None else "",
            "RELAYGR_TRACE_SAMPLE_RATIO": f"{ratio if ratio is not None else 0.01:g}",
        }
        with mock.patch.dict(os.environ, exported):  # the fleet's processes take it when it is built
            fleet = BenchFleet(RELAY, shape, universe, c.relay_window_ms, tmp / "logs" / name)
        log(f"{name}: starting the fleet")
        with fleet:
            address = fleet.stub(universe, c.relay_window_ms)
            pids = {**fleet.pids(), RECEIVER: receiver.pid}
            sampler = RevisitSampler(
                "tracing", c.rate, c.revisit_probability, c.revisit_window_s, c.load_seed
            )
            log(f"{name}: {spec.warmup} + {spec.measured} requests at {c.rate:g}/s")
            before = probes.snapshot(pids, fleet.ranker_metrics())
            point = asyncio.run(run_point(address, sampler, spec))
            time.sleep(c.settle_s)
            cost = probes.difference(before, probes.snapshot(pids, fleet.ranker_metrics()))
        receiver.stop()
        spans = receiver.records()
    requests = spec.warmup + point.measured
    s = Setting(
        name=name, sample_ratio=ratio, rate=c.rate, requests=requests, measured=point.measured,
        errors=point.errors, recommend_ms=dataclasses.asdict(point.e2e_ms),
        rank_ms=dataclasses.asdict(point.rank_ms),
        cache_sources=point.cache_sources, cpu_ms=cpu_ms_per_request(cost["cpu_s"], requests),
        foreign_cores=cost["foreign_cores"], send_lag_p99_ms=point.send_lag_p99_ms, wall_s=cost["wall_s"],
        received=count_spans(spans),
    )  # fmt: skip
    log(
        f"{name}: Recommend P50 {s.recommend_ms['p50']} P99 {s.recommend_ms['p99']} ms, {s.errors} errors, "
        f"CPU {s.cpu_ms['total']:.2f} ms/request, {s.received.spans} spans in {s.received.traces} traces, "
        f"foreign cores {s.foreign_cores:.2f}"
    )
    return s, spans


def main(argv: Sequence[str] | None = None) -> None:
    c = load(TracingBench, argv, prog="python -m bench tracing", description=__doc__)
    out_dir = (REPO_ROOT / c.output).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    busy = busy_processes(c.quiet_wait_s)
    started_at = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
    load_at_start, started = load_average(), time.monotonic()
    universe = mix_universe(c.mix_median, c.mix_sigma, c.mix_max, c.short_term, c.universe_seed)
    shape = FleetShape(
        rankers=c.rankers, model_preset=c.model_preset, hbm_budget_mb=c.hbm_budget_mb,
        dram_budget_mb=c.dram_budget_mb, slo_ms=100.0,
        ranker_args=(
            f"--torch-threads {c.torch_threads} --pre-infer-chunk-tokens 512 --profile-lengths "
            f"128,256,512,2048 --profile-repeats 1 --profile-candidates {NUM_CANDIDATES} "
            f"--profile-short-term {c.short_term} --lease-ttl-ms {LEASE_TTL_MS}"
        ),
        max_long_term=c.mix_max, startup_timeout_s=c.startup_timeout_s,
        stub_args=f"--rank-timeout-ms {c.rank_timeout_ms:g} --num-candidates {NUM_CANDIDATES}",
    )  # fmt: skip
    spec = PointSpec(
        rate=c.rate, warmup=round(c.rate * c.warmup_s), measured=c.requests,
        timeout_s=(c.relay_window_ms + c.rank_timeout_ms) / 1000 + 1.0,
        slo_ms=float("inf"),  # no verdict here: a slow point is measured to its end, never cut short
        max_error_fraction=0.1, seed=c.load_seed,
    )  # fmt: skip

    def log(text: str) -> None:
        print(f"[{time.monotonic() - started:5.0f}s] {text}", flush=True)

    settings: list[Setting] = []
    for ratio in [None, *sorted(c.ratios())]:  # the picture draws the last: the highest ratio's spans
        setting, spans = measure(c, shape, universe, spec, out_dir / "tmp", ratio, log)
        settings.append(setting)
    timeline = picture(spans, out_dir)
    run = TracingRun(
        started_at=started_at, wall_s=round(time.monotonic() - started, 1), git_commit=git_commit(),
        machine={"cores": os.cpu_count(), "load_average_at_start": load_at_start,
                 "load_average_at_end": load_average(), "busy_at_start": busy},
        configuration={
            **dataclasses.asdict(c), "warmup": spec.warmup, "universe": universe.label,
            "fleet": dataclasses.asdict(shape),
            "bsp_schedule_delay_ms": int(os.environ.get("OTEL_BSP_SCHEDULE_DELAY", BSP_DEFAULT_DELAY_MS)),
        },
        settings=settings, overhead=[overhead(s, settings[0]) for s in settings[1:]],
        timeline=timeline,
    )  # fmt: skip
    envelope.write(out_dir / "results.json", "tracing", dataclasses.asdict(run), **provenance())
    (out_dir / "report.md").write_text(markdown(run))
    for o in run.overhead:
        print(f"ratio {o.name} against off: Recommend P50 x{o.recommend_p50} P99 x{o.recommend_p99}, "
              f"CPU total x{o.cpu['total']} ({o.cpu_added_ms['total']:+.2f} ms/request)")  # fmt: skip
    print(f"wrote {out_dir / 'report.md'}")
