"""`AffinityClient`: calls `relaygr.v1.RankerService` on the member the routing policy picks.

The router serves it to its clients (`services.router.proxy`); a trigger or retrieval stub given the
rankers (`--rankers`, `--rankers-srv`) uses it in process, one gRPC hop less each way (direct routing).
Requests and answers are wire bytes: a caller that has a message serialises it once, the router forwards
what it received.

Contract:
- `pre_infer` and `rank` go to `RoutingPolicy.choose`'s member (the relay hint, then the bounded-load
  ring); every attempt counts one routing decision and is counted in flight on its member in the same
  event-loop step as the decision, so the next placement sees it (concurrent requests of one user read
  the loads after one another and cannot together pass the bound).
- `pre_infer_batch` sends PreInfers the caller placed on one member (the trigger's coalesced ones) as one
  PreInferBatch call to it, each entry counted as one PreInfer routing decision. When that member is not
  routable, the batch goes whole where the policy places its first user (a batch is not split): every
  entry's relay hint is the instance that answered, so its Rank follows the batch. Never retried.
- A call made while the membership starts, before any member is healthy and while some member's first
  health check is still out, waits for start-up to settle (within its timeout) instead of failing. Once
  settled, no call waits: with no member routable it raises `Unavailable` at once.
- Downstream errors propagate as `grpc.aio.AioRpcError`, with their status code.
- A Rank that its member dropped unanswered (`DROPPED_CODES`: UNAVAILABLE, or CANCELLED by a server that is
  shutting down) is retried once on the failover member; PreInfer is a hint and is never retried. A
  failed-over Rank counts two decisions.
- A Rank still unanswered after half its time (`HEDGE_AT`) is hedged: sent also to the failover member,
  and the first answer wins (the other attempt is cancelled); when both fail, the caller gets the failover
  attempt's error. A member cut off the network (packets dropped, no reset) fails nothing: it takes its
  health checks `--health-timeouts` intervals to leave the ring, and without the hedge every Rank sent to
  it meanwhile, and every one in flight when it went, would wait out its whole deadline. Only a silent
  member is hedged: one that has answered no call of this process in the last half of the wait (a quarter
  of the timeout). A member that is slow because it is busy keeps answering other calls, and a hedge would
  only add load where the fleet has least room, so its Rank is waited for; a member cut off just after
  answering a call is silent for the whole wait of a Rank it had not answered. The hedge is one
  failover-decision call, and each Rank is sent twice at most.
- `get_profile` asks the least-loaded routable member and adds the routable members (`fleet_members`,
  their names in `members`) and the ring's virtual nodes: with them the trigger places users on the same
  ring to tell which ranker it loads.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

import grpc

from relaygr.v1 import ranker_pb2
from services.affinity.discovery import DnsLookup, srv_lookup
from services.affinity.membership import Member, Membership
from services.affinity.metrics import ROUTER_DECISIONS, ROUTER_INFLIGHT
from services.affinity.routing import Route, RoutingPolicy
from services.affinity.settings import AffinitySettings
from services.common import tracing
from services.common.config import ServiceConfig
from services.common.contract import RANKER_SERVICE, method_path
from services.common.errors import DeadlineExceeded
from services.common.metrics import Children

# A Rank without an answer after this share of its timeout is hedged on the failover member, which then
# has the other share: each attempt gets half.
HEDGE_AT = 0.5
# Codes of a call the member did not answer: no connection, our own deadline, or our cancellation.
NO_ANSWER_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
# Codes of a call the server dropped without running it, so that sending it again is safe and may succeed:
# no connection (UNAVAILABLE), or CANCELLED by a server that began to shut down. gRPC's server shutdown,
# even with a grace period, cancels every call that had arrived but was not yet taken up by the server's
# event loop (only calls already handed to a handler get the grace). A call we cancel ourselves ends in
# `asyncio.CancelledError` in our own task, never in an `AioRpcError`, so it is not mistaken for one.
DROPPED_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
# (ROUTER_INFLIGHT's series are not kept: the membership removes a departed member's.)
_DECISIONS = Children(ROUTER_DECISIONS)
_PATHS = {
    method: method_path(RANKER_SERVICE, method)
    for method in ("PreInfer", "PreInferBatch", "Rank", "GetProfile")
}


class AffinityClient:
    """RankerService's calls, each sent to the member the routing policy picks (see the module docstring)."""

    def __init__(self, policy: RoutingPolicy) -> None:
        self.policy = policy

    @classmethod
    def from_config(
        cls, config: AffinitySettings, service: ServiceConfig, lookup: DnsLookup = srv_lookup
    ) -> AffinityClient:
        membership = Membership.from_config(config, service, lookup)
        return cls(RoutingPolicy(membership, config.routing_policy))

    @property
    def membership(self) -> Membership:
        return self.policy.membership

    async def start(self) -> None:
        """Discovers the members and starts watching their health."""
        await self.membership.start()

    async def close(self) -> None:
        await self.membership.close()

    async def pre_infer(self, request: bytes, user_id: str, timeout: float, member: str = "") -> bytes:
        """To `member` when the caller placed the prefix (the trigger, by the rankers' queues) and it is
        routable, else by the ring."""
        timeout = await self._started(timeout)
        route = self.policy.place(user_id, member) if member else self.policy.choose(user_id)
        return await self._send(route, "PreInfer", request, timeout)

    async def pre_infer_batch(
        self, request: bytes, user_ids: Sequence[str], timeout: float, member: str
    ) -> bytes:
        """A PreInferBatch of `user_ids`' PreInfers, placed by the caller on `member`: to it while it is
        routable, else where the policy places the first user."""
        timeout = await self._started(timeout)
        routes = [self.policy.place(user_id, member) for user_id in user_ids]
        for route in routes:
            _DECISIONS("PreInfer", route.decision.value).inc()
        return await self._forward(routes[0].member, "PreInferBatch", request, timeout)

    async def rank(self, request: bytes, user_id: str, hint: str, timeout: float) -> bytes:
        timeout = await self._started(timeout)
        route = self.policy.choose(user_id, hint)
        hedge_after = timeout * HEDGE_AT
        attempts = [self._send(route, "Rank", request, timeout)]
        try:
            await asyncio.wait(attempts, timeout=hedge_after)
            first = attempts[0]
            if first.done() and not dropped(first.exception()):  # not the member's fault: no failover
                return first.result()  # the answer, or an error that another member would repeat
            if not first.done() and time.monotonic() - route.member.last_answer < hedge_after / 2:
                return await first  # busy, not gone: it answers other calls
            # Dropped unanswered, or no answer in half the time: the failover member gets the Rank too.
            retry = self.policy.failover(user_id, failed=route.member.name)
            if retry is None:
                return await first
            attempts.append(self._send(retry, "Rank", request, timeout))
            return await _first_answer(attempts)
        finally:
            _settle(attempts)

    def routable_members(self) -> tuple[str, ...]:
        """The routable members' names, sorted: the ring that `choose` places users on now."""
        return tuple(sorted(member.name for member in self.membership.routable()))

    async def get_profile(self, request: bytes, timeout: float) -> ranker_pb2.GetProfileResponse:
        timeout = await self._started(timeout)
        answer = await self._forward(self.policy.least_loaded(), "GetProfile", request, timeout)
        profile = ranker_pb2.GetProfileResponse.FromString(answer)
        routable = self.membership.routable()
        profile.fleet_members = len(routable)
        del profile.members[:]
        profile.members.extend(sorted(member.name for member in routable))
        profile.ring_virtual_nodes = self.membership.ring.virtual_nodes
        return profile

    def _send(self, route: Route, method: str, request: bytes, timeout: float) -> asyncio.Task[bytes]:
        _DECISIONS(method, route.decision.value).inc()
        return self._forward(route.member, method, request, timeout)

    def _forward(self, member: Member, method: str, request: bytes, timeout: float) -> asyncio.Task[bytes]:
        """Starts the call on `member`, counted in flight there at once: in the same step of the event loop
        as the routing decision that chose it, so the next request's placement sees it. (Counted when the
        call's coroutine first ran, concurrent requests of one user all read the loads from before any of
        them and together passed the bound.) The count drops when the call ends, however it ends."""
        member.in_flight += 1
        ROUTER_INFLIGHT.labels(member.name).set(member.in_flight)
        call = asyncio.ensure_future(_call(member, _PATHS[method], request, timeout))
        call.add_done_callback(lambda _: _finished(member))
        return call

    async def _started(self, timeout: float) -> float:
        """Returns at once after start-up; during it, waits for the membership to settle within `timeout`.
        The time left of `timeout` (what the call then has)."""
        membership = self.membership
        if membership.settled():
            return timeout
        started = time.monotonic()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(membership.wait_settled(), timeout)
        left = timeout - (time.monotonic() - started)
        if left <= 0:
            raise DeadlineExceeded(f"no ranker became routable within {timeout * 1000:.0f} ms of start-up")
        return left


async def _call(member: Member, path: str, request: bytes, timeout: float) -> bytes:
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


def _finished(member: Member) -> None:
    member.in_flight -= 1
    ROUTER_INFLIGHT.labels(member.name).set(member.in_flight)


def dropped(error: BaseException | None) -> bool:
    """`error` ends a call that its server dropped without running it (`DROPPED_CODES`): safe to resend."""
    return isinstance(error, grpc.aio.AioRpcError) and error.code() in DROPPED_CODES


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
