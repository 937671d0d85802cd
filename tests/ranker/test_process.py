"""`python -m services.ranker` as a process: health gates on warm-up, SIGTERM drains and exits cleanly."""

from __future__ import annotations

import signal

import grpc
from grpc_health.v1 import health_pb2

from relaygr.v1 import ranker_pb2, ranker_pb2_grpc
from services.common.procs import Processes, health_status
from tests.ranker.harness import pre_infer_request, rank_request

ARGS = [
    "--model-preset", "cpu-tiny", "--instance-name", "ranker-p", "--profile-lengths", "16,64",
    "--profile-repeats", "1", "--drain-grace-s", "2",
]  # fmt: skip


def test_serves_after_warm_up_and_drains_on_sigterm():
    with Processes() as procs:
        ranker = procs.start("ranker-p", "services.ranker", "relaygr.v1.RankerService", ARGS)
        ranker.wait_healthy(60)
        assert health_status(ranker.address, "") == health_pb2.HealthCheckResponse.SERVING
        with grpc.insecure_channel(ranker.address) as channel:
            stub = ranker_pb2_grpc.RankerServiceStub(channel)
            long = list(range(1, 40))
            assert stub.PreInfer(pre_infer_request("u", long)).instance == "ranker-p"
            answer = stub.Rank(rank_request("u", long, [1], [2, 3]), timeout=10)
            assert len(answer.scores) == 2
            assert stub.GetProfile(ranker_pb2.GetProfileRequest()).instance == "ranker-p"
        ranker.signal(signal.SIGTERM)
        assert ranker.popen.wait(10) == 0
        assert health_status(ranker.address, "relaygr.v1.RankerService") is None
