"""SIGTERM drains a ranker: NOT_SERVING at once, no new pre-inference, leased prefixes consumed or left to
expire, in-flight Ranks finished, then a clean exit.

A ranker process on loopback, signalled while a client of its own holds a lease and Ranks are in flight.
Timings are asserted only from below (the drain may not end early); a slow machine only makes it longer.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from relaygr.v1 import common_pb2, ranker_pb2, ranker_pb2_grpc
from services.common.contract import RANKER_SERVICE
from services.launcher.procs import Processes, ServiceProcess, health_status
from tests.reliability.harness import user_rank
from tests.support.metrics import scrape, value
from tests.support.polling import wait_for

pytestmark = pytest.mark.slow

DRAIN_MIN_S = 0.5
LEASE_TTL_S = 3.0
GRACE_S = 8.0  # leases are waited for up to half of it


@pytest.fixture
def ranker(tmp_path: Path) -> Iterator[ServiceProcess]:
    args = [
        "--instance-name", "ranker-0", "--model-preset", "cpu-tiny", "--profile-lengths", "32,128",
        "--profile-repeats", "1", "--drain-min-s", str(DRAIN_MIN_S), "--drain-grace-s", str(GRACE_S),
        "--lease-ttl-ms", str(int(LEASE_TTL_S * 1000)),
    ]  # fmt: skip
    with Processes(log_dir=tmp_path) as procs:
        process = procs.start("ranker-0", "services.ranker", RANKER_SERVICE, args)
        process.wait_healthy(120)
        yield process


def leases(ranker: ServiceProcess) -> float:
    return value(scrape(ranker.metrics_port), "relaygr_leases_active")


def pre_infer(stub: ranker_pb2_grpc.RankerServiceStub, user: int) -> int:
    request = user_rank(user)
    return stub.PreInfer(
        ranker_pb2.PreInferRequest(user_id=request.user_id, long_term=request.long_term), timeout=10
    ).outcome


def draining(ranker: ServiceProcess) -> bool:
    return health_status(ranker.address, RANKER_SERVICE) == health_pb2.HealthCheckResponse.NOT_SERVING


def test_sigterm_serves_on_consumes_the_lease_finishes_in_flight_work_and_exits(ranker: ServiceProcess):
    with grpc.insecure_channel(ranker.address) as channel, ThreadPoolExecutor(8) as pool:
        stub = ranker_pb2_grpc.RankerServiceStub(channel)
        assert pre_infer(stub, 1) == ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED
        wait_for(lambda: leases(ranker) == 1, 10, "the pre-inferred prefix is leased")
        in_flight = [pool.submit(stub.Rank, user_rank(100 + i, length=2048), timeout=30) for i in range(6)]

        ranker.signal(signal.SIGTERM)
        wait_for(lambda: draining(ranker), 5, "health says NOT_SERVING", every_s=0.02)
        # While draining: no new pre-inference, but Ranks are served, the leased prefix among them.
        assert pre_infer(stub, 2) == ranker_pb2.PRE_INFER_OUTCOME_REJECTED_OVERLOAD
        assert len(stub.Rank(user_rank(3), timeout=10).scores) == 8
        relayed = stub.Rank(user_rank(1), timeout=10)
        assert relayed.cache_source == common_pb2.CACHE_SOURCE_HBM
        assert all(len(done.result().scores) == 8 for done in in_flight)

    assert ranker.popen.wait(DRAIN_MIN_S + GRACE_S * 1.5 + 10) == 0
    assert "stopped" in ranker.log_tail(5)


def test_an_unconsumed_lease_is_waited_for_until_it_expires(ranker: ServiceProcess):
    with grpc.insecure_channel(ranker.address) as channel:
        stub = ranker_pb2_grpc.RankerServiceStub(channel)
        assert pre_infer(stub, 1) == ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED
        wait_for(lambda: leases(ranker) == 1, 10, "the pre-inferred prefix is leased")
        leased_until = time.monotonic() + LEASE_TTL_S - 0.5  # leased at least this long from now
        ranker.signal(signal.SIGTERM)
        wait_for(lambda: draining(ranker), 5, "health says NOT_SERVING", every_s=0.02)
        # Well past the minimum drain, the ranker still serves: its lease may yet be consumed.
        time.sleep(DRAIN_MIN_S * 2)
        assert len(stub.Rank(user_rank(3), timeout=10).scores) == 8
    assert ranker.popen.wait(DRAIN_MIN_S + GRACE_S * 1.5 + 10) == 0
    assert time.monotonic() >= leased_until
