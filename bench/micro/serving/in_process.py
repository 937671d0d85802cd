"""The model alone, in this process: the same passes as the ranker's, timed by thread CPU time."""

from __future__ import annotations

import statistics
import time

import numpy as np

from bench.micro.serving.config import ServingConfig

# ---- the model alone, in this process ----


class InProcess:
    """The ranker's model passes in this process: thread CPU time of a pre-inference and a cached rank."""

    def __init__(self, config: ServingConfig) -> None:
        from services.ranker.app import build_model
        from services.ranker.config import RankerConfig
        from services.ranker.engine.runner import ModelRunner
        from services.ranker.engine.scheduler import Scheduler

        ranker_config = RankerConfig(
            model_preset=config.model_preset, device=config.device, torch_threads=config.torch_threads
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
