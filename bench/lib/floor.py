"""Where the time goes: the model's own latency (the physical floor) and the cached Rank through the fleet.

`model_floor` builds the ranker's model and `ModelRunner` in this process and times, with the ranker's own
warm-up profiler (`services.ranker.engine.latency_curve.measure`), a full forward over L + S + C tokens, a
pre-inference of L tokens and a cached rank of S + C tokens against a ready prefix: the floor of RelayGR's
critical path. `cached_rank_through_router` measures what the serving path adds to it: per length, a
PreInfer through the fleet's router (leasing the prefix in HBM), then a Rank with the relay hint, on an
idle fleet, timed from the client's call to its answer. `host_unit_ms` is the host's unit u.
"""

from __future__ import annotations

import collections
import concurrent.futures
import multiprocessing
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc
import numpy as np
import torch

from bench.lib.schema import CachedRankPoint, FloorPoint
from bench.lib.stats import percentile
from relaygr.v1 import common_pb2, ranker_pb2, ranker_pb2_grpc
from services.common.contract import cache_source_label
from services.ranker.app import build_model
from services.ranker.config import RankerConfig
from services.ranker.engine.latency_curve import Profiling, Timer, measure
from services.ranker.engine.runner import ModelRunner
from services.ranker.engine.scheduler import Scheduler

RPC_TIMEOUT_S = 60.0
T = TypeVar("T")


def model_floor(
    preset: str,
    torch_threads: int,
    lengths: Sequence[int],
    short_term: int,
    candidates: int,
    repeats: int,
    chunk_tokens: int,
    device: str = "cpu",
) -> list[FloorPoint]:
    """Median in-process latency of full, pre-infer and cached rank at each prefix length, on `device` (as
    the rankers' `--device`); an accelerator's cached memory is handed back afterwards for the rankers."""
    worker = Scheduler("floor")
    try:  # the timer, and its model, are dropped once measured
        curve = measure(_timer(preset, torch_threads, lengths, short_term, candidates, repeats, chunk_tokens,
                               worker, device))  # fmt: skip
    finally:
        worker.close()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    fields = ("prefix_length", "full_ms", "pre_infer_ms", "rank_ms")
    return [FloorPoint(**{name: getattr(p, name) for name in fields}) for p in curve.points]


def _timer(preset: str, torch_threads: int, lengths: Sequence[int], short_term: int, candidates: int,
           repeats: int, chunk_tokens: int, worker: Scheduler, device: str = "cpu") -> Timer:  # fmt: skip
    """The ranker's warm-up profiler (`Timer`) over a model of `preset` built now on `device`, its passes
    run by `worker`."""
    config = RankerConfig(
        model_preset=preset, device=device, torch_threads=torch_threads, max_long_term_events=max(lengths)
    )
    model, version, _ = build_model(config)
    runner = ModelRunner(model, worker, chunk_tokens, None, version)
    profiling = Profiling(sorted(lengths), short_term, candidates, repeats, retries=0, disturbed_ratio=None)
    return Timer(runner, profiling)


def in_fresh_process(function: Callable[..., T], *args: Any) -> T:
    """`function(*args)` in a fresh Python process (spawned, its arguments and answer pickled): a floor
    timed so finds the interpreter as every other did, not the load generator's heap, threads or allocator."""
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as apart:
        return apart.submit(function, *args).result()


def _behavior(length: int, first_item: int, rng: np.random.Generator) -> common_pb2.BehaviorSequence:
    start_ms = 1_700_000_000_000
    return common_pb2.BehaviorSequence(
        item_ids=(first_item + rng.integers(0, 10**6, length)).tolist(),
        action_types=rng.integers(0, 8, length).tolist(),
        timestamps_ms=range(start_ms, start_ms + length * 1000, 1000),
    )


def cached_rank_through_router(
    router: str, lengths: Sequence[int], short_term: int, candidates: int, iterations: int
) -> list[CachedRankPoint]:
    """Client-observed latency of Ranks served from a pre-inferred prefix, through the router."""
    rng = np.random.default_rng(0)
    points = []
    with grpc.insecure_channel(router) as channel:
        stub = ranker_pb2_grpc.RankerServiceStub(channel)
        for length in lengths:
            user_id = f"floor-{length}"
            long_term = _behavior(length, 0, rng)
            request = ranker_pb2.RankRequest(
                user_id=user_id,
                long_term=long_term,
                short_term=_behavior(short_term, 10**7, rng),
                candidate_item_ids=rng.integers(0, 10**6, candidates).tolist(),
            )
            pre_infer = ranker_pb2.PreInferRequest(user_id=user_id, long_term=long_term)
            request.relay_instance = stub.PreInfer(pre_infer, timeout=RPC_TIMEOUT_S).instance
            stub.Rank(request, timeout=RPC_TIMEOUT_S)  # joins the production: the prefix is ready after it
            hbm_ms, serialize_ms = [], []
            sources: collections.Counter[str] = collections.Counter()
            for _ in range(iterations):
                stub.PreInfer(pre_infer, timeout=RPC_TIMEOUT_S)  # lease it in HBM again (a reload from DRAM)
                started = time.perf_counter()
                payload = request.SerializeToString()
                serialize_ms.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                answer = stub.Rank(request, timeout=RPC_TIMEOUT_S)
                elapsed_ms = (time.perf_counter() - started) * 1000
                source = cache_source_label(answer.cache_source)
                sources[source] += 1
                if source == "hbm":
                    hbm_ms.append(elapsed_ms)
            points.append(
                CachedRankPoint(
                    prefix_length=length,
                    request_kib=round(len(payload) / 1024, 1),
                    serialize_ms=round(statistics.median(serialize_ms), 3),
                    rank_ms_p50=round(percentile(hbm_ms, 50), 3) if hbm_ms else None,
                    rank_ms_p99=round(percentile(hbm_ms, 99), 3) if hbm_ms else None,
                    sources=dict(sources),
                )
            )
    return points


UNIT_LENGTH = 2048  # the CPU benchmark's first mix's cap: the host unit's length unless a run says otherwise
UNIT_CANDIDATES = 128  # the stub's default retrieval size


def host_unit_ms(preset: str, torch_threads: int, short_term: int, chunk_tokens: int,
                 length: int = UNIT_LENGTH, repeats: int = 3) -> float:  # fmt: skip
    """The host's unit u: the in-process full pass of `preset` at `length` events, timed in a fresh
    process (`in_fresh_process`), as the CPU benchmark times it at its start (`bench.run.experiments`)."""
    floor = in_fresh_process(
        model_floor, preset, torch_threads, [length], short_term, UNIT_CANDIDATES, repeats, chunk_tokens
    )
    return next(point.full_ms for point in floor if point.prefix_length == length)
