"""The router's `relaygr.v1.RankerService`: a transparent affinity proxy that forwards raw request bytes.

Contract:
- Handlers are registered without (de)serializers, so requests and responses stay bytes: the router reads
  only `RoutingKey` (user_id, relay_instance) from a PreInfer or Rank request and forwards the original
  bytes, never decoding or re-encoding the long behaviour sequences. Only the small GetProfile answer is
  re-encoded, to report the routable members and the ring's virtual nodes.
- An empty or oversized user_id, or bytes that do not parse, are INVALID_ARGUMENT before any forward.
- Forwards get the caller's remaining time minus `deadline_margin_ms` (or `default_timeout_ms` when the
  caller set no deadline). A downstream error keeps its status code: the `AioRpcError` propagates and the
  shared interceptor re-raises it with its own code and details.
- Where each call goes, start-up, failover and hedging are `services.affinity.client.AffinityClient`'s,
  the same code a trigger or retrieval stub runs in process when it routes directly.
"""

from __future__ import annotations

import grpc
from google.protobuf.message import DecodeError

from relaygr.v1 import routing_pb2
from services.affinity.client import AffinityClient
from services.common import validation
from services.common.contract import RANKER_SERVICE
from services.common.errors import DeadlineExceeded, InvalidArgument
from services.common.interceptor import Interceptor


def routing_key(request: bytes) -> routing_pb2.RoutingKey:
    """The routing fields of a serialized PreInferRequest or RankRequest, validated."""
    try:
        key = routing_pb2.RoutingKey.FromString(request)
    except DecodeError as exc:
        raise InvalidArgument("request", f"is not a valid protobuf message ({exc})") from exc
    validation.user_id(key.user_id)
    return key


class RankerProxy:
    """Serves RankerService by forwarding each call through the affinity client."""

    def __init__(self, client: AffinityClient, deadline_margin_ms: float, default_timeout_ms: float) -> None:
        self.client = client
        self._margin_s = deadline_margin_ms / 1000
        self._default_timeout_s = default_timeout_ms / 1000

    def register(self, server: Interceptor) -> None:
        # No (de)serializers: the handlers receive and return the wire bytes.
        handlers = {
            "PreInfer": grpc.unary_unary_rpc_method_handler(self.pre_infer),
            "Rank": grpc.unary_unary_rpc_method_handler(self.rank),
            "GetProfile": grpc.unary_unary_rpc_method_handler(self.get_profile),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(RANKER_SERVICE, handlers),))

    async def pre_infer(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        key = routing_key(request)
        return await self.client.pre_infer(request, key.user_id, self._timeout(context))

    async def rank(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        key = routing_key(request)
        validation.instance_name(key.relay_instance)
        return await self.client.rank(request, key.user_id, key.relay_instance, self._timeout(context))

    async def get_profile(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        profile = await self.client.get_profile(request, self._timeout(context))
        return profile.SerializeToString()

    def _timeout(self, context: grpc.aio.ServicerContext) -> float:
        remaining = context.time_remaining()
        if remaining is None:
            return self._default_timeout_s
        timeout = remaining - self._margin_s
        if timeout <= 0:
            raise DeadlineExceeded(f"{remaining * 1000:.1f} ms left, within the forwarding margin")
        return timeout
