"""Assembles a retrieval stub: its user universe, its way to the rankers (through the router, or routed
directly with `--rankers`/`--rankers-srv`), its channel to the trigger, the data plane (`RecommendPlane`)
over them (`GrpcUpstream`), RecommendService.

`RetrievalStubApp` is what `python -m services.retrieval_stub` runs (`services.common.server.serve_app`):
`start()` binds the ports, starts watching the rankers when it routes directly, and turns SERVING at once
(the stub depends on nothing to answer: a Rank waits for start-up within its deadline, the router and the
trigger are dialled lazily), `close()` closes its channels after the drain.
"""

from __future__ import annotations

import logging

from relaygr.v1 import recommend_pb2_grpc, trigger_pb2_grpc
from services.affinity.calls import describe, ranker_calls
from services.common.contract import RECOMMEND_SERVICE
from services.common.server import GrpcServer, dial
from services.retrieval_stub.config import RetrievalStubConfig
from services.retrieval_stub.dataplane import RecommendPlane
from services.retrieval_stub.servicer import GrpcUpstream, RecommendService
from services.workload.universe import UserUniverse

log = logging.getLogger("services.retrieval_stub")


class RetrievalStubApp:
    def __init__(self, config: RetrievalStubConfig) -> None:
        self.config = config
        self.universe = UserUniverse(config)
        self.rankers = ranker_calls(config, config, config.router)
        self._trigger = dial(config.trigger, config) if config.relay else None
        trigger = trigger_pb2_grpc.TriggerServiceStub(self._trigger) if self._trigger is not None else None
        self.plane = RecommendPlane(config, self.universe, GrpcUpstream(config, self.rankers, trigger))
        self.service = RecommendService(self.plane)
        self.grpc = GrpcServer(
            config,
            RECOMMEND_SERVICE,
            lambda s: recommend_pb2_grpc.add_RecommendServiceServicer_to_server(self.service, s),
        )

    async def start(self) -> None:
        await self.grpc.start()
        await self.rankers.start()
        log.info("Rank goes %s", describe(self.rankers))
        epoch, relay = self.universe.epoch_ms, "on" if self.config.relay else "off (baseline)"
        log.info("universe epoch %d ms (--universe-epoch-ms %d reproduces it); relay %s", epoch, epoch, relay)
        await self.grpc.set_serving()

    async def close(self) -> None:
        await self.rankers.close()
        if self._trigger is not None:
            await self._trigger.close()
