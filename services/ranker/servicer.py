"""RankerService over gRPC: protobuf in, data-plane calls, protobuf out.

It validates each request into `Events` and arrays, in one place per request (`_pre_infer_input`,
`_batch_input`, `_rank_input`), calls `DataPlane` once, and writes the answer; it decides nothing. Errors are
raised as `services.common.errors` exceptions and mapped to status codes by the shared interceptor; a
PreInferBatch's bad entry is answered with its own error instead (its field named within the batch,
`requests[i].long_term`), and the other entries go on.

PreInfer, PreInferBatch and Rank are parsed with the wire views of `services.ranker.wire` (`add_to_server`):
the long-term history arrives as bytes, and a history whose bytes the ranker has already decoded (the Rank of
a relayed PreInfer) is taken from the cache instead of being decoded again.
"""

from __future__ import annotations

import time

import grpc
import numpy as np

from relaygr.v1 import ranker_pb2, ranker_pb2_grpc
from services.common import validation
from services.common.errors import InvalidArgument
from services.ranker import wire
from services.ranker.config import RankerConfig
from services.ranker.dataplane import DataPlane, PreInferResult, RankResult
from services.ranker.engine.load import LoadReport
from services.ranker.model.events import Events


def add_to_server(servicer: RankerServicer, server) -> None:
    """Registers `servicer` as the generated `add_RankerServiceServicer_to_server` does, with PreInfer,
    PreInferBatch and Rank parsed by their wire views (same wire format, the long-term history left as
    bytes)."""
    handlers = {
        "PreInfer": grpc.unary_unary_rpc_method_handler(
            servicer.PreInfer,
            request_deserializer=wire.PreInferView.FromString,
            response_serializer=ranker_pb2.PreInferResponse.SerializeToString,
        ),
        "PreInferBatch": grpc.unary_unary_rpc_method_handler(
            servicer.PreInferBatch,
            request_deserializer=wire.PreInferBatchView.FromString,
            response_serializer=ranker_pb2.PreInferBatchResponse.SerializeToString,
        ),
        "Rank": grpc.unary_unary_rpc_method_handler(
            servicer.Rank,
            request_deserializer=wire.RankView.FromString,
            response_serializer=ranker_pb2.RankResponse.SerializeToString,
        ),
        "GetProfile": grpc.unary_unary_rpc_method_handler(
            servicer.GetProfile,
            request_deserializer=ranker_pb2.GetProfileRequest.FromString,
            response_serializer=ranker_pb2.GetProfileResponse.SerializeToString,
        ),
    }
    service = ranker_pb2.DESCRIPTOR.services_by_name["RankerService"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)


class RankerServicer(ranker_pb2_grpc.RankerServiceServicer):
    def __init__(self, config: RankerConfig, plane: DataPlane, device: str) -> None:
        self.config = config
        self.plane = plane
        self.device = device
        self.num_action_types = plane.runner.model.preset.num_action_types
        # An imported item table has rows for its ids only: an id without one is refused, by name.
        self.items = plane.runner.model.item_index

    def _known(self, item_ids: np.ndarray, field: str) -> None:
        unknown = self.items.unknown(item_ids)
        if unknown is not None:
            raise InvalidArgument(
                field, f"holds item id {unknown}, which the model's item table has no row for"
            )

    def _events(
        self, seq, field: str, max_events: int, allow_empty: bool, wire_digest: bytes = b""
    ) -> Events:
        arrays = validation.sequence_arrays(seq, field, max_events, self.num_action_types, allow_empty)
        events = Events(*arrays, wire_digest=wire_digest)
        self._known(events.item_ids, f"{field}.item_ids")
        return events

    def _long_term(self, user_id: str, raw: bytes) -> Events:
        """The long-term history in `raw`: the events already decoded from these bytes when the cache holds
        them, else decoded and validated here."""
        digest = wire.digest(raw)
        events = self.plane.decoded(user_id, digest)
        if events is None:
            seq = wire.sequence(raw, "long_term")
            events = self._events(seq, "long_term", self.config.max_long_term_events, False, digest)
        return events

    async def PreInfer(self, request, context) -> ranker_pb2.PreInferResponse:
        result = await self.plane.pre_infer(*self._pre_infer_input(request))
        return self._pre_infer_response(result, self.plane.load_report())

    async def PreInferBatch(self, request, context) -> ranker_pb2.PreInferBatchResponse:
        inputs = self._batch_input(request)
        valid = [entry for entry in inputs if not isinstance(entry, InvalidArgument)]
        results = iter(await self.plane.pre_infer_batch(valid))
        answers = [
            _refused(entry) if isinstance(entry, InvalidArgument) else _answer(next(results))
            for entry in inputs
        ]
        load = ranker_pb2.LoadReport(**vars(self.plane.load_report()))
        return ranker_pb2.PreInferBatchResponse(
            answers=answers, instance=self.config.instance_name, load=load
        )

    async def Rank(self, request, context: grpc.aio.ServicerContext) -> ranker_pb2.RankResponse:
        received_at = time.perf_counter()
        result = await self.plane.rank(*self._rank_input(request), context.time_remaining(), received_at)
        return self._rank_response(result)

    def _pre_infer_input(self, request) -> tuple[str, Events]:
        """Every check of a PreInfer, in one place: the plane's (user_id, long-term events)."""
        validation.user_id(request.user_id)
        return request.user_id, self._long_term(request.user_id, wire.history(request))

    def _batch_input(self, request) -> list[tuple[str, Events] | InvalidArgument]:
        """Every check of a PreInferBatch: its size (a batch empty or over --max-pre-infer-batch is refused
        whole), then each entry's as `_pre_infer_input`'s, in order: the entry's input, or its error with the
        field named within the batch."""
        count, limit = len(request.requests), self.config.max_pre_infer_batch
        if not count:
            raise InvalidArgument("requests", "is empty")
        if count > limit:
            raise InvalidArgument("requests", f"holds {count} entries, more than the limit of {limit}")
        inputs: list[tuple[str, Events] | InvalidArgument] = []
        for i, entry in enumerate(request.requests):
            try:
                inputs.append(self._pre_infer_input(entry))
            except InvalidArgument as exc:
                inputs.append(exc.within(f"requests[{i}]"))
        return inputs

    def _rank_input(self, request) -> tuple[str, Events, Events, np.ndarray, str]:
        """Every check of a Rank, in one place, in the order of its fields: the plane's (user_id, long-term
        and short-term events, candidates, relay_instance)."""
        validation.user_id(request.user_id)
        validation.request_id(request.request_id)
        validation.instance_name(request.relay_instance)
        long_term = self._long_term(request.user_id, wire.history(request))
        short_term = self._events(request.short_term, "short_term", self.config.max_short_term_events, True)
        candidates = np.array(request.candidate_item_ids, dtype=np.int64)
        validation.candidates(candidates, self.config.max_candidates)
        self._known(candidates, "candidate_item_ids")
        return request.user_id, long_term, short_term, candidates, request.relay_instance

    def _pre_infer_response(self, result: PreInferResult, load: LoadReport) -> ranker_pb2.PreInferResponse:
        return ranker_pb2.PreInferResponse(
            outcome=result.outcome,
            instance=self.config.instance_name,
            cache_bytes=result.cache_bytes,
            load=ranker_pb2.LoadReport(**vars(load)),
        )

    def _rank_response(self, result: RankResult) -> ranker_pb2.RankResponse:
        return ranker_pb2.RankResponse(
            scores=result.scores,
            cache_source=result.source.value,
            instance=self.config.instance_name,
            miss_reason=result.miss_reason,
            lossy=result.lossy,
            computed_prefix_events=result.computed_prefix_events,
            prefix_wait_ms=result.prefix_wait_ms,
        )

    async def GetProfile(self, request, context) -> ranker_pb2.GetProfileResponse:
        profile = self.plane.profile()
        curve = profile.curve
        return ranker_pb2.GetProfileResponse(
            preset=profile.preset,
            kv_bytes_per_token=profile.kv_bytes_per_token,
            latency_curve=[
                ranker_pb2.LatencyPoint(
                    prefix_length=p.prefix_length,
                    full_ms=p.full_ms,
                    pre_infer_ms=p.pre_infer_ms,
                    rank_ms=p.rank_ms,
                )
                for p in curve.points
            ],
            model_version=profile.model_version,
            device=self.device,
            instance=self.config.instance_name,
            profile_short_term_length=curve.short_term_length,
            profile_num_candidates=curve.num_candidates,
            hbm_capacity_bytes=profile.hbm_capacity_bytes,
            dram_capacity_bytes=profile.dram_capacity_bytes,
            max_long_term_events=self.config.max_long_term_events,
            fleet_members=1,
            members=[self.config.instance_name],
            provisional=curve.provisional,
        )


def _answer(result: PreInferResult) -> ranker_pb2.PreInferAnswer:
    return ranker_pb2.PreInferAnswer(outcome=result.outcome, cache_bytes=result.cache_bytes)


def _refused(error: InvalidArgument) -> ranker_pb2.PreInferAnswer:
    return ranker_pb2.PreInferAnswer(
        error=ranker_pb2.PreInferError(code=error.code.value[0], message=error.message)
    )
