"""python -m bench.micro.serving: what one ranker's serving path costs the host beyond its model.

One ranker process (`--model-preset`, `--torch-threads` 1) is driven open loop by PreInfer + Rank pairs
at a fixed rate, from this process: a fresh user each pair, a long-term history of L events, then
`--relay-delay-ms` later a Rank with the relay hint (so every Rank is an HBM hit) of `--short-term` events
and C candidates. Around each point's measured pairs it reads:

- the ranker's CPU time by thread from /proc/<pid>/task: the event loop (the main thread, where gRPC's
  server, decoding, validation, the cache's bookkeeping and the responses run), the device and copy
  threads (named so by the ranker), and the rest (gRPC's own threads, the metrics server);
- the CPU time the device thread spent inside model passes, from the ranker's own counter
  (`relaygr_model_cpu_seconds`, thread CPU time around each pass): the model is subtracted by what its
  passes took in the service, not by a start-up profile;
- the same passes in this process (`ModelRunner`, same preset and threads, thread CPU time), so the model's
  cost in the service can be compared with its cost alone;
- each Rank's latency from its intended send time, and where its prefix came from.

Non-model CPU per pair = (process CPU - model-pass CPU) / pairs; its slope per history event and per
candidate is a least-squares fit over the points. `--capacity-rates` drives a near-free model (few
events, few candidates) at production rates: the pairs a second one ranker sustains with its Rank P99.
An idle sequence of pairs gives the cached Rank's latency through the service against the in-process
rank. `--stages` samples the ranker with py-spy (a dev dependency) and splits its CPU by where it goes.

On CPU the ratios and the split are what count; on an accelerator the absolute figures do too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import grpc
import numpy as np

from bench.context import commit
from bench.stats import percentile
from relaygr.v1 import common_pb2, ranker_pb2
from services.common.config import flag_name, load, setting
from services.launcher.procs import Processes, ServiceProcess

RANKER_SERVICE = "relaygr.v1.RankerService"
MODEL_OPS = ("pre_infer", "extend", "rank", "uncached")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
RPC_TIMEOUT_S = 30.0


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


@dataclasses.dataclass(frozen=True)
class ServingConfig:
    model_preset: str = setting("cpu-tiny", "the ranker's model preset")
    torch_threads: int = setting(1, "torch threads of the ranker (and of the in-process passes)", above=0)
    lengths: str = setting("256,1024,4096,8192", "long-term lengths of the overhead points (comma list)")
    rate: float = setting(20.0, "PreInfer + Rank pairs a second at the overhead points (open loop)", above=0)
    max_device_share: float = setting(
        0.6,
        "a length whose model passes alone would keep the device thread busier than this share at --rate is "
        "driven at the rate that keeps it at this share (the rate used is recorded)",
        above=0,
    )
    pairs: int = setting(300, "measured pairs a point", above=0)
    max_point_s: float = setting(
        40.0,
        "a point driven at a lower rate measures fewer pairs, to last at most this long (50 at least)",
        above=0,
    )
    warmup_pairs: int = setting(30, "pairs sent before each point's measurement", minimum=0)
    short_term: int = setting(16, "short-term events of each Rank", above=0)
    candidates: int = setting(512, "candidates of each Rank at the overhead points", above=0)
    candidate_counts: str = setting(
        "128,1024", "more candidate counts, at the first length, for the slope per candidate (comma list)"
    )
    relay_delay_ms: float = setting(30.0, "from a PreInfer to its Rank (the relay window)", minimum=0)
    capacity_rates: str = setting(
        "100,200,300", "pair rates of the capacity sweep, at a near-free model (comma list; empty: none)"
    )
    capacity_length: int = setting(64, "long-term events at the capacity sweep", above=0)
    capacity_candidates: int = setting(16, "candidates at the capacity sweep", above=0)
    capacity_seconds: float = setting(10.0, "measured seconds a capacity point", above=0)
    idle_pairs: int = setting(
        100, "sequential pairs on an idle ranker for the cached Rank's latency", minimum=0
    )
    stages: bool = setting(False, "sample the ranker with py-spy (250 Hz) and split its CPU by stage")
    out: str = setting("bench/results/serving", "folder of results.json and summary.md (empty: none)")
    seed: int = setting(0, "seed of the users' histories and candidates", minimum=0)

    def validate(self) -> None:
        """Each list names its flag when it is not a list of positive numbers (`lengths` not empty)."""
        lists = {"lengths": _ints, "candidate_counts": _ints, "capacity_rates": _floats}
        for name, parse in lists.items():
            try:
                values = parse(getattr(self, name))
            except ValueError:
                values = None
            if values is None or any(v <= 0 for v in values) or (name == "lengths" and not values):
                raise ValueError(f"{flag_name(name)} must list positive numbers, comma-separated")


# ---- the ranker's CPU, by thread, and its own counters ----


THREAD_GROUPS = ("event_loop", "device", "copy", "other")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread group of process `pid`: event_loop (its main thread), device, copy,
    other (every thread the service did not name); and `switches`, the context switches of them all
    (voluntary and not: a thread that waits for the GIL or a wake-up switches)."""
    groups = dict.fromkeys((*THREAD_GROUPS, "switches", "page_faults"), 0.0)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            task = Path(f"/proc/{pid}/task/{tid}")
            text, state = (task / "stat").read_text(), (task / "status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        seconds = (int(fields[11]) + int(fields[12])) / _TICKS_PER_S
        group = "event_loop" if int(tid) == pid else comm if comm in ("device", "copy") else "other"
        groups[group] += seconds
        groups["page_faults"] += int(fields[7]) + int(fields[9])  # minor and major
        groups["switches"] += sum(
            int(line.split()[1]) for line in state.splitlines() if "ctxt_switches:" in line
        )
    return groups


def model_cpu_s(metrics_url: str) -> float:
    """CPU seconds the ranker's device thread has spent inside model passes so far."""
    with urllib.request.urlopen(metrics_url, timeout=5) as page:
        text = page.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("relaygr_model_cpu_seconds_total{"):
            op = line.split('op="', 1)[1].split('"', 1)[0]
            if op in MODEL_OPS:
                total += float(line.rsplit(" ", 1)[1])
    return total


# ---- requests ----


def _sequence(length: int, rng: np.random.Generator) -> common_pb2.BehaviorSequence:
    start_ms = 1_700_000_000_000
    return common_pb2.BehaviorSequence(
        item_ids=rng.integers(0, 10**6, length).tolist(),
        action_types=rng.integers(0, 8, length).tolist(),
        timestamps_ms=range(start_ms, start_ms + length * 1000, 1000),
    )


@dataclasses.dataclass(frozen=True)
class Pair:
    pre_infer: bytes
    rank: bytes


def make_pairs(
    tag: str, count: int, length: int, short_term: int, candidates: int, instance: str, seed: int
) -> list[Pair]:
    """Serialized PreInfer and Rank requests of `count` fresh users (built before the clock starts)."""
    rng = np.random.default_rng(seed)
    pairs = []
    for i in range(count):
        user = f"{tag}-{i}"
        long_term = _sequence(length, rng)
        pre = ranker_pb2.PreInferRequest(user_id=user, long_term=long_term)
        rank = ranker_pb2.RankRequest(
            user_id=user,
            request_id=f"{tag}-{i}",
            long_term=long_term,
            short_term=_sequence(short_term, rng),
            candidate_item_ids=rng.integers(0, 10**6, candidates).tolist(),
            relay_instance=instance,
        )
        pairs.append(Pair(pre.SerializeToString(), rank.SerializeToString()))
    return pairs


# ---- driving ----


@dataclasses.dataclass
class Answers:
    latency_ms: list[float] = dataclasses.field(default_factory=list)
    sources: dict[str, int] = dataclasses.field(default_factory=dict)
    errors: dict[str, int] = dataclasses.field(default_factory=dict)

    def count(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1


class Driver:
    """Open-loop PreInfer + Rank pairs over one channel (grpc.aio), requests already serialized."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self._pre_infer = self.channel.unary_unary(
            f"/{RANKER_SERVICE}/PreInfer", response_deserializer=ranker_pb2.PreInferResponse.FromString
        )
        self._rank = self.channel.unary_unary(
            f"/{RANKER_SERVICE}/Rank", response_deserializer=ranker_pb2.RankResponse.FromString
        )

    async def pair(self, pair: Pair, send_at: float, delay_s: float, answers: Answers) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, send_at - loop.time()))
        try:
            await self._pre_infer(pair.pre_infer, timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            answers.count(answers.errors, f"PreInfer {error.code().name}")
        rank_at = send_at + delay_s
        await asyncio.sleep(max(0.0, rank_at - loop.time()))
        try:
            answer = await self._rank(pair.rank, timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            answers.count(answers.errors, f"Rank {error.code().name}")
            return
        answers.latency_ms.append((loop.time() - rank_at) * 1000)
        answers.count(answers.sources, common_pb2.CacheSource.Name(answer.cache_source))

    async def run(self, pairs: Sequence[Pair], rate: float, delay_s: float) -> Answers:
        answers = Answers()
        start = asyncio.get_running_loop().time() + 0.05
        await asyncio.gather(*(self.pair(p, start + i / rate, delay_s, answers) for i, p in enumerate(pairs)))
        return answers

    async def sequential(self, pairs: Sequence[Pair], delay_s: float) -> Answers:
        answers = Answers()
        for p in pairs:
            await self.pair(p, asyncio.get_running_loop().time(), delay_s, answers)
        return answers

    async def close(self) -> None:
        await self.channel.close()


# ---- one point ----


@dataclasses.dataclass(frozen=True)
class Point:
    """One point: its shape, the ranker's CPU per pair by thread, the model's share, the Ranks' latency."""

    length: int
    candidates: int
    rate: float
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
    stages: dict[str, float] = dataclasses.field(default_factory=dict)  # share of sampled CPU (py-spy)


async def measure_point(
    driver: Driver,
    ranker: ServiceProcess,
    config: ServingConfig,
    tag: str,
    length: int,
    candidates: int,
    rate: float,
    pairs: int,
    in_process_ms: float,
) -> Point:
    metrics_url = f"http://127.0.0.1:{ranker.metrics_port}/metrics"
    delay_s = config.relay_delay_ms / 1000
    build = lambda name, count: make_pairs(  # noqa: E731
        f"{tag}-{name}", count, length, config.short_term, candidates, ranker.name, config.seed
    )
    warmup, measured = build("warm", config.warmup_pairs), build("m", pairs)
    if warmup:
        await driver.run(warmup, rate, delay_s)
    cpu_before, model_before = thread_cpu(ranker.popen.pid), model_cpu_s(metrics_url)
    started = time.perf_counter()
    answers = await driver.run(measured, rate, delay_s)
    wall_s = time.perf_counter() - started
    cpu_after, model_after = thread_cpu(ranker.popen.pid), model_cpu_s(metrics_url)
    cpu_ms = {group: (cpu_after[group] - cpu_before[group]) * 1000 / pairs for group in THREAD_GROUPS}
    cpu_ms["total"] = sum(cpu_ms.values())
    switches = (cpu_after["switches"] - cpu_before["switches"]) / pairs
    page_faults = (cpu_after["page_faults"] - cpu_before["page_faults"]) / pairs
    model_ms = (model_after - model_before) * 1000 / pairs
    return Point(
        length=length,
        candidates=candidates,
        rate=rate,
        pairs=pairs,
        wall_s=round(wall_s, 3),
        cpu_ms={k: round(v, 3) for k, v in cpu_ms.items()},
        model_ms=round(model_ms, 3),
        non_model_ms=round(cpu_ms["total"] - model_ms, 3),
        switches=round(switches, 1),
        page_faults=round(page_faults, 1),
        in_process_model_ms=round(in_process_ms, 3),
        rank_p50_ms=round(percentile(answers.latency_ms, 50), 3),
        rank_p99_ms=round(percentile(answers.latency_ms, 99), 3),
        sources=answers.sources,
        errors=answers.errors,
    )


# ---- the model alone, in this process ----


class InProcess:
    """The ranker's model passes in this process: thread CPU time of a pre-inference and a cached rank."""

    def __init__(self, config: ServingConfig) -> None:
        from services.ranker.app import build_model
        from services.ranker.config import RankerConfig
        from services.ranker.engine.runner import ModelRunner
        from services.ranker.engine.scheduler import Scheduler

        ranker_config = RankerConfig(
            model_preset=config.model_preset, device="cpu", torch_threads=config.torch_threads
        )
        model, version, _ = build_model(ranker_config)
        self.worker = Scheduler("in-process")
        self.runner = ModelRunner(
            model, self.worker, ranker_config.pre_infer_chunk_tokens, None, version,
            rank_batch_max=ranker_config.rank_batch_max,
        )  # fmt: skip
        self.rng = np.random.default_rng(config.seed)
        self.short_term = config.short_term

    def _events(self, length: int):
        from services.ranker.model.events import Events

        return Events.of(self.rng.integers(0, 10**6, length), self.rng.integers(0, 8, length))

    def pair_ms(self, length: int, candidates: int, repeats: int = 7) -> tuple[float, float]:
        """Median thread CPU ms of (a pre-inference + a cached rank, the cached rank alone)."""
        long, short = self._events(length), self._events(self.short_term)
        items = self.rng.integers(0, 10**6, candidates)
        pair, rank = [], []
        for _ in range(repeats + 1):
            started = time.thread_time()
            prefix = self.runner.build_sync(long, background=True)
            middle = time.thread_time()
            self.runner.rank_sync(prefix, short, items)
            ended = time.thread_time()
            pair.append((ended - started) * 1000)
            rank.append((ended - middle) * 1000)
        return statistics.median(pair[1:]), statistics.median(rank[1:])

    def rank_wall_ms(self, length: int, candidates: int, repeats: int = 30) -> float:
        """Median wall ms of a cached rank in process (what a Rank through the service is compared with)."""
        long, short = self._events(length), self._events(self.short_term)
        items = self.rng.integers(0, 10**6, candidates)
        prefix = self.runner.build_sync(long, background=True)
        times = []
        for _ in range(repeats + 1):
            started = time.perf_counter()
            self.runner.rank_sync(prefix, short, items)
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times[1:])

    def close(self) -> None:
        self.worker.close()


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
        if not stack:
            continue
        stage = classify(stack)
        counts[stage] = counts.get(stage, 0) + int(count)
    Path(raw_path).unlink()
    counts.pop("waiting", None)
    total = sum(counts.values()) or 1
    return {stage: round(n / total, 4) for stage, n in sorted(counts.items(), key=lambda kv: -kv[1])}


# ---- the run ----


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys over xs (NaN with fewer than two distinct xs)."""
    if len(set(xs)) < 2:
        return float("nan")
    return float(np.polyfit(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), 1)[0])


def start_ranker(procs: Processes, config: ServingConfig, module: str) -> ServiceProcess:
    """A ranker (`services.ranker`, or `bench.micro.null_model`: its model passes free) for every shape."""
    max_length = max([*_ints(config.lengths), config.capacity_length])
    args = [
        "--model-preset", config.model_preset, "--torch-threads", str(config.torch_threads),
        "--device", "cpu", "--instance-name", "ranker-serving",
        "--max-long-term-events", str(max(max_length, 1)), "--max-candidates", "1024",
        "--profile-lengths", "128,1024", "--profile-repeats", "2", "--lease-ttl-ms", "10000",
    ]  # fmt: skip
    ranker = procs.start("ranker-serving", module, RANKER_SERVICE, args)
    ranker.wait_healthy(180)
    return ranker


def start_null_ranker(procs: Processes) -> ServiceProcess:
    null = procs.start(
        "ranker-serving", "bench.micro.null_ranker", RANKER_SERVICE, ["--instance-name", "ranker-serving"]
    )
    null.wait_healthy(60)
    return null


def idle_cpu_ms_per_s(pid: int, seconds: float = 3.0) -> float:
    """What the process spends a second with no request (timers, the sweeper, gRPC's own threads)."""
    before = thread_cpu(pid)
    time.sleep(seconds)
    after = thread_cpu(pid)
    return sum(after[g] - before[g] for g in THREAD_GROUPS) * 1000 / seconds


@dataclasses.dataclass(frozen=True)
class Shape:
    length: int
    candidates: int
    rate: float
    pairs: int
    in_process_ms: float
    tag: str

    @property
    def capacity(self) -> bool:
        return self.tag.startswith("cap")


def shapes(config: ServingConfig, in_process: InProcess) -> list[Shape]:
    """Every point's shape, with its rate: --rate, or less where the model alone would keep the device
    thread busier than --max-device-share."""
    lengths = _ints(config.lengths)
    overhead = [(length, config.candidates) for length in lengths]
    overhead += [(lengths[0], c) for c in _ints(config.candidate_counts) if c != config.candidates]
    result = []
    for length, candidates in overhead:
        pair_ms, _ = in_process.pair_ms(length, candidates)
        rate = min(config.rate, config.max_device_share * 1000 / pair_ms)
        pairs = min(config.pairs, max(50, round(rate * config.max_point_s)))
        result.append(Shape(length, candidates, rate, pairs, pair_ms, f"L{length}C{candidates}"))
    if config.capacity_rates:
        pair_ms, _ = in_process.pair_ms(config.capacity_length, config.capacity_candidates)
        for rate in _floats(config.capacity_rates):
            pairs = max(1, round(rate * config.capacity_seconds))
            result.append(
                Shape(
                    config.capacity_length, config.capacity_candidates, rate, pairs, pair_ms, f"cap{rate:g}"
                )
            )
    return result


async def drive(
    config: ServingConfig,
    target: ServiceProcess,
    todo: Sequence[Shape],
    label: str,
    in_process: InProcess | None = None,
) -> list[Point]:
    """Each shape's point on `target`. With `in_process`, the same passes are timed in this process right
    before each point (the machine's speed drifts over minutes: only passes timed together compare)."""
    driver = Driver(target.address)
    try:
        points = []
        for shape in todo:
            if in_process is not None:
                shape = dataclasses.replace(
                    shape, in_process_ms=in_process.pair_ms(shape.length, shape.candidates)[0]
                )
            spy = None
            if config.stages and label == "ranker":
                spy = sample_stages(target.popen.pid, shape.pairs / shape.rate)
            point = await measure_point(
                driver, target, config, f"{label}-{shape.tag}", shape.length, shape.candidates, shape.rate,
                shape.pairs, shape.in_process_ms,
            )  # fmt: skip
            if spy is not None:
                spy.wait()
                point = dataclasses.replace(point, stages=stage_shares(spy.out))
            points.append(point)
            print(f"{label}: {_line(point)}", flush=True)
        return points
    finally:
        await driver.close()


async def run(config: ServingConfig) -> dict:
    """The floor, then the ranker, then the ranker with free model passes, one process at a time on the same
    shapes and rates (so no process shares the machine with another under test)."""
    lengths = _ints(config.lengths)
    in_process = InProcess(config)
    try:
        todo = shapes(config, in_process)
        overhead = [shape for shape in todo if not shape.capacity]
        with tempfile.TemporaryDirectory() as logs, Processes(Path(logs)) as procs:
            null = start_null_ranker(procs)
            idle_cpu = {"floor": idle_cpu_ms_per_s(null.popen.pid)}
            floor = await drive(config, null, todo, "floor")
            null.stop()
            ranker = start_ranker(procs, config, "services.ranker")
            idle_cpu["ranker"] = idle_cpu_ms_per_s(ranker.popen.pid)
            points = await drive(config, ranker, overhead, "ranker", in_process)
            idle = await _idle_latency(config, ranker, in_process, lengths)
            ranker.stop()
            free = start_ranker(procs, config, "bench.micro.null_model")
            idle_cpu["null_model"] = idle_cpu_ms_per_s(free.popen.pid)
            null_model = await drive(config, free, todo, "null-model")
    finally:
        in_process.close()
    return _result(config, lengths, todo, floor, points, null_model, idle, idle_cpu)


async def _idle_latency(config, ranker: ServiceProcess, in_process: InProcess, lengths) -> dict:
    """The cached Rank through the service, one pair at a time (each Rank once its prefix is ready), against
    the cached rank in process."""
    idle = {}
    if not config.idle_pairs:
        return idle
    driver = Driver(ranker.address)
    try:
        for length in lengths:
            measured = make_pairs(
                f"idle{length}", config.idle_pairs, length, config.short_term, config.candidates,
                ranker.name, config.seed,
            )  # fmt: skip
            # The Rank waits until its prefix is surely ready: it measures the cached rank, not the prefix.
            pair_ms, rank_ms = in_process.pair_ms(length, config.candidates, repeats=3)
            delay_s = max(config.relay_delay_ms, 2 * (pair_ms - rank_ms)) / 1000
            answers = await driver.sequential(measured, delay_s)
            idle[str(length)] = {
                "service_p50_ms": round(percentile(answers.latency_ms, 50), 3),
                "in_process_p50_ms": round(in_process.rank_wall_ms(length, config.candidates), 3),
                "sources": answers.sources,
            }
            print(f"idle L={length}: {idle[str(length)]}", flush=True)
    finally:
        await driver.close()
    return idle


def _result(
    config: ServingConfig,
    lengths: list[int],
    todo: list[Shape],
    floor: list[Point],
    points: list[Point],
    null_model: list[Point],
    idle: dict,
    idle_cpu: dict,
) -> dict:
    """Each shape's rows: the ranker's (overhead shapes) and the null-model ranker's, each with the floor's
    CPU at that shape and what the ranker spends beyond it."""

    def row(point: Point, under: Point) -> dict:
        floor_ms = under.cpu_ms["total"]
        return {
            **dataclasses.asdict(point),
            "floor_ms": floor_ms,
            "ranker_own_ms": round(point.non_model_ms - floor_ms, 3),
        }

    floors = dict(zip((s.tag for s in todo), floor, strict=True))
    overhead = [s for s in todo if not s.capacity]
    rows = [row(p, floors[s.tag]) for s, p in zip(overhead, points, strict=True)]
    free = [row(p, floors[s.tag]) for s, p in zip(todo, null_model, strict=True)]
    base = [r for r in rows if r["candidates"] == config.candidates]
    at_first = [r for r in rows if r["length"] == lengths[0]]
    return {
        "configuration": dataclasses.asdict(config),
        "provenance": _provenance(),
        "idle_cpu_ms_per_s": {k: round(v, 3) for k, v in idle_cpu.items()},
        "points": rows,
        "null_model": [r for s, r in zip(todo, free, strict=True) if not s.capacity],
        "capacity": [r for s, r in zip(todo, free, strict=True) if s.capacity],
        "idle": idle,
        "non_model_ns_per_event": round(
            slope([r["length"] for r in base], [r["non_model_ms"] for r in base]) * 1e6, 1
        ),
        # Beyond the floor: the floor's own cost a pair grows at the long lengths' low rates (wake-ups).
        "beyond_floor_ns_per_event": round(
            slope([r["length"] for r in base], [r["ranker_own_ms"] for r in base]) * 1e6, 1
        ),
        "non_model_ns_per_candidate": round(
            slope([r["candidates"] for r in at_first], [r["non_model_ms"] for r in at_first]) * 1e6, 1
        ),
    }


def _line(p: Point) -> str:
    return (
        f"L={p.length} C={p.candidates} rate={p.rate:.1f}/s: CPU/pair {p.cpu_ms['total']:.2f} ms "
        f"(event loop {p.cpu_ms['event_loop']:.2f}, device {p.cpu_ms['device']:.2f}, "
        f"other {p.cpu_ms['other']:.2f}); model {p.model_ms:.2f} (in process {p.in_process_model_ms:.2f}); "
        f"not the model {p.non_model_ms:.2f}; Rank P50/P99 {p.rank_p50_ms:.1f}/{p.rank_p99_ms:.1f} ms; "
        f"{p.sources} {p.errors or ''}"
    )


def _provenance() -> dict:
    import torch

    short, dirty = commit()
    return {
        "commit": short,
        "dirty": dirty,
        "torch": torch.__version__,
        "cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _table(rows: list[dict]) -> list[str]:
    lines = [
        "| long-term events | candidates | pairs/s | CPU per pair | model (service) | model (in process) "
        "| not the model | event loop | device | other | serving floor | beyond the floor | switches "
        "| page faults | Rank P50 / P99 | answers |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in rows:
        c = p["cpu_ms"]
        answers = ", ".join(f"{k.removeprefix('CACHE_SOURCE_').lower()} {v}" for k, v in p["sources"].items())
        answers += "".join(f", {k} {v}" for k, v in p["errors"].items())
        lines.append(
            f"| {p['length']} | {p['candidates']} | {p['rate']:.1f} | {c['total']:.2f} "
            f"| {p['model_ms']:.2f} | {p['in_process_model_ms']:.2f} | {p['non_model_ms']:.2f} "
            f"| {c['event_loop']:.2f} | {c['device']:.2f} | {c['other']:.2f} | {p['floor_ms']:.2f} "
            f"| {p['ranker_own_ms']:.2f} | {p['switches']:.0f} | {p['page_faults']:.0f} "
            f"| {p['rank_p50_ms']:.1f} / {p['rank_p99_ms']:.1f} | {answers} |"
        )
    return lines


def summary(result: dict) -> str:
    provenance, configuration = result["provenance"], result["configuration"]
    idle_cpu = result["idle_cpu_ms_per_s"]
    lines = [
        f"# Serving overhead at {provenance['commit']}{' (dirty)' if provenance['dirty'] else ''}",
        "",
        f"`python -m bench.micro.serving`, {configuration['model_preset']}, "
        f"{configuration['torch_threads']} torch thread, {configuration['short_term']} short-term events, "
        "a Rank "
        f"{configuration['relay_delay_ms']:g} ms after its PreInfer with the relay hint; "
        f"{provenance['cores']} cores, torch {provenance['torch']}, {provenance['date']}. "
        "CPU in ms per PreInfer + Rank pair; latency in ms from the Rank's intended send time. The "
        "serving floor is the same requests at the same rate answered by `bench.micro.null_ranker` "
        "(the services' server stack, no ranker). Idle, each process spends a second: "
        + ", ".join(f"{name} {ms:.1f} ms" for name, ms in idle_cpu.items())
        + ".",
        "",
        "## The ranker",
        "",
        *_table(result["points"]),
        "",
        f"Slope of the CPU that is not the model: {result['non_model_ns_per_event']} ns per history event, "
        f"{result['non_model_ns_per_candidate']} ns per candidate; of the CPU beyond the serving floor "
        f"(whose own per-pair cost grows at the long lengths' lower rates): "
        f"{result['beyond_floor_ns_per_event']} ns per history event.",
        "",
        "## The ranker with free model passes (`bench.micro.null_model`), same shapes and rates",
        "",
        *_table(result["null_model"]),
        "",
        "## Capacity: free model passes at production rates",
        "",
        *_table(result["capacity"]),
    ]
    if result["idle"]:
        lines += [
            "",
            "## A cached Rank on an idle ranker, one pair at a time",
            "",
            "| long-term events | through the service, P50 | in process, P50 | difference |",
            "|---|---|---|---|",
        ]
        for length, idle in result["idle"].items():
            service, alone = idle["service_p50_ms"], idle["in_process_p50_ms"]
            lines.append(f"| {length} | {service:.2f} ms | {alone:.2f} ms | {service - alone:+.2f} ms |")
    for p in result["points"]:
        if p["stages"]:
            lines += ["", f"Where the ranker's sampled CPU went at {p['length']} events (py-spy):", ""]
            lines += [f"- {stage}: {share * 100:.1f} %" for stage, share in p["stages"].items()]
    return "\n".join(lines) + "\n"


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "summary.md").write_text(summary(result))


def main(argv: list[str] | None = None) -> None:
    config = load(
        ServingConfig, argv, prog="python -m bench.micro.serving", description=__doc__.split("\n")[0]
    )
    result = asyncio.run(run(config))
    print(summary(result))
    if config.out:
        write(result, Path(config.out))


if __name__ == "__main__":
    main()
