"""`python -m services.ranker` as a process: health gates on warm-up, SIGTERM drains and exits cleanly."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2

from relaygr.v1 import ranker_pb2, ranker_pb2_grpc
from services.launcher.procs import Processes, health_status
from services.ranker.app import RankerApp
from services.ranker.config import RankerConfig
from tests.support.requests import pre_infer_request, rank_request

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


def test_limits_past_the_models_positions_are_refused_at_start_up():
    """cpu-tiny has 16384 positions: 16383 events of history plus the candidates' shared position."""
    args = ["--model-preset", "cpu-tiny", "--max-long-term-events", "16000", "--max-short-term-events", "512"]
    done = subprocess.run(
        [sys.executable, "-m", "services.ranker", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert (
        "--max-long-term-events (16000) + --max-short-term-events (512) exceed the 16383 events preset "
        "'cpu-tiny' has positions for (16384, one of them the candidates')" in done.stderr
    )
    # At the limit, the configuration is accepted.
    RankerConfig(model_preset="cpu-tiny", max_long_term_events=16000, max_short_term_events=383).validate()


def test_an_instance_name_a_relay_hint_cannot_carry_is_refused_at_start_up():
    with pytest.raises(ValueError, match="--instance-name: must be a member name"):
        RankerConfig(instance_name="ranker 0").validate()


def test_cuda_graphs_are_refused_off_cuda_and_with_candidate_microbatches():
    async def build() -> None:
        RankerApp(RankerConfig(model_preset="cpu-tiny", device="cpu", cuda_graphs=True))

    with pytest.raises(ValueError, match="--cuda-graphs needs a CUDA device; this ranker runs on cpu"):
        asyncio.run(build())
    with pytest.raises(ValueError, match="--cuda-graphs ranks all candidates at once"):
        RankerConfig(cuda_graphs=True, candidate_microbatch=32).validate()
    with pytest.raises(ValueError, match="--cuda-graph-length-buckets"):
        RankerConfig(cuda_graph_length_buckets="512,x").validate()
    assert RankerConfig().cuda_graph_bucket_list()[-1] == 16384 and not RankerConfig().cuda_graphs
