"""`python -m services.retrieval_stub`: serve RecommendService until SIGTERM, then drain."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from relaygr.v1 import ranker_pb2_grpc, recommend_pb2_grpc, trigger_pb2_grpc
from services.common.contract import RECOMMEND_SERVICE
from services.common.server import GrpcServer, dial, service_main
from services.retrieval_stub.config import RetrievalStubConfig
from services.retrieval_stub.servicer import RecommendService
from services.workload.universe import UserUniverse

log = logging.getLogger("services.retrieval_stub")


async def serve(config: RetrievalStubConfig) -> None:
    universe = UserUniverse(config)
    router = dial(config.router, config)
    trigger = dial(config.trigger, config) if config.relay else None
    service = RecommendService(
        config,
        universe,
        ranker_pb2_grpc.RankerServiceStub(router),
        trigger_pb2_grpc.TriggerServiceStub(trigger) if trigger is not None else None,
    )
    server = GrpcServer(
        config,
        RECOMMEND_SERVICE,
        lambda s: recommend_pb2_grpc.add_RecommendServiceServicer_to_server(service, s),
    )
    await server.start()
    server.install_signal_handlers()
    log.info(
        "universe epoch %d ms (pass --universe-epoch-ms %d to reproduce it); relay %s",
        universe.epoch_ms, universe.epoch_ms, "on" if config.relay else "off (baseline)",
    )  # fmt: skip
    await server.set_serving()
    try:
        await server.wait()
    finally:
        for channel in (router, trigger):
            if channel is not None:
                await channel.close()


def main(argv: Sequence[str] | None = None) -> None:
    service_main(
        RetrievalStubConfig,
        serve,
        argv,
        "retrieval_stub",
        "Retrieval stub: synthetic users, Admit at retrieval, Rank through the router.",
    )


if __name__ == "__main__":
    main()
