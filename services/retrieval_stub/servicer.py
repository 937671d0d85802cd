"""RecommendService as a table of contents: protobuf in, the data plane's recommendation out, and the
stub's calls upstream (`GrpcUpstream`) translating the plane's plain values to and from protobuf.

Everything a Recommend does (validate, retrieve, Admit while pre-processing, Rank, top-k) is
`RecommendPlane.recommend`'s (services/retrieval_stub/dataplane.py); the servicer only translates the
request into that call and the `Recommendation` into a RecommendResponse. `GrpcUpstream` is the transport the
plane is given: TriggerService.Admit over the trigger's channel, and RankerService.Rank through the router or
routed directly (`RankerCalls`), taking the serialised request.
"""

from __future__ import annotations

import logging
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
from services.common import tracing
from services.common.contract import TRIGGER_SERVICE, method_path
from services.retrieval_stub import metrics
from services.retrieval_stub.config import RetrievalStubConfig
from services.retrieval_stub.dataplane import NOT_ADMITTED, Admitted, Ranked, RecommendPlane, Retrieved

log = logging.getLogger(__name__)

ADMIT_METHOD = method_path(TRIGGER_SERVICE, "Admit")


class GrpcUpstream:
    """The plane's `Upstream` over gRPC. `trigger` may be None when the relay is off (no Admit is sent)."""

    def __init__(
        self,
        config: RetrievalStubConfig,
        rankers: RankerCalls,
        trigger: trigger_pb2_grpc.TriggerServiceStub | None,
    ) -> None:
        if config.relay and trigger is None:
            raise ValueError("the relay needs a trigger stub")
        self.config = config
        self.rankers = rankers
        self.trigger = trigger

    def encode(self, retrieved: Retrieved) -> common_pb2.BehaviorSequence:
        return retrieved.history.long_term.to_proto()

    async def admit(self, retrieved: Retrieved, encoded: common_pb2.BehaviorSequence) -> Admitted:
        request = trigger_pb2.AdmitRequest(
            user_id=retrieved.user_id,
            long_term=encoded,
            num_candidates=len(retrieved.candidates),
            short_term_length=self.config.short_term_length,
        )
        try:
            with tracing.client_call(ADMIT_METHOD) as trace_context:
                answer = await self.trigger.Admit(
                    request, timeout=self.config.admit_timeout_ms / 1000, metadata=trace_context
                )
        except grpc.aio.AioRpcError as exc:
            metrics.RECOMMEND_ADMIT_FAILURES.labels(exc.code().name).inc()
            log.debug("Admit for %s failed (%s); ranking without relay", retrieved.user_id, exc.code().name)
            return NOT_ADMITTED
        return Admitted(answer.admitted, answer.reason, answer.relay_instance)

    async def rank(
        self, retrieved: Retrieved, encoded: common_pb2.BehaviorSequence, relay_instance: str
    ) -> Ranked:
        request = ranker_pb2.RankRequest(
            user_id=retrieved.user_id,
            request_id=uuid.uuid4().hex,
            long_term=encoded,
            short_term=retrieved.history.short_term.to_proto(),
            candidate_item_ids=retrieved.candidates.tolist(),
            relay_instance=relay_instance,
        )
        answer = ranker_pb2.RankResponse.FromString(
            await self.rankers.rank(
                request.SerializeToString(),
                retrieved.user_id,
                relay_instance,
                self.config.rank_timeout_ms / 1000,
            )
        )
        return Ranked(
            scores=np.asarray(answer.scores, dtype=np.float32),
            cache_source=answer.cache_source,
            instance=answer.instance,
            miss_reason=answer.miss_reason,
            lossy=answer.lossy,
            computed_prefix_events=answer.computed_prefix_events,
            prefix_wait_ms=answer.prefix_wait_ms,
        )


class RecommendService(recommend_pb2_grpc.RecommendServiceServicer):
    def __init__(self, plane: RecommendPlane) -> None:
        self.plane = plane

    async def Recommend(
        self, request: recommend_pb2.RecommendRequest, context: grpc.aio.ServicerContext
    ) -> recommend_pb2.RecommendResponse:
        answer = await self.plane.recommend(request.user_id, request.top_k)
        return recommend_pb2.RecommendResponse(
            item_ids=answer.item_ids,
            scores=answer.scores,
            abandoned=answer.abandoned,
            cache_source=answer.cache_source,
            lossy=answer.lossy,
            instance=answer.instance,
            admitted=answer.admit.admitted,
            admit_reason=answer.admit.reason,
            miss_reason=answer.miss_reason,
            rank_latency_ms=answer.rank_latency_ms,
            computed_prefix_events=answer.computed_prefix_events,
            prefix_wait_ms=answer.prefix_wait_ms,
            long_term_length=answer.long_term_length,
            request_time_ms=answer.request_time_ms,
        )
