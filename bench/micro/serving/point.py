"""One measured point: its pairs sent at a rate, and around them the ranker's CPU by thread (/proc), the CPU
its model passes took (its own counter) and, sampled with py-spy, where its CPU went."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.lib import probes
from bench.lib.gpu_monitor import GpuMonitor
from bench.lib.stats import percentile
from bench.micro.pairs import HBM, SINGLE, Via, make_pairs
from bench.micro.serving.config import ServingConfig
from bench.micro.serving.generator import Load, Pairs
from services.launcher.procs import ServiceProcess

MODEL_OPS = ("pre_infer", "extend", "rank", "uncached")
MODEL_CPU_S = re.compile(r'^relaygr_model_cpu_seconds_total\{.*op="(\w+)".*\} (\S+)$', re.MULTILINE)
THREAD_GROUPS = ("event_loop", "device", "copy", "other")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread group of process `pid`: event_loop (its main thread), device, copy,
    other (every thread the service did not name); and `switches`, the context switches of them all
    (voluntary and not: a thread that waits for the GIL or a wake-up switches), and `page_faults`."""
    groups = dict.fromkeys((*THREAD_GROUPS, "switches", "page_faults"), 0.0)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            task = Path(f"/proc/{pid}/task/{tid}")
            text, state = (task / "stat").read_text(), (task / "status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        group = "event_loop" if int(tid) == pid else comm if comm in ("device", "copy") else "other"
        groups[group] += (int(fields[11]) + int(fields[12])) / _TICKS_PER_S
        groups["page_faults"] += int(fields[7]) + int(fields[9])  # minor and major
        groups["switches"] += sum(
            int(line.split()[1]) for line in state.splitlines() if "ctxt_switches:" in line
        )
    return groups


def model_cpu_s(metrics_url: str) -> float:
    """CPU seconds the ranker's device thread has spent inside model passes so far."""
    found = MODEL_CPU_S.findall(probes.scrape(metrics_url))
    return sum(float(seconds) for op, seconds in found if op in MODEL_OPS)


@dataclasses.dataclass(frozen=True)
class Shape:
    """What one point drives: its history length, candidates, rate and pairs, the in-process pass time of
    such a pair, and `load`, which rate it is: `low` (`--rate`), `half` or `capacity` (of the driven
    process's capacity at this length), `search` (a step of that capacity's search)."""

    length: int
    candidates: int
    rate: float
    pairs: int
    in_process_ms: float
    load: str

    @property
    def tag(self) -> str:
        return f"L{self.length}C{self.candidates}-{self.load}"


@dataclasses.dataclass(frozen=True)
class Point:
    """One point: its shape, the ranker's CPU per pair by thread, the model's share, the Ranks' latency,
    and what the load generator took."""

    length: int
    candidates: int
    load: str  # the shape's: low, half, capacity or search
    rate: float  # offered, pairs a second
    achieved_rate: float  # pairs answered a second, from the first send to the last answer
    pairs: int
    wall_s: float
    cpu_ms: dict[str, float]  # per pair, by thread group, and "total"
    model_ms: float  # per pair: CPU inside model passes, in the service
    non_model_ms: float  # per pair: total - model
    switches: float  # per pair: the process's context switches
    page_faults: float  # per pair: the process's page faults
    in_process_model_ms: float  # per pair: the same passes in this process
    rank_p50_ms: float
    rank_p99_ms: float
    sources: dict[str, int]
    errors: dict[str, int]
    generator_cores: float  # the load generator's CPU over the point's wall time, in cores
    # Through a trigger: the Admits' latency and the Ranks whose prefix was ready in HBM (None, 0: not).
    admit_p50_ms: float | None = None
    admit_p99_ms: float | None = None
    ready: int = 0
    calls: int = 0  # PreInfer and PreInferBatch calls the driver sent (0: not counted)
    stages: dict[str, float] = dataclasses.field(default_factory=dict)  # share of sampled CPU (py-spy)
    # The busiest GPU's utilization over the measured pairs (`bench.lib.gpu_monitor`); None on a CPU.
    gpu_busy: float | None = None

    def holds(self, p99_ms: float) -> bool:
        """Whether the point kept up: every Rank answered, from its pre-inferred prefix in HBM, within
        `p99_ms` at P99, at 95 % of the rate."""
        return (
            not self.errors
            and self.sources == {HBM: self.pairs}
            and self.rank_p99_ms <= p99_ms
            and self.achieved_rate >= 0.95 * self.rate
        )


async def measure_point(
    load: Load,
    ranker: ServiceProcess,
    config: ServingConfig,
    shape: Shape,
    label: str,
    monitor: GpuMonitor | None = None,
    via: Via = SINGLE,
    prepare: Via | None = None,
) -> Point:
    """`shape`'s warm-up pairs, then its measured pairs, at its rate, as `via` sends them; the ranker's CPU
    read around them. `prepare`: the measured pairs are first sent so (before the clock), instead of the
    warm-up's."""
    metrics_url = f"http://127.0.0.1:{ranker.metrics_port}/metrics"
    delay_s = config.relay_window_ms / 1000
    tag = f"{label}-{shape.tag}"

    def spec(name: str, count: int) -> Pairs:
        sizes = (shape.length, config.short_term, shape.candidates)
        return functools.partial(make_pairs, f"{tag}-{name}", count, *sizes, ranker.name, config.seed)

    warmup = min(config.warmup_pairs, shape.pairs)
    if prepare is not None:
        await load.run(ranker.address, spec("m", shape.pairs), shape.rate, delay_s, prepare)
    elif warmup:
        await load.run(ranker.address, spec("warm", warmup), shape.rate, delay_s, via)
    cpu_before, model_before = thread_cpu(ranker.popen.pid), model_cpu_s(metrics_url)
    window_start = time.monotonic()
    driven = await load.run(ranker.address, spec("m", shape.pairs), shape.rate, delay_s, via)
    busy = None if monitor is None else monitor.busy(window_start, time.monotonic())
    cpu_after, model_after = thread_cpu(ranker.popen.pid), model_cpu_s(metrics_url)
    answers, pairs = driven.answers, shape.pairs
    cpu_ms = {group: (cpu_after[group] - cpu_before[group]) * 1000 / pairs for group in THREAD_GROUPS}
    cpu_ms["total"] = sum(cpu_ms.values())
    model_ms = (model_after - model_before) * 1000 / pairs
    wall_s = max(answers.wall_s, 1e-9)
    span_s = max(wall_s - delay_s, 1e-9)  # the last Rank is sent a relay window after its PreInfer
    admits = answers.admit_ms
    return Point(
        length=shape.length,
        candidates=shape.candidates,
        load=shape.load,
        rate=round(shape.rate, 2),
        achieved_rate=round(len(answers.latency_ms) / span_s, 2),
        pairs=pairs,
        wall_s=round(wall_s, 3),
        cpu_ms={k: round(v, 3) for k, v in cpu_ms.items()},
        model_ms=round(model_ms, 3),
        non_model_ms=round(cpu_ms["total"] - model_ms, 3),
        switches=round((cpu_after["switches"] - cpu_before["switches"]) / pairs, 1),
        page_faults=round((cpu_after["page_faults"] - cpu_before["page_faults"]) / pairs, 1),
        in_process_model_ms=round(shape.in_process_ms, 3),
        rank_p50_ms=round(percentile(answers.latency_ms, 50), 3),
        rank_p99_ms=round(percentile(answers.latency_ms, 99), 3),
        sources=answers.sources,
        errors=answers.errors,
        generator_cores=round(driven.cpu_s / wall_s, 3),
        admit_p50_ms=round(percentile(admits, 50), 3) if admits else None,
        admit_p99_ms=round(percentile(admits, 99), 3) if admits else None,
        ready=answers.ready,
        calls=answers.calls,
        gpu_busy=None if busy is None or busy["busy"] is None else round(busy["busy"], 3),
    )


# ---- where the CPU goes (py-spy) ----

# Where a sampled stack's CPU goes: its innermost frame that one of these marks (a substring of
# "function (file") names, from the innermost frame out. A stack that ends under the event loop's own
# `run` with no frame of ours is native code there: gRPC's server (Cython) and uvloop. Samples of a thread
# waiting on a lock or a condition are not CPU and are left out.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("waiting", ("Condition.wait (", "Event.wait (", "lock.acquire", "_poll_wrapper")),
    ("model", ("(services/ranker/model/", "(torch/")),
    ("response", ("_response (services/ranker/",)),
    ("decoding and validation", ("(services/common/validation.py", "(services/ranker/model/events.py",
                                 "(services/ranker/wire.py", "RankerServicer._events",
                                 "RankerServicer._known", "(protobuf/", "(numpy/")),
    ("cache bookkeeping", ("(services/ranker/cache/", "(services/ranker/engine/load.py",
                           "(services/ranker/engine/latency_curve.py")),
    ("metrics and tracing", ("(prometheus_client/", "(services/common/tracing.py", "(opentelemetry/",
                             "(services/common/metrics.py", "(services/ranker/metrics.py")),
    ("scheduling and hand-offs", ("(services/ranker/engine/", "(services/ranker/dataplane.py",
                                  "(services/ranker/servicer.py", "(asyncio/futures", "(asyncio/tasks",
                                  "(contextlib.py", "(dataclasses.py", "(threading.py")),
    ("gRPC server and event loop", ("(services/common/interceptor.py", "(grpc/", "(uvloop/",
                                    "(asyncio/runners.py", "(asyncio/base_events.py")),
]  # fmt: skip


# Threads of gRPC and of the metrics server, named by py-spy after their Python target.
THREAD_STAGES = {"(_poll_wrapper)": "gRPC server and event loop", "(serve_forever)": "metrics and tracing"}


def classify(stack: str) -> str:
    """The stage of one sampled stack (`thread (tid): name;frame;frame;...`, outermost first)."""
    thread, _, frames = stack.partition(";")
    for mark, stage in THREAD_STAGES.items():
        if mark in thread:
            return "waiting" if "Condition.wait (" in frames else stage
    for frame in reversed(frames.split(";")):
        for stage, marks in STAGES:
            if any(mark in frame for mark in marks):
                return stage
    return "other"


def sample_stages(pid: int, seconds: float) -> subprocess.Popen:
    """Starts py-spy on `pid` for `seconds` (raw collapsed stacks, every thread, non-blocking)."""
    handle, out = tempfile.mkstemp(suffix=".txt")
    os.close(handle)
    command = [
        str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid), "--rate", "250",
        "--duration", str(max(1, round(seconds))), "--format", "raw", "--threads", "--nonblocking",
        "--output", out,
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    process.out = out  # type: ignore[attr-defined]
    return process


def stage_shares(raw_path: str) -> dict[str, float]:
    """Share of the sampled CPU (busy stacks, waits left out) each stage took."""
    counts: dict[str, int] = {}
    for line in Path(raw_path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():  # not a sample line (py-spy's own notes)
            continue
        stage = classify(stack)
        counts[stage] = counts.get(stage, 0) + int(count)
    Path(raw_path).unlink()
    counts.pop("waiting", None)
    total = sum(counts.values()) or 1
    return {stage: round(n / total, 4) for stage, n in sorted(counts.items(), key=lambda kv: -kv[1])}
