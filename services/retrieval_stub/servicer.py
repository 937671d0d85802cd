"""`RecommendService`: the cascade from retrieval to ranking, with the relay race started at retrieval.

One Recommend:

1. validates the request (`user_id`; `top_k` in 1..num_candidates);
2. retrieval: reads the user's history and candidates from the universe at one request time, which the
   response returns (`request_time_ms`) so the exact ranking request can be rebuilt;
3. with the relay on, calls `TriggerService.Admit` while pre-processing runs (`relay_window_ms`, the
   relay window); an Admit that fails or misses its deadline only means no relay hint, never a failed
   Recommend. With the relay off (the baseline) no Admit is sent;
4. with `abandon_fraction` > 0, a share of requests is filtered upstream during pre-processing: such a
   request still did its retrieval and its Admit (so the trigger may have pre-inferred a prefix that no
   Rank will consume) and answers OK with `abandoned` set and nothing ranked. Which requests are abandoned
   is a hash of (universe seed, user, request time) (`abandoned`), not a process's random state, so the
   relay and the baseline abandon the same requests;
5. ranks the candidates, passing the Admit answer's `relay_instance` as the hint: through the router
   (waited for within the Rank deadline when it is not reachable, e.g. while it restarts), or routed
   directly to the ranker (`services.affinity`, with `--rankers`/`--rankers-srv`);
6. answers the top-k candidates by score, best first, with where the ranking's prefix came from.

A failed Rank fails the Recommend with the Rank's own status code.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid

import grpc
import numpy as np

from relaygr.v1 import (
    common_pb2,
    ranker_pb2,
    recommend_pb2,
    recommend_pb2_grpc,
    trigger_pb2,
    trigger_pb2_grpc,
)
from services.affinity.calls import RankerCalls
from services.common import tracing, validation
from services.common.contract import TRIGGER_SERVICE, cache_source_label, method_path
from services.common.metrics import Children
from services.retrieval_stub import metrics
from services.retrieval_stub.config import RetrievalStubConfig
from services.workload.universe import UserUniverse

log = logging.getLogger(__name__)

_LATENCY = Children(metrics.RECOMMEND_LATENCY)
ADMIT_METHOD = method_path(TRIGGER_SERVICE, "Admit")
_RECOMMENDS = Children(metrics.RECOMMENDS)


def top_k_order(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k highest scores, best first; equal scores keep candidate order."""
    return np.argsort(-scores, kind="stable")[:k]


def abandoned(universe_seed: int, user_id: str, request_time_ms: int, fraction: float) -> bool:
    """Whether the request of `user_id` at `request_time_ms` is filtered before ranking: a uniform draw
    from a blake2b digest of (seed, user, time), below `fraction`. The same in every process and mode."""
    if fraction <= 0:
        return False
    key = f"{universe_seed}\x00{user_id}\x00{request_time_ms}".encode()
    word = int.from_bytes(hashlib.blake2b(key, digest_size=8, person=b"abandon").digest(), "little")
    return word / 2**64 < fraction


class RecommendService(recommend_pb2_grpc.RecommendServiceServicer):
    """The retrieval stub's servicer. Stateless apart from its channels; safe for concurrent RPCs."""

    def __init__(
        self,
        config: RetrievalStubConfig,
        universe: UserUniverse,
        rankers: RankerCalls,
        trigger: trigger_pb2_grpc.TriggerServiceStub | None,
    ) -> None:
        if config.relay and trigger is None:
            raise ValueError("the relay needs a trigger stub")
        self.config = config
        self.universe = universe
        self.rankers = rankers
        self.trigger = trigger

    async def Recommend(
        self, request: recommend_pb2.RecommendRequest, context: grpc.aio.ServicerContext
    ) -> recommend_pb2.RecommendResponse:
        started = time.perf_counter()
        user_id = validation.user_id(request.user_id)
        top_k = validation.positive(request.top_k, "top_k", self.universe.config.num_candidates)

        now_ms = self.universe.now_ms()
        history = self.universe.history(user_id, now_ms)
        candidates = self.universe.candidates(user_id, now_ms)
        long_term = history.long_term.to_proto()

        span = tracing.current()
        if span.is_recording():
            span.set_attributes(
                {
                    "relaygr.user_hash": tracing.user_hash(user_id),
                    "relaygr.long_term_length": len(long_term.item_ids),
                }
            )
        admit, _ = await asyncio.gather(
            self._admit(user_id, long_term, len(candidates)),
            self._preprocess(),
        )
        if span.is_recording():
            span.set_attributes(
                {"relaygr.admitted": admit.admitted, "relaygr.relay_instance": admit.relay_instance}
            )
        if abandoned(self.universe.config.universe_seed, user_id, now_ms, self.config.abandon_fraction):
            metrics.RECOMMEND_ABANDONED.inc()
            span.set_attribute("relaygr.abandoned", True)
            return recommend_pb2.RecommendResponse(
                abandoned=True,
                admitted=admit.admitted,
                admit_reason=admit.reason,
                long_term_length=len(history.long_term),
                request_time_ms=now_ms,
            )

        rank_started = time.perf_counter()
        request = ranker_pb2.RankRequest(
            user_id=user_id,
            request_id=uuid.uuid4().hex,
            long_term=long_term,
            short_term=history.short_term.to_proto(),
            candidate_item_ids=candidates.tolist(),
            relay_instance=admit.relay_instance,
        )
        answer = await self.rankers.rank(
            request.SerializeToString(), user_id, admit.relay_instance, self.config.rank_timeout_ms / 1000
        )
        ranked = ranker_pb2.RankResponse.FromString(answer)
        rank_seconds = time.perf_counter() - rank_started

        scores = np.asarray(ranked.scores, dtype=np.float32)
        best = top_k_order(scores, top_k)
        exemplar = tracing.exemplar()
        _LATENCY("rank").observe(rank_seconds, exemplar)
        _LATENCY("total").observe(time.perf_counter() - started, exemplar)
        if span.is_recording():
            span.set_attributes(
                {
                    "relaygr.cache_source": cache_source_label(ranked.cache_source),
                    "relaygr.instance": ranked.instance,
                }
            )
        _RECOMMENDS(cache_source_label(ranked.cache_source)).inc()
        return recommend_pb2.RecommendResponse(
            item_ids=candidates[best].tolist(),
            scores=scores[best].tolist(),
            cache_source=ranked.cache_source,
            lossy=ranked.lossy,
            instance=ranked.instance,
            admitted=admit.admitted,
            admit_reason=admit.reason,
            miss_reason=ranked.miss_reason,
            rank_latency_ms=rank_seconds * 1000,
            computed_prefix_events=ranked.computed_prefix_events,
            prefix_wait_ms=ranked.prefix_wait_ms,
            long_term_length=len(history.long_term),
            request_time_ms=now_ms,
        )

    async def _preprocess(self) -> None:
        """Pre-processing (feature assembly upstream of ranking), simulated: the window in which the relay
        pre-infers the prefix. A span of its own in a sampled trace."""
        with tracing.span("preprocess", window_ms=self.config.relay_window_ms):
            await asyncio.sleep(self.config.relay_window_ms / 1000)

    async def _admit(
        self, user_id: str, long_term: common_pb2.BehaviorSequence, num_candidates: int
    ) -> trigger_pb2.AdmitResponse:
        """The trigger's answer; an empty one (not admitted, no hint) for the baseline or when Admit fails."""
        if not self.config.relay:
            return trigger_pb2.AdmitResponse()
        try:
            with tracing.client_call(ADMIT_METHOD) as trace_context:
                return await self.trigger.Admit(
                    trigger_pb2.AdmitRequest(
                        user_id=user_id,
                        long_term=long_term,
                        num_candidates=num_candidates,
                        short_term_length=self.universe.config.short_term_length,
                    ),
                    timeout=self.config.admit_timeout_ms / 1000,
                    metadata=trace_context,
                )
        except grpc.aio.AioRpcError as exc:
            metrics.RECOMMEND_ADMIT_FAILURES.labels(exc.code().name).inc()
            log.debug("Admit for %s failed (%s); ranking without relay", user_id, exc.code().name)
            return trigger_pb2.AdmitResponse()
