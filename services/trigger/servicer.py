"""TriggerService.Admit as a table of contents: protobuf in, the data plane's decision out.

Everything an Admit does (validate, predict, decide, fire the PreInfer signal) is `TriggerPlane.admit`'s;
the servicer only translates the decision into an AdmitResponse. `pre_infer_call` is the PreInfer transport
the plane is given: RankerService.PreInfer through the router or routed directly (`RankerCalls`), taking
the already-serialised request.
"""

from __future__ import annotations

import grpc

from relaygr.v1 import ranker_pb2, trigger_pb2, trigger_pb2_grpc
from services.affinity.calls import RankerCalls
from services.common.errors import RequestError
from services.trigger.admission import Reason
from services.trigger.dataplane import PreInferCall, PreInferFailed, TriggerPlane

_PROTO_REASONS = {reason: trigger_pb2.AdmitReason.Value(f"ADMIT_REASON_{reason.name}") for reason in Reason}


def pre_infer_call(rankers: RankerCalls) -> PreInferCall:
    """RankerService.PreInfer through `rankers`, taking an already-serialised PreInferRequest; a failed call
    raises `PreInferFailed` with its status code's name."""

    async def pre_infer(
        payload: bytes, user_id: str, timeout_s: float, member: str
    ) -> ranker_pb2.PreInferResponse:
        try:
            answer = await rankers.pre_infer(payload, user_id, timeout_s, member)
        except grpc.aio.AioRpcError as exc:
            raise PreInferFailed(exc.code().name, exc.details() or "") from exc
        except RequestError as exc:  # direct routing: no ranker routable
            raise PreInferFailed(exc.code.name, exc.message) from exc
        return ranker_pb2.PreInferResponse.FromString(answer)

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
