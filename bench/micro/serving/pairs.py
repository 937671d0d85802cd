"""PreInfer + Rank pairs: the requests, the open-loop driver, and one measured point."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from typing import Protocol

import grpc
import numpy as np

from bench.lib.gpu_monitor import GpuMonitor
from bench.lib.stats import percentile
from bench.micro.serving.config import RANKER_SERVICE, ServingConfig
from bench.micro.serving.cpu import THREAD_GROUPS, model_cpu_s, thread_cpu
from relaygr.v1 import common_pb2, ranker_pb2
from services.launcher.procs import ServiceProcess

RPC_TIMEOUT_S = 30.0
HBM = common_pb2.CacheSource.Name(common_pb2.CACHE_SOURCE_HBM)
# A Rank found its prefix ready when it waited less than this for it (no production to wait for).
READY_MS = 1.0


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


# Distinct long-term histories a run of pairs draws from: each pair is a fresh user (the ranker keys its
# caches and its decoded histories by user), and a few hundred distinct histories keep the requests' bytes
# from repeating within a point without building thousands of long sequences for a capacity point.
HISTORIES = 256


def make_pairs(
    tag: str, count: int, length: int, short_term: int, candidates: int, instance: str, seed: int
) -> list[Pair]:
    """Serialized PreInfer and Rank requests of `count` fresh users (built before the clock starts)."""
    rng = np.random.default_rng(seed)
    histories = [_sequence(length, rng) for _ in range(min(count, HISTORIES))]
    pairs = []
    for i in range(count):
        user = f"{tag}-{i}"
        long_term = histories[i % len(histories)]
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


@dataclasses.dataclass(frozen=True)
class PairSpec:
    """What `make_pairs` builds, as a small value a generator process can be sent and build on its side."""

    tag: str
    count: int
    length: int
    short_term: int
    candidates: int
    instance: str
    seed: int

    def build(self) -> list[Pair]:
        return make_pairs(*dataclasses.astuple(self))


# ---- driving ----


@dataclasses.dataclass
class Answers:
    latency_ms: list[float] = dataclasses.field(default_factory=list)  # the Ranks' (PreInfers' alone)
    sources: dict[str, int] = dataclasses.field(default_factory=dict)  # the Ranks' (PreInfers': outcomes)
    errors: dict[str, int] = dataclasses.field(default_factory=dict)
    wall_s: float = 0.0  # from the first intended send to the last answer (`Driver.run`)
    admit_ms: list[float] = dataclasses.field(default_factory=list)  # through a trigger: each Admit's
    ready: int = 0  # Ranks whose prefix was ready in HBM (no wait for a production)
    calls: int = 0  # PreInfer or PreInferBatch calls sent (alone or batched)

    def count(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1


@dataclasses.dataclass(frozen=True)
class Via:
    """How a run's pairs travel (`bench.micro.serving.coalesced`): each PreInfer alone to the ranker, then
    its Rank (the default); with `window_s`, the PreInfers sent within each window as one PreInferBatch;
    with `trigger`, each PreInfer an Admit to that trigger, which fires it. `pre_infers_only` and
    `ranks_only` send one half of the pairs: their PreInfers, or their Ranks."""

    window_s: float = 0.0
    trigger: str = ""
    pre_infers_only: bool = False
    ranks_only: bool = False


SINGLE = Via()  # PreInfer + Rank pairs, each PreInfer alone


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
        answers.calls += 1
        try:
            await self._pre_infer(pair.pre_infer, timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            answers.count(answers.errors, f"PreInfer {error.code().name}")
        await self.rank(pair.rank, send_at + delay_s, answers)

    async def rank(self, rank: bytes, rank_at: float, answers: Answers) -> None:
        """A Rank sent at `rank_at`: its latency from then, its prefix's source, whether it was ready."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, rank_at - loop.time()))
        try:
            answer = await self._rank(rank, timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            answers.count(answers.errors, f"Rank {error.code().name}")
            return
        answers.latency_ms.append((loop.time() - rank_at) * 1000)
        source = common_pb2.CacheSource.Name(answer.cache_source)
        answers.count(answers.sources, source)
        answers.ready += source == HBM and answer.prefix_wait_ms < READY_MS

    async def run(self, pairs: Sequence[Pair], rate: float, delay_s: float) -> Answers:
        answers = Answers()
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.05
        await asyncio.gather(*(self.pair(p, start + i / rate, delay_s, answers) for i, p in enumerate(pairs)))
        answers.wall_s = loop.time() - start
        return answers

    async def sequential(self, pairs: Sequence[Pair], delay_s: float) -> Answers:
        answers = Answers()
        for p in pairs:
            await self.pair(p, asyncio.get_running_loop().time(), delay_s, answers)
        return answers

    async def close(self) -> None:
        await self.channel.close()


@dataclasses.dataclass(frozen=True)
class Driven:
    """One run of pairs: the answers and the CPU seconds the driver's process took over it."""

    answers: Answers
    cpu_s: float


class Load(Protocol):
    """What sends a point's pairs: `generator.Generator` (a process of its own) or `LocalLoad`."""

    async def run(
        self, address: str, spec: PairSpec, rate: float, delay_s: float, via: Via = SINGLE
    ) -> Driven: ...


class LocalLoad:
    """Pairs sent from this process's event loop (a driver per address), its CPU read as the process's."""

    def __init__(self) -> None:
        self.drivers: dict[tuple[str, Via], Driver] = {}

    async def run(
        self, address: str, spec: PairSpec, rate: float, delay_s: float, via: Via = SINGLE
    ) -> Driven:
        """`spec`'s pairs sent to `address` at `rate` a second (0: one after the other, each Rank `delay_s`
        after its PreInfer's answer), their PreInfers as `via` says."""
        driver = self.drivers.get((address, via))
        if driver is None:
            if via == SINGLE:
                driver = Driver(address)
            else:
                from bench.micro.serving.coalesced import CoalescedDriver

                driver = CoalescedDriver(address, via)
            self.drivers[(address, via)] = driver
        pairs = spec.build()
        cpu = time.process_time()
        answers = await (driver.run(pairs, rate, delay_s) if rate else driver.sequential(pairs, delay_s))
        return Driven(answers, time.process_time() - cpu)

    async def close(self) -> None:
        for driver in self.drivers.values():
            await driver.close()


# ---- one point ----


@dataclasses.dataclass(frozen=True)
class Shape:
    """What one point drives: its history length, candidates, rate and pairs, the in-process pass time of
    such a pair, and `load`, which rate it is: `low` (`--rate`), `half` or `capacity` (of the serving
    floor's capacity at this shape), `search` (a step of that capacity's search)."""

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

    def spec(name: str, count: int) -> PairSpec:
        sizes = (shape.length, config.short_term, shape.candidates)
        return PairSpec(f"{tag}-{name}", count, *sizes, ranker.name, config.seed)

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
        admit_p50_ms=round(percentile(answers.admit_ms, 50), 3) if answers.admit_ms else None,
        admit_p99_ms=round(percentile(answers.admit_ms, 99), 3) if answers.admit_ms else None,
        ready=answers.ready,
        calls=answers.calls,
        gpu_busy=None if busy is None or busy["busy"] is None else round(busy["busy"], 3),
    )
