"""RankerService over gRPC: a thin adapter from protobuf to the prefix cache and the model runner.

Validation, caching and the model live elsewhere; this module reads like a table of contents of the
three RPCs. Errors are raised as `services.common.errors` exceptions and mapped to status codes by the
shared interceptor.
"""

from __future__ import annotations

import time

import grpc
import numpy as np

from relaygr.v1 import common_pb2, ranker_pb2, ranker_pb2_grpc
from services.common import metrics, validation
from services.common.errors import DeadlineExceeded, ResourceExhausted, Unavailable
from services.ranker.config import RankerConfig
from services.ranker.events import Events
from services.ranker.prefix_cache import PrefixCache, Source
from services.ranker.profile import LatencyCurve
from services.ranker.runner import ModelRunner
from services.ranker.scheduler import Priority


class RankerServicer(ranker_pb2_grpc.RankerServiceServicer):
    def __init__(
        self,
        config: RankerConfig,
        runner: ModelRunner,
        cache: PrefixCache,
        device: str,
    ) -> None:
        self.config = config
        self.runner = runner
        self.cache = cache
        # Measured at warm-up, before the service reports SERVING.
        self.curve: LatencyCurve | None = None
        self.device = device
        self.num_action_types = runner.model.preset.num_action_types

    def _events(self, seq, field: str, max_events: int, allow_empty: bool) -> Events:
        return Events(*validation.sequence_arrays(seq, field, max_events, self.num_action_types, allow_empty))

    async def PreInfer(self, request: ranker_pb2.PreInferRequest, context) -> ranker_pb2.PreInferResponse:
        validation.user_id(request.user_id)
        events = self._events(request.long_term, "long_term", self.config.max_long_term_events, False)
        outcome, nbytes = await self.cache.pre_infer(request.user_id, events)
        metrics.PRE_INFER_OUTCOMES.labels(metrics.enum_label(ranker_pb2.PreInferOutcome, outcome)).inc()
        return ranker_pb2.PreInferResponse(
            outcome=outcome, instance=self.config.instance_name, cache_bytes=nbytes
        )

    async def Rank(
        self, request: ranker_pb2.RankRequest, context: grpc.aio.ServicerContext
    ) -> ranker_pb2.RankResponse:
        started = time.perf_counter()
        validation.user_id(request.user_id)
        validation.request_id(request.request_id)
        validation.instance_name(request.relay_instance)
        long_term = self._events(request.long_term, "long_term", self.config.max_long_term_events, False)
        short_term = self._events(request.short_term, "short_term", self.config.max_short_term_events, True)
        validation.candidates(request.candidate_item_ids, self.config.max_candidates)
        candidates = np.array(request.candidate_item_ids, dtype=np.int64)
        deadline = self._deadline(context, len(long_term))

        acquired = await self.cache.acquire(request.user_id, long_term, request.relay_instance, deadline)
        try:
            if acquired.entry is None:
                scores = await self.runner.uncached(long_term, short_term, candidates, deadline)
            else:
                scores = await self.runner.rank(acquired.entry.hbm, short_term, candidates, deadline)
        finally:
            self.cache.release(acquired)
        source = acquired.source
        lossy = acquired.entry is not None and acquired.entry.lossy
        metrics.RANK_REQUESTS.labels(source.label).inc()
        if lossy:
            metrics.RANK_LOSSY.labels(source.label).inc()
        if source is Source.MISS:
            metrics.RANK_MISSES.labels(metrics.enum_label(common_pb2.MissReason, acquired.miss_reason)).inc()
        metrics.RANK_LATENCY.labels(source.label).observe(time.perf_counter() - started)
        return ranker_pb2.RankResponse(
            scores=scores,
            cache_source=source.value,
            instance=self.config.instance_name,
            miss_reason=acquired.miss_reason,
            lossy=lossy,
        )

    def _deadline(self, context: grpc.aio.ServicerContext, length: int) -> float | None:
        """Sheds a Rank before any work when its deadline cannot be met or the device queue is full."""
        if self.runner.worker.queued(Priority.RANK) >= self.config.max_queued_ranks:
            metrics.SHED_REQUESTS.labels("Rank", "queue_full").inc()
            raise ResourceExhausted(f"rank queue is full ({self.config.max_queued_ranks} waiting)")
        remaining = context.time_remaining()
        if remaining is None or self.curve is None:
            return None if remaining is None else time.monotonic() + remaining
        cheapest_ms = self.curve.predict_ms("rank_ms", length)
        if remaining * 1000 < cheapest_ms:
            metrics.SHED_REQUESTS.labels("Rank", "deadline").inc()
            raise DeadlineExceeded(
                f"deadline in {remaining * 1000:.1f} ms is shorter than the {cheapest_ms:.1f} ms a rank takes"
            )
        return time.monotonic() + remaining

    async def GetProfile(self, request, context) -> ranker_pb2.GetProfileResponse:
        if self.curve is None:
            raise Unavailable("warming up: the latency curve is not measured yet")
        preset = self.runner.model.preset
        return ranker_pb2.GetProfileResponse(
            preset=preset.name,
            kv_bytes_per_token=preset.kv_bytes_per_token,
            latency_curve=[
                ranker_pb2.LatencyPoint(
                    prefix_length=p.prefix_length,
                    full_ms=p.full_ms,
                    pre_infer_ms=p.pre_infer_ms,
                    rank_ms=p.rank_ms,
                )
                for p in self.curve.points
            ],
            model_version=self.runner.model_version,
            device=self.device,
            instance=self.config.instance_name,
            profile_short_term_length=self.curve.short_term_length,
            profile_num_candidates=self.curve.num_candidates,
            hbm_capacity_bytes=self.cache.hbm.budget_bytes,
            dram_capacity_bytes=self.cache.dram.budget_bytes,
            max_long_term_events=self.config.max_long_term_events,
            fleet_members=1,
        )
