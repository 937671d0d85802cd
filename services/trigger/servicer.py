"""TriggerService.Admit as a table of contents: protobuf in, the data plane's decision out.

Everything an Admit does (validate, predict, decide, fire the PreInfer signal) is `TriggerPlane.admit`'s;
the servicer only translates the decision into an AdmitResponse. `pre_infer_call` is the PreInfer transport
the plane is given: RankerService.PreInfer through the router, taking the already-serialised request.
"""

from __future__ import annotations

import grpc

from relaygr.v1 import ranker_pb2, trigger_pb2, trigger_pb2_grpc
from services.common import tracing
from services.common.contract import RANKER_SERVICE, method_path
from services.trigger.admission import Reason
from services.trigger.dataplane import PreInferCall, PreInferFailed, TriggerPlane

PRE_INFER_METHOD = method_path(RANKER_SERVICE, "PreInfer")

_PROTO_REASONS = {reason: trigger_pb2.AdmitReason.Value(f"ADMIT_REASON_{reason.name}") for reason in Reason}


def pre_infer_call(channel: grpc.aio.Channel) -> PreInferCall:
    """RankerService.PreInfer over `channel`, taking an already-serialised PreInferRequest; a failed call
    raises `PreInferFailed` with its status code's name."""
    call = channel.unary_unary(PRE_INFER_METHOD, response_deserializer=ranker_pb2.PreInferResponse.FromString)

    async def pre_infer(payload: bytes, timeout_s: float) -> ranker_pb2.PreInferResponse:
        try:
            with tracing.client_call(PRE_INFER_METHOD) as trace_context:
                return await call(payload, timeout=timeout_s, metadata=trace_context)
        except grpc.aio.AioRpcError as exc:
            raise PreInferFailed(exc.code().name, exc.details() or "") from exc

    return pre_infer


class TriggerService(trigger_pb2_grpc.TriggerServiceServicer):
    def __init__(self, plane: TriggerPlane) -> None:
        self.plane = plane

    async def Admit(
        self, request: trigger_pb2.AdmitRequest, context: grpc.aio.ServicerContext
    ) -> trigger_pb2.AdmitResponse:
        decision = await self.plane.admit(request)
        return trigger_pb2.AdmitResponse(
            admitted=decision.admitted,
            reason=_PROTO_REASONS[decision.reason],
            relay_instance=decision.relay_instance,
        )
