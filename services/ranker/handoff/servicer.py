"""CacheHandoffService over gRPC: a drain's Push received, and a peer's Fetch answered, each only for
another ranker of the fleet (`services.ranker.handoff.auth`)."""

from __future__ import annotations

import grpc

from relaygr.v1 import handoff_pb2, handoff_pb2_grpc
from services.common import validation
from services.common.errors import InvalidArgument
from services.ranker.cache import kv_wire as codec
from services.ranker.cache.admission import Admission
from services.ranker.handoff.auth import Gate
from services.ranker.handoff.receive import StreamError, receive
from services.ranker.model.events import Events


class HandoffServicer(handoff_pb2_grpc.CacheHandoffServiceServicer):
    def __init__(self, admission: Admission, instance: str, gate: Gate, chunk_timeout_s: float) -> None:
        self.admission = admission
        self.instance = instance
        self.gate = gate
        self.chunk_timeout_s = chunk_timeout_s

    async def Push(self, request_iterator, context: grpc.aio.ServicerContext) -> handoff_pb2.PushResponse:
        await self.gate.check(context, "Push")
        try:
            tally = await receive(request_iterator, self.admission, chunk_timeout_s=self.chunk_timeout_s)
        except StreamError as exc:
            await context.abort(exc.code, str(exc))
        return tally.receipt(self.instance)

    async def Fetch(self, request: handoff_pb2.FetchRequest, context: grpc.aio.ServicerContext):
        await self.gate.check(context, "Fetch")
        admission = self.admission
        try:
            validation.user_id(request.user_id)
            arrays = validation.sequence_arrays(
                request.long_term, "long_term", admission.max_events, admission.num_action_types, False
            )
        except InvalidArgument as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        cache = admission.cache
        if request.model_version != cache.runner.model_version or request.layout != admission.layout:
            return  # its KV would mean nothing there: an empty answer
        entry = admission.find(request.user_id, Events(*arrays))
        payload = None if entry is None else await admission.payload(entry)
        if payload is not None:
            for chunk in codec.chunks(*payload):
                yield handoff_pb2.FetchResponse(chunk=chunk)


def add_to_server(servicer: HandoffServicer, server) -> None:
    handoff_pb2_grpc.add_CacheHandoffServiceServicer_to_server(servicer, server)
