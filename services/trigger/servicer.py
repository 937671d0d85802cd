"""TriggerService.Admit as a table of contents: protobuf in, the data plane's decision out.

Everything an Admit does (validate, predict, decide, fire the PreInfer signal) is `TriggerPlane.admit`'s;
the servicer only translates: an AdmitRequest into an `AdmitCall` (`admit_call`: its repeated fields as they
are, which the plane converts once their counts are checked, and the request serialised as the PreInfer it
becomes, the optimisation `services.trigger.dataplane` states), the decision into an AdmitResponse.
`pre_infer_call` is the PreInfer transport the plane is given: RankerService.PreInfer through the router or
routed directly (`RankerCalls`), taking the already-serialised request; `pre_infer_batch_call`, routing
directly, RankerService.PreInferBatch, whose request it writes around the already-serialised PreInfers
(`batch_request`) without decoding them, and whose answer it turns into one answer or error per entry.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from relaygr.v1 import ranker_pb2, trigger_pb2, trigger_pb2_grpc
from services.affinity.calls import RankerCalls
from services.affinity.client import AffinityClient
from services.common.errors import RequestError
from services.trigger.admission import Reason
from services.trigger.dataplane import (
    AdmitCall,
    BatchEntry,
    PreInferBatchCall,
    PreInferCall,
    PreInferFailed,
    TriggerPlane,
)

_PROTO_REASONS = {reason: trigger_pb2.AdmitReason.Value(f"ADMIT_REASON_{reason.name}") for reason in Reason}

# AdmitRequest's fields that PreInferRequest does not have: cleared, the rest of an Admit is a PreInfer.
ADMIT_ONLY_FIELDS = ("num_candidates", "short_term_length")


def admit_call(request: trigger_pb2.AdmitRequest) -> AdmitCall:
    """`request` as the data plane's `AdmitCall`. Clears the Admit-only fields of `request`: what is left is
    the PreInferRequest of its prefix, serialised once into `AdmitCall.pre_infer`."""
    seq = request.long_term
    sizes = {"short_term_length": request.short_term_length, "num_candidates": request.num_candidates}
    for field in ADMIT_ONLY_FIELDS:
        request.ClearField(field)
    return AdmitCall(
        user_id=request.user_id,
        item_ids=seq.item_ids,
        action_types=seq.action_types,
        timestamps_ms=seq.timestamps_ms,
        pre_infer=request.SerializeToString(),
        **sizes,
    )


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


def pre_infer_batch_call(rankers: AffinityClient) -> PreInferBatchCall:
    """RankerService.PreInferBatch routed directly, taking already-serialised PreInferRequests: the batch's
    load report and each entry's answer (as a single PreInfer's, its load report left empty) or its own
    `PreInferFailed` (the code the ranker refused it with); a failed call raises `PreInferFailed`."""

    async def pre_infer_batch(
        payloads: Sequence[bytes], user_ids: Sequence[str], timeout_s: float, member: str
    ) -> tuple[ranker_pb2.LoadReport, list[BatchEntry]]:
        try:
            raw = await rankers.pre_infer_batch(batch_request(payloads), user_ids, timeout_s, member)
        except grpc.aio.AioRpcError as exc:
            raise PreInferFailed(exc.code().name, exc.details() or "") from exc
        except RequestError as exc:  # no ranker routable
            raise PreInferFailed(exc.code.name, exc.message) from exc
        answer = ranker_pb2.PreInferBatchResponse.FromString(raw)
        if len(answer.answers) != len(payloads):
            raise PreInferFailed("INTERNAL", f"{len(answer.answers)} answers to {len(payloads)} PreInfers")
        return answer.load, [_entry(entry, answer.instance) for entry in answer.answers]

    return pre_infer_batch


def _entry(answer: ranker_pb2.PreInferAnswer, instance: str) -> BatchEntry:
    if answer.HasField("error"):
        return PreInferFailed(_CODE_NAMES.get(answer.error.code, "UNKNOWN"), answer.error.message)
    return ranker_pb2.PreInferResponse(
        outcome=answer.outcome, instance=instance, cache_bytes=answer.cache_bytes
    )


_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
# PreInferBatchRequest.requests: field 1, length-delimited.
_REQUESTS_TAG = bytes([1 << 3 | 2])


def batch_request(payloads: Sequence[bytes]) -> bytes:
    """The PreInferBatchRequest whose `requests` are these serialised PreInferRequests, written around them
    as protobuf writes a repeated message field (tag, length, bytes), so no history is decoded or copied
    into a message again."""
    return b"".join(_REQUESTS_TAG + _varint(len(payload)) + payload for payload in payloads)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class TriggerService(trigger_pb2_grpc.TriggerServiceServicer):
    def __init__(self, plane: TriggerPlane) -> None:
        self.plane = plane

    async def Admit(
        self, request: trigger_pb2.AdmitRequest, context: grpc.aio.ServicerContext
    ) -> trigger_pb2.AdmitResponse:
        decision = await self.plane.admit(admit_call(request))
        return trigger_pb2.AdmitResponse(
            admitted=decision.admitted,
            reason=_PROTO_REASONS[decision.reason],
            relay_instance=decision.relay_instance,
        )
