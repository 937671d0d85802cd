"""The ranker's model passes alone, in this process: the same passes as the ranker's, on the same preset,
device and threads, timed by thread CPU time (a pre-inference and a cached rank) and wall time."""

from __future__ import annotations

import statistics
import time

import numpy as np

from bench.micro.serving.config import ServingConfig


class InProcess:
    def __init__(self, config: ServingConfig) -> None:
        from services.ranker.app import build_model
        from services.ranker.config import RankerConfig
        from services.ranker.engine.runner import ModelRunner
        from services.ranker.engine.scheduler import Scheduler

        ranker = RankerConfig(
            model_preset=config.model_preset, device=config.device, torch_threads=config.torch_threads
        )
        model, version, _ = build_model(ranker)
        self.worker = Scheduler("in-process")
        chunk, batch = ranker.pre_infer_chunk_tokens, ranker.rank_batch_max
        self.runner = ModelRunner(model, self.worker, chunk, None, version, rank_batch_max=batch)
        self.rng, self.short_term = np.random.default_rng(config.seed), config.short_term

    def _inputs(self, length: int, candidates: int) -> tuple:
        from services.ranker.model.events import Events

        long, short = (
            (self.rng.integers(0, 10**6, n), self.rng.integers(0, 8, n)) for n in (length, self.short_term)
        )
        return Events.of(*long), Events.of(*short), self.rng.integers(0, 10**6, candidates)

    def pair_ms(self, length: int, candidates: int, repeats: int = 7) -> tuple[float, float]:
        """Median thread CPU ms of (a pre-inference + a cached rank, the cached rank alone)."""
        long, short, items = self._inputs(length, candidates)
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
        long, short, items = self._inputs(length, candidates)
        prefix, times = self.runner.build_sync(long, background=True), []
        for _ in range(repeats + 1):
            started = time.perf_counter()
            self.runner.rank_sync(prefix, short, items)
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times[1:])

    def close(self) -> None:
        self.worker.close()
