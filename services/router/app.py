"""The router's wiring: membership, routing policy and proxy behind one `GrpcServer`.

`RouterApp.start()` binds the ports and discovers the members; health of `relaygr.v1.RankerService` turns
SERVING once at least one member is healthy; `close()` closes the member channels after the drain. Run by
`python -m services.router` (`services.common.server.serve_app`) and, in-process, by tests (`stop()`
drains like every service, then closes).
"""

from __future__ import annotations

import asyncio
import logging

from services.affinity.client import AffinityClient
from services.affinity.discovery import DnsLookup, srv_lookup
from services.common.contract import RANKER_SERVICE
from services.common.server import GrpcServer
from services.router.config import RouterConfig
from services.router.proxy import RankerProxy

log = logging.getLogger(__name__)


class RouterApp:
    """One router: its members, its routing policy, and the gRPC server that proxies to them."""

    def __init__(self, config: RouterConfig, lookup: DnsLookup = srv_lookup) -> None:
        self.config = config
        self.client = AffinityClient.from_config(config, config, lookup)
        self.membership = self.client.membership
        self.policy = self.client.policy
        proxy = RankerProxy(self.client, config.deadline_margin_ms, config.default_timeout_ms)
        self.grpc = GrpcServer(config, RANKER_SERVICE, proxy.register)
        self._ready: asyncio.Task | None = None

    @property
    def address(self) -> str:
        return self.grpc.address

    async def start(self) -> None:
        await self.grpc.start()
        await self.client.start()
        self._ready = asyncio.create_task(self._serve_once_a_member_is_healthy())

    async def _serve_once_a_member_is_healthy(self) -> None:
        await self.membership.wait_until_any_healthy()
        await self.grpc.set_serving()
        healthy, known = len(self.membership.routable()), len(self.membership.members)
        log.info("serving: %d of %d members healthy", healthy, known)

    async def wait_serving(self) -> None:
        assert self._ready is not None, "start() first"
        await asyncio.shield(self._ready)

    async def stop(self) -> None:
        await self.grpc.drain()
        await self.close()

    async def close(self) -> None:
        if self._ready is not None:
            self._ready.cancel()
        await self.client.close()
