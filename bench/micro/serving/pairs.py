"""PreInfer + Rank pairs: the requests, the open-loop driver, and one measured point."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence

import grpc
import numpy as np

from bench.lib.gpu_monitor import GpuMonitor
from bench.lib.stats import percentile
from bench.micro.serving.config import RANKER_SERVICE, ServingConfig
from bench.micro.serving.cpu import THREAD_GROUPS, model_cpu_s, thread_cpu
from relaygr.v1 import common_pb2, ranker_pb2
from services.launcher.procs import ServiceProcess

RPC_TIMEOUT_S = 30.0


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
    # The busiest GPU's utilization over the measured pairs (`bench.lib.gpu_monitor`); None on a CPU.
    gpu_busy: float | None = None


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
    monitor: GpuMonitor | None = None,
) -> Point:
    metrics_url = f"http://127.0.0.1:{ranker.metrics_port}/metrics"
    delay_s = config.relay_window_ms / 1000
    build = lambda name, count: make_pairs(  # noqa: E731
        f"{tag}-{name}", count, length, config.short_term, candidates, ranker.name, config.seed
    )
    warmup, measured = build("warm", config.warmup_pairs), build("m", pairs)
    if warmup:
        await driver.run(warmup, rate, delay_s)
    cpu_before, model_before = thread_cpu(ranker.popen.pid), model_cpu_s(metrics_url)
    started, window_start = time.perf_counter(), time.monotonic()
    answers = await driver.run(measured, rate, delay_s)
    wall_s = time.perf_counter() - started
    busy = None if monitor is None else monitor.busy(window_start, time.monotonic())
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
        gpu_busy=None if busy is None or busy["busy"] is None else round(busy["busy"], 3),
    )


@dataclasses.dataclass(frozen=True)
class Shape:
    """What one point drives: its history length, candidates, rate and pairs, and the in-process pass
    time of such a pair; `tag` names it (`cap…`: a capacity point)."""

    length: int
    candidates: int
    rate: float
    pairs: int
    in_process_ms: float
    tag: str

    @property
    def capacity(self) -> bool:
        return self.tag.startswith("cap")
