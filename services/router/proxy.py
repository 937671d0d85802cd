"""The router's `relaygr.v1.RankerService`: a transparent affinity proxy that forwards raw request bytes.

Contract:
- Handlers are registered without (de)serializers, so requests and responses stay bytes: the router reads
  only `RoutingKey` (user_id, relay_instance) from a PreInfer or Rank request and forwards the original
  bytes, never decoding or re-encoding the long behaviour sequences. Only the small GetProfile answer is
  re-encoded, to report the routable members (`fleet_members`, their names in `members`) and the ring's
  virtual nodes: with them the trigger places users on the same ring to tell which ranker it loads.
- An empty or oversized user_id, or bytes that do not parse, are INVALID_ARGUMENT before any forward.
- Forwards get the caller's remaining time minus `deadline_margin_ms` (or `default_timeout_ms` when the
  caller set no deadline). A downstream error keeps its status code: the `AioRpcError` propagates and the
  shared interceptor re-raises it with its own code and details.
- A request that arrives while the router starts, before any member is healthy and while some member's
  first health check is still out, waits for start-up to settle (within its deadline) instead of failing:
  clients redial a restarted router within milliseconds. Once settled, no request waits: with no member
  routable it is UNAVAILABLE at once.
- A Rank that fails with UNAVAILABLE is retried once on the failover member; PreInfer is a hint and is
  never retried. Every forward attempt counts one routing decision, so a failed-over Rank counts two.
- A Rank still unanswered after half its time (`HEDGE_AT` of the forward timeout) is hedged: sent also
  to the failover member, and the first answer wins (the other attempt is cancelled); when both fail,
  the caller gets the failover attempt's error. A member cut off the network (packets dropped, no reset)
  fails nothing: it takes its health checks `--health-timeouts` intervals to leave the ring, and without
  the hedge every Rank sent to it meanwhile, and every one in flight when it went, would wait out its
  whole deadline. Only a silent member is hedged: one that has answered no call of this router in the
  last half of the wait (a quarter of the forward timeout). A member that is slow because it is busy
  keeps answering other calls, and a hedge would only add load where the fleet has least room, so its
  Rank is waited for; a member cut off just after answering a call is silent for the whole wait of a
  Rank it had not answered. The hedge is one failover-decision forward, and each Rank is sent twice at
  most.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
from google.protobuf.message import DecodeError

from relaygr.v1 import ranker_pb2, routing_pb2
from services.common import tracing, validation
from services.common.contract import RANKER_SERVICE, method_path
from services.common.errors import DeadlineExceeded, InvalidArgument
from services.common.interceptor import Interceptor
from services.common.metrics import Children
from services.router.membership import Member
from services.router.metrics import ROUTER_DECISIONS, ROUTER_INFLIGHT
from services.router.routing import Route, RoutingPolicy

# A Rank without an answer after this share of its forward timeout is hedged on the failover member,
# which then has the other share: each attempt gets half.
HEDGE_AT = 0.5
# Codes of a forward the member did not answer: no connection, our own deadline, or our cancellation.
NO_ANSWER_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
# (ROUTER_INFLIGHT's series are not kept: the membership removes a departed member's.)
_DECISIONS = Children(ROUTER_DECISIONS)


def routing_key(request: bytes) -> routing_pb2.RoutingKey:
    """The routing fields of a serialized PreInferRequest or RankRequest, validated."""
    try:
        key = routing_pb2.RoutingKey.FromString(request)
    except DecodeError as exc:
        raise InvalidArgument("request", f"is not a valid protobuf message ({exc})") from exc
    validation.user_id(key.user_id)
    return key


class RankerProxy:
    """Serves RankerService by forwarding each call to the member the routing policy picks."""

    def __init__(self, policy: RoutingPolicy, deadline_margin_ms: float, default_timeout_ms: float) -> None:
        self.policy = policy
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
        await self._started(context)
        return await self._send(self.policy.choose(key.user_id), "PreInfer", request, context)

    async def rank(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        key = routing_key(request)
        validation.instance_name(key.relay_instance)
        await self._started(context)
        route = self.policy.choose(key.user_id, key.relay_instance)
        hedge_after = self._timeout(context) * HEDGE_AT
        attempts = [self._send(route, "Rank", request, context)]
        try:
            await asyncio.wait(attempts, timeout=hedge_after)
            first = attempts[0]
            if first.done() and not _unavailable(first):
                return first.result()  # the answer, or an error that another member would repeat
            if not first.done() and time.monotonic() - route.member.last_answer < hedge_after / 2:
                return await first  # busy, not gone: it answers other calls
            # UNAVAILABLE, or no answer in half the time: the failover member gets the Rank too.
            retry = self.policy.failover(key.user_id, failed=route.member.name)
            if retry is None:
                return await first
            attempts.append(self._send(retry, "Rank", request, context))
            return await _first_answer(attempts)
        finally:
            _settle(attempts)

    async def get_profile(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await self._started(context)
        answer = await self._forward(self.policy.least_loaded(), "GetProfile", request, context)
        profile = ranker_pb2.GetProfileResponse.FromString(answer)
        membership = self.policy.membership
        routable = membership.routable()
        profile.fleet_members = len(routable)
        del profile.members[:]
        profile.members.extend(sorted(member.name for member in routable))
        profile.ring_virtual_nodes = membership.ring.virtual_nodes
        return profile.SerializeToString()

    def _send(
        self, route: Route, method: str, request: bytes, context: grpc.aio.ServicerContext
    ) -> asyncio.Task[bytes]:
        _DECISIONS(method, route.decision.value).inc()
        return self._forward(route.member, method, request, context)

    def _forward(
        self, member: Member, method: str, request: bytes, context: grpc.aio.ServicerContext
    ) -> asyncio.Task[bytes]:
        """Starts the call on `member`, counted in flight there at once: in the same step of the event loop
        as the routing decision that chose it, so the next request's placement sees it. (Counted when the
        call's coroutine first ran, concurrent requests of one user all read the loads from before any of
        them and together passed the bound.) The count drops when the call ends, however it ends."""
        timeout = self._timeout(context)
        member.in_flight += 1
        ROUTER_INFLIGHT.labels(member.name).set(member.in_flight)
        call = asyncio.ensure_future(self._call(member, method, request, timeout))
        call.add_done_callback(lambda _: _finished(member))
        return call

    @staticmethod
    async def _call(member: Member, method: str, request: bytes, timeout: float) -> bytes:
        path = method_path(RANKER_SERVICE, method)
        try:
            with tracing.client_call(path) as trace_context:
                response = await member.method(path)(request, timeout=timeout, metadata=trace_context)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in NO_ANSWER_CODES:
                member.last_answer = time.monotonic()  # it answered, with an error
            member.record_failure(exc.code())
            raise
        member.last_answer = time.monotonic()
        member.record_success()
        return response

    async def _started(self, context: grpc.aio.ServicerContext) -> None:
        """Returns at once after start-up; during it, waits for the membership to settle within the
        call's time (what is left then goes to the forward)."""
        membership = self.policy.membership
        if membership.settled():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(membership.wait_settled(), self._timeout(context))

    def _timeout(self, context: grpc.aio.ServicerContext) -> float:
        remaining = context.time_remaining()
        if remaining is None:
            return self._default_timeout_s
        timeout = remaining - self._margin_s
        if timeout <= 0:
            raise DeadlineExceeded(f"{remaining * 1000:.1f} ms left, within the forwarding margin")
        return timeout


def _finished(member: Member) -> None:
    member.in_flight -= 1
    ROUTER_INFLIGHT.labels(member.name).set(member.in_flight)


def _unavailable(attempt: asyncio.Future) -> bool:
    """The finished forward failed with UNAVAILABLE: its member, not the request, is at fault."""
    error = attempt.exception()
    return isinstance(error, grpc.aio.AioRpcError) and error.code() == grpc.StatusCode.UNAVAILABLE


async def _first_answer(attempts: list[asyncio.Future]) -> bytes:
    """The answer of the first attempt to succeed; when none does, the last attempt's error."""
    pending = set(attempts)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for attempt in done:
            if attempt.exception() is None:
                return attempt.result()
    return attempts[-1].result()


def _settle(attempts: list[asyncio.Future]) -> None:
    """Cancels the attempts still running; a finished one's error is marked seen (the Rank had its answer
    or error already, and asyncio would log an error nobody looked at)."""
    for attempt in attempts:
        if attempt.done() and not attempt.cancelled():
            attempt.exception()
        attempt.cancel()
