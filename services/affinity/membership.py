"""The rankers a routing process calls (the router, or a trigger or stub routing directly): who they are,
whether they are healthy, whether their circuit is open.

Contract:
- Members are named by stable names (StatefulSet pod names), which are what the ring hashes and what a
  ranker reports as its `instance`; they come from a discovery source (`discovery.py`), re-read every
  `dns_refresh_s` for DNS SRV records; a failed discovery keeps the members, an empty answer removes them.
- Each member's gRPC health (service `relaygr.v1.RankerService`) is checked every `health_interval_s`.
  A member is routable while its last answered check said SERVING and its circuit is closed; a check
  that times out counts only after `health_timeouts` in a row (a busy ranker answers late). It stays on
  the ring either way, so it gets its arcs back as soon as it is routable again.
- `CircuitBreaker`: `failures` consecutive failed forwards open the circuit for `open_s`; afterwards
  traffic may try again, a success closes it and one more failure re-opens it at once.

Not thread-safe: everything runs on the routing process's event loop (blocking DNS calls run in its executor).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.affinity.discovery import Discovery, DnsLookup, srv_discovery, srv_lookup, static_discovery
from services.affinity.metrics import ROUTER_FAILURES, ROUTER_INFLIGHT, ROUTER_MEMBER_HEALTHY
from services.affinity.ring import AffinityRing
from services.affinity.settings import AffinitySettings
from services.common.config import ServiceConfig
from services.common.contract import RANKER_SERVICE
from services.common.server import dial
from services.common.tasks import cancel_and_wait

log = logging.getLogger(__name__)


# Codes that say the member, not the request, is at fault; only these count towards opening its circuit.
MEMBER_FAULT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DATA_LOSS,
    }
)

Clock = Callable[[], float]


class CircuitBreaker:
    """Opens after `failures` consecutive failures for `open_s`, then half-open (see the module docstring)."""

    def __init__(self, failures: int, open_s: float, clock: Clock = time.monotonic) -> None:
        self.failures = failures
        self.open_s = open_s
        self._clock = clock
        self._consecutive = 0
        self._open_until = float("-inf")

    @property
    def closed(self) -> bool:
        return self._clock() >= self._open_until

    def record_success(self) -> None:
        self._consecutive = 0

    def record_failure(self) -> bool:
        """Counts a failure; True when it opened the circuit."""
        self._consecutive += 1
        if self._consecutive >= self.failures and self.closed:
            self._open_until = self._clock() + self.open_s
            return True
        return False


class Member:
    """One ranker: stable name, address, channel, last health, circuit, and our in-flight count."""

    def __init__(self, name: str, address: str, channel: grpc.aio.Channel, breaker: CircuitBreaker) -> None:
        self.name = name
        self.address = address
        self.channel = channel
        self.breaker = breaker
        self.healthy = False
        # A health check has told whether it serves: it answered, was refused, or timed out too often.
        self.checked = False
        self.in_flight = 0
        # When this process last had an answer from it (time.monotonic()): a Rank is hedged only away from
        # a member that has been silent for a while (services.affinity.client).
        self.last_answer = -math.inf
        self._methods: dict[str, grpc.aio.UnaryUnaryMultiCallable] = {}

    @property
    def routable(self) -> bool:
        return self.healthy and self.breaker.closed

    def method(self, full_method: str) -> grpc.aio.UnaryUnaryMultiCallable:
        """A bytes-in, bytes-out callable for `full_method`: requests are forwarded without re-encoding."""
        call = self._methods.get(full_method)
        if call is None:
            call = self.channel.unary_unary(full_method, request_serializer=None, response_deserializer=None)
            self._methods[full_method] = call
        return call

    def record_success(self) -> None:
        self.breaker.record_success()

    def record_failure(self, code: grpc.StatusCode) -> None:
        ROUTER_FAILURES.labels(self.name, code.name).inc()
        if code in MEMBER_FAULT_CODES and self.breaker.record_failure():
            log.warning("circuit of %s open for %.1fs after %s", self.name, self.breaker.open_s, code.name)
            ROUTER_MEMBER_HEALTHY.labels(self.name).set(0)


class Membership:
    """The current members, kept in step with a discovery source and with the ring; watches their health."""

    def __init__(
        self,
        discover: Discovery,
        connect: Callable[[str], grpc.aio.Channel],
        ring: AffinityRing,
        health_interval_s: float,
        circuit_failures: int,
        circuit_open_s: float,
        refresh_s: float | None = None,
        health_timeouts: int = 3,
        close_grace_s: float = 0.0,
        clock: Clock = time.monotonic,
    ) -> None:
        self.ring = ring
        self._discover = discover
        self._connect = connect
        self._health_interval_s = health_interval_s
        self._health_timeouts = health_timeouts
        self._circuit_failures = circuit_failures
        self._circuit_open_s = circuit_open_s
        self._refresh_s = refresh_s
        self._close_grace_s = close_grace_s
        self._clock = clock
        self._members: dict[str, Member] = {}
        self._watchers: dict[Member, asyncio.Task] = {}
        self._refresher: asyncio.Task | None = None
        self._retiring: set[asyncio.Task] = set()  # members' `_retire`s still under way
        self._checked = asyncio.Event()  # pulsed whenever a health check finishes

    @classmethod
    def from_config(
        cls, config: AffinitySettings, service: ServiceConfig, lookup: DnsLookup = srv_lookup
    ) -> Membership:
        """The members `config` names, dialled with `service`'s channel settings (TLS, message sizes)."""
        if config.rankers_srv:
            discover, refresh_s = srv_discovery(config.srv_name(), lookup), config.dns_refresh_s
        else:
            discover, refresh_s = static_discovery(config.static_members()), None
        # Reconnect no slower than health is checked, so a restarted ranker is seen within an interval.
        backoff_ms = max(1, round(config.health_interval_s * 1000))
        options = (
            ("grpc.initial_reconnect_backoff_ms", backoff_ms),
            ("grpc.max_reconnect_backoff_ms", backoff_ms),
        )
        return cls(
            discover=discover,
            connect=lambda address: dial(address, service, options),
            ring=AffinityRing(
                virtual_nodes=config.virtual_nodes,
                load_factor=config.load_factor,
                load_floor=config.load_floor,
            ),
            health_interval_s=config.health_interval_s,
            health_timeouts=config.health_timeouts,
            circuit_failures=config.circuit_failures,
            circuit_open_s=config.circuit_open_s,
            refresh_s=refresh_s,
            close_grace_s=service.drain_grace_s,
        )

    @property
    def members(self) -> Mapping[str, Member]:
        return self._members

    def get(self, name: str) -> Member | None:
        return self._members.get(name)

    def routable(self) -> list[Member]:
        return [member for member in self._members.values() if member.routable]

    async def start(self) -> None:
        """Discovers the members once, then keeps refreshing when the source is DNS."""
        await self.refresh()
        if self._refresh_s is not None:
            self._refresher = asyncio.create_task(self._refresh_forever(self._refresh_s))

    async def wait_until_any_healthy(self) -> None:
        await self._wait_for(lambda: any(m.healthy for m in self._members.values()))

    def settled(self) -> bool:
        """Start-up is over: a member is routable, or every member's first health check has finished."""
        members = self._members.values()
        return any(m.routable for m in members) or all(m.checked for m in members)

    async def wait_settled(self) -> None:
        await self._wait_for(self.settled)

    async def _wait_for(self, condition: Callable[[], bool]) -> None:
        """Returns once `condition()` holds, checking it after every health check."""
        while not condition():
            self._checked.clear()
            await self._checked.wait()

    async def refresh(self) -> None:
        try:
            found = await self._discover()
        except OSError as exc:
            log.warning("member discovery failed, keeping %d members: %s", len(self._members), exc)
            return
        await self.apply(found)

    async def apply(self, found: Mapping[str, str]) -> None:
        """Makes the members exactly `found` ({name: host:port}); a member with a new address is redialed.

        A leaving member is off the ring at once; its channel closes once its forwards finish (at most
        `close_grace_s`), after the newcomers are in.
        """
        leaving = [m for name, m in self._members.items() if found.get(name) != m.address]
        for member in leaving:
            del self._members[member.name]
            if member.name not in found:
                self.ring.remove(member.name)
                ROUTER_MEMBER_HEALTHY.remove(member.name)
                ROUTER_INFLIGHT.remove(member.name)
        for name, address in found.items():
            if name not in self._members:
                self._add(name, address)
        if leaving:
            await self._close(leaving)

    def _add(self, name: str, address: str) -> None:
        breaker = CircuitBreaker(self._circuit_failures, self._circuit_open_s, self._clock)
        member = Member(name, address, self._connect(address), breaker)
        self._members[name] = member
        self.ring.add(name)
        ROUTER_MEMBER_HEALTHY.labels(name).set(0)
        ROUTER_INFLIGHT.labels(name).set(0)
        self._watchers[member] = asyncio.create_task(self._watch_health(member))
        log.info("member %s at %s joined", name, address)

    async def _close(self, members: list[Member]) -> None:
        """Stops watching `members` and closes their channels. Every member's retirement starts before any
        is awaited, and each runs to its end even when the caller is cancelled (a refresh stopped by
        `close()`, which waits for them all), so no channel is left open and no watcher running."""
        retiring = [asyncio.create_task(self._retire(member)) for member in members]
        for task in retiring:
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        await asyncio.shield(asyncio.gather(*retiring))

    async def _retire(self, member: Member) -> None:
        await cancel_and_wait([self._watchers.pop(member)])
        log.info("member %s at %s left", member.name, member.address)
        await member.channel.close(grace=self._close_grace_s)

    async def _refresh_forever(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            await self.refresh()

    async def _watch_health(self, member: Member) -> None:
        check = health_pb2_grpc.HealthStub(member.channel).Check
        request = health_pb2.HealthCheckRequest(service=RANKER_SERVICE)
        timeouts = 0  # consecutive probes that got no answer in time
        while True:
            try:
                response = await check(request, timeout=self._health_interval_s)
                healthy = response.status == health_pb2.HealthCheckResponse.SERVING
                timeouts = 0
            except grpc.aio.AioRpcError as exc:
                # NOT_SERVING (draining) and a refused connection (dead) take a member off at once. A
                # probe that only ran out of time is a busy member: it stays as it was until
                # `health_timeouts` probes in a row time out, so an overload that slows every ranker's
                # answers does not empty the ring all at once.
                timeouts = timeouts + 1 if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else 0
                healthy = member.healthy and 0 < timeouts < self._health_timeouts
            if healthy != member.healthy:
                log.info("member %s is %s", member.name, "healthy" if healthy else "unhealthy")
                member.healthy = healthy
            # A first check that only timed out has not told us anything yet, until it is the last allowed.
            member.checked = member.checked or timeouts == 0 or timeouts >= self._health_timeouts
            self._checked.set()
            ROUTER_MEMBER_HEALTHY.labels(member.name).set(int(member.routable))
            await asyncio.sleep(self._health_interval_s)

    async def close(self) -> None:
        if self._refresher is not None:
            await cancel_and_wait([self._refresher])
        await self.apply({})
        if self._retiring:
            await asyncio.wait(self._retiring)
