"""`bench.micro.null_ranker`: RankerService on the services' own server stack (`GrpcServer`: interceptor,
health, reflection, uvloop) with nothing behind it, for `bench.micro.serving`: the serving floor. It answers
with the same sizes (a score per candidate) and does nothing else: what a ranker spends beyond it is the
ranker's own serving code.
"""

from __future__ import annotations

import dataclasses
import sys

from relaygr.v1 import common_pb2, ranker_pb2, ranker_pb2_grpc
from services.common.config import ServiceConfig, setting
from services.common.contract import RANKER_SERVICE
from services.common.server import GrpcServer, service_main


@dataclasses.dataclass(frozen=True)
class NullRankerConfig(ServiceConfig):
    instance_name: str = setting("null-ranker", "the member name it answers with")


class NullServicer(ranker_pb2_grpc.RankerServiceServicer):
    def __init__(self, instance: str) -> None:
        self.instance = instance

    async def PreInfer(self, request: ranker_pb2.PreInferRequest, context) -> ranker_pb2.PreInferResponse:
        return ranker_pb2.PreInferResponse(
            outcome=ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED, instance=self.instance
        )

    async def PreInferBatch(
        self, request: ranker_pb2.PreInferBatchRequest, context
    ) -> ranker_pb2.PreInferBatchResponse:
        accepted = ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED
        return ranker_pb2.PreInferBatchResponse(
            answers=[ranker_pb2.PreInferAnswer(outcome=accepted) for _ in request.requests],
            instance=self.instance,
        )

    async def Rank(self, request: ranker_pb2.RankRequest, context) -> ranker_pb2.RankResponse:
        return ranker_pb2.RankResponse(
            scores=[0.5] * len(request.candidate_item_ids),
            cache_source=common_pb2.CACHE_SOURCE_HBM,
            instance=self.instance,
        )


class NullRankerApp:
    def __init__(self, config: NullRankerConfig) -> None:
        servicer = NullServicer(config.instance_name)
        self.grpc = GrpcServer(
            config, RANKER_SERVICE, lambda s: ranker_pb2_grpc.add_RankerServiceServicer_to_server(servicer, s)
        )

    async def start(self) -> None:
        await self.grpc.start()
        await self.grpc.set_serving()

    async def close(self) -> None:
        return None


if __name__ == "__main__":  # as `services.launcher` starts it
    service_main(NullRankerConfig, NullRankerApp, sys.argv[1:], "null_ranker", __doc__.split("\n\n")[0])
