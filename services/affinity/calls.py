"""The rankers as a caller of RankerService sees them: through one gRPC target, or routed in process.

`RankerCalls` is what the trigger (PreInfer, GetProfile) and the retrieval stub (Rank) are given:
- `ThroughTarget`: every call to one gRPC target (`--router`: the routers, or a single ranker), which
  routes it. One hop more each way, and the router's CPU.
- `AffinityClient` (direct routing, `--rankers`/`--rankers-srv`): the same routing as the router's, in
  this process, straight to the chosen ranker.

`ranker_calls` picks one from the settings. Requests are wire bytes; the caller serialised them once.
PreInferBatch (`AffinityClient.pre_infer_batch`) is direct routing's only: it needs the member the caller
placed its PreInfers on, and through a target the router places each PreInfer itself, so a caller that goes
through the router sends single PreInfers (the router serves no PreInferBatch).
Errors: `grpc.aio.AioRpcError` with the downstream status code; direct routing also raises `Unavailable`
(no routable member) and `DeadlineExceeded` (none became routable in time at start-up), both
`RequestError`s that carry their status code.
"""

from __future__ import annotations

import time
from typing import Protocol

import grpc

from relaygr.v1 import ranker_pb2
from services.affinity.client import AffinityClient, dropped
from services.affinity.discovery import DnsLookup, srv_lookup
from services.affinity.metrics import RANK_RETRIES
from services.affinity.settings import AffinitySettings
from services.common import tracing
from services.common.config import ServiceConfig
from services.common.contract import RANKER_SERVICE, method_path
from services.common.server import dial

PRE_INFER = method_path(RANKER_SERVICE, "PreInfer")
RANK = method_path(RANKER_SERVICE, "Rank")
GET_PROFILE = method_path(RANKER_SERVICE, "GetProfile")


class RankerCalls(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def pre_infer(self, request: bytes, user_id: str, timeout: float, member: str = "") -> bytes: ...

    async def rank(self, request: bytes, user_id: str, hint: str, timeout: float) -> bytes: ...

    def routable_members(self) -> tuple[str, ...] | None:
        """The members calls can go to now, by name (sorted); None when another process routes them."""
        ...

    async def get_profile(self, request: bytes, timeout: float) -> ranker_pb2.GetProfileResponse: ...


class ThroughTarget:
    """Every call to one gRPC target (routers behind one name, or one ranker), each in the caller's trace."""

    def __init__(self, target: str, service: ServiceConfig) -> None:
        self.target = target
        self.channel = dial(target, service)
        self._pre_infer = self.channel.unary_unary(PRE_INFER)
        self._rank = self.channel.unary_unary(RANK)
        self._get_profile = self.channel.unary_unary(
            GET_PROFILE, response_deserializer=ranker_pb2.GetProfileResponse.FromString
        )

    async def start(self) -> None:
        """Nothing to do: the channel connects on the first call."""

    async def close(self) -> None:
        await self.channel.close()

    async def pre_infer(self, request: bytes, user_id: str, timeout: float, member: str = "") -> bytes:
        """`member` is not passed on: the router places PreInfer by its own ring."""
        with tracing.client_call(PRE_INFER) as trace_context:
            return await self._pre_infer(request, timeout=timeout, metadata=trace_context)

    async def rank(self, request: bytes, user_id: str, hint: str, timeout: float) -> bytes:
        """A router that restarts is waited for within the deadline instead of failing the call
        (`wait_for_ready`). A Rank the router dropped unanswered (`client.DROPPED_CODES`: a router that
        begins to shut down cancels the calls it had not yet taken up) is sent once more, in the time left:
        ranking is idempotent, and the second attempt reaches the replacement or another router."""
        deadline = time.monotonic() + timeout
        try:
            return await self._rank_once(request, timeout)
        except grpc.aio.AioRpcError as exc:
            left = deadline - time.monotonic()
            if not dropped(exc) or left <= 0:
                raise
            RANK_RETRIES.labels(exc.code().name).inc()
        return await self._rank_once(request, left)

    async def _rank_once(self, request: bytes, timeout: float) -> bytes:
        with tracing.client_call(RANK) as trace_context:
            return await self._rank(request, timeout=timeout, wait_for_ready=True, metadata=trace_context)

    async def get_profile(self, request: bytes, timeout: float) -> ranker_pb2.GetProfileResponse:
        return await self._get_profile(request, timeout=timeout)

    def routable_members(self) -> None:
        """Unknown here: the router behind the target routes."""
        return None


def ranker_calls(
    config: AffinitySettings, service: ServiceConfig, target: str, lookup: DnsLookup = srv_lookup
) -> RankerCalls:
    """Direct routing when `config` names the rankers, else every call through `target`."""
    if config.routes_directly:
        return AffinityClient.from_config(config, service, lookup)
    return ThroughTarget(target, service)


def describe(calls: RankerCalls) -> str:
    """Where the calls go, for logs."""
    if isinstance(calls, ThroughTarget):
        return f"through {calls.target}"
    assert isinstance(calls, AffinityClient)
    names = ", ".join(sorted(calls.membership.members))
    return f"directly to {names or 'no ranker yet'}"
