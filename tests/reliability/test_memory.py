"""Memory under a storm of distinct users and over a long soak: budgets hold, nothing grows, nothing leaks.

Memory is read the way an operator reads it: the ranker process's resident set (/proc/<pid>/status) and
its `relaygr_kv_cache_bytes` and `relaygr_leases_active` gauges, sampled from its metrics endpoint while
load runs. The soak lasts RELAYGR_SOAK_S seconds (600 by default; CI runs it).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relaygr.v1 import ranker_pb2, ranker_pb2_grpc
from services.common.contract import RANKER_SERVICE
from services.launcher.fleet import STUB, Fleet
from services.launcher.procs import Processes, ServiceProcess
from tests.reliability.harness import (
    TRIGGER_ARGS,
    BackgroundLoad,
    MemoryWatch,
    codes,
    failures,
    fleet_config,
    recommend_load,
    user_rank,
)
from tests.support.metrics import increase, scrape, value
from tests.support.polling import wait_for

pytestmark = pytest.mark.slow

SOAK_S = float(os.environ.get("RELAYGR_SOAK_S", "600"))
LEASE_TTL_S = 1.0
MIB = 1024 * 1024
# Besides its tiers (whose freed bytes the allocator may keep: twice the budgets), a ranker grows by one
# uncached pass's working memory (here at most 256 events: under 1 MiB) and gRPC and allocator buffers.
# Measured on 2 cores: +3.9 MiB in all, against budgets of 1.5 MiB.
RSS_SLACK = 8 * MIB


@pytest.fixture
def ranker(tmp_path: Path) -> Iterator[ServiceProcess]:
    # Tiers far smaller than the storm: cpu-tiny holds 512 bytes per token, so HBM fits ~1000 tokens.
    args = [
        "--instance-name", "ranker-0", "--model-preset", "cpu-tiny", "--profile-lengths", "32,128",
        "--profile-repeats", "1", "--hbm-budget-mb", "0.5", "--dram-budget-mb", "1",
        "--lease-ttl-ms", str(int(LEASE_TTL_S * 1000)), "--drain-min-s", "0",
    ]  # fmt: skip
    with Processes(log_dir=tmp_path) as procs:
        process = procs.start("ranker-0", "services.ranker", RANKER_SERVICE, args)
        process.wait_healthy(120)
        yield process


def relay_storm(address: str, rate: float) -> BackgroundLoad:
    """Each user once: its PreInfer, then its Rank, interleaved with other users' (lengths 64 to 256)."""

    def request(index: int):
        user, length = index // 2, 64 + (index // 2) % 4 * 64
        rank = user_rank(user, length)
        if index % 2 == 0:
            return ranker_pb2.PreInferRequest(user_id=rank.user_id, long_term=rank.long_term)
        return rank

    def call_for(channel):
        stub = ranker_pb2_grpc.RankerServiceStub(channel)

        def call(request, **kw):
            if isinstance(request, ranker_pb2.PreInferRequest):
                return stub.PreInfer(request, **kw)
            return stub.Rank(request, **kw)

        return call

    return BackgroundLoad(address, call_for, request, rate, timeout_s=30)


def test_a_storm_of_distinct_users_never_exceeds_the_memory_budgets(ranker: ServiceProcess) -> None:
    watch = MemoryWatch(ranker.popen.pid, ranker.metrics_port, interval_s=0.02).start()
    before = scrape(ranker.metrics_port)
    storm = relay_storm(ranker.address, rate=100.0).start()
    time.sleep(8.0)
    records = storm.stop()
    samples = watch.stop()
    after = scrape(ranker.metrics_port)

    # Memory is the point here; a busy machine may yet make the ranker shed some of the storm.
    counted = codes(records)
    assert set(counted) <= {"OK", "RESOURCE_EXHAUSTED"} and counted["OK"] > len(records) / 2, counted
    hbm, dram = watch.capacity["hbm"], watch.capacity["dram"]
    # Each sample scrapes the ranker's metrics, which a ranker at full load answers in 20-100 ms depending on
    # the machine (the scrape waits for the interpreter): 40 samples in 8 s still see every 1 s lease's
    # life several times.
    assert len(samples) > 40
    assert max(s.hbm for s in samples) <= hbm and max(s.dram for s in samples) <= dram
    # The budgets were under pressure, not idle: entries were refused or evicted to respect them. (How full
    # HBM gets depends on how fast this machine drains leases, hence a quarter, not a half.)
    assert max(s.hbm for s in samples) > hbm / 4 and max(s.dram for s in samples) > dram / 2
    refused = increase(before, after, "relaygr_pre_infer_total", outcome="rejected_capacity")
    assert refused + increase(before, after, "relaygr_kv_cache_evictions_total") > 0
    rss = [s.rss for s in samples]
    growth = max(rss) - rss[0]
    print(f"RSS +{growth / MIB:.1f} MiB against budgets of {hbm / MIB:.0f} + {dram / MIB:.0f} MiB")
    assert growth < 2 * (hbm + dram) + RSS_SLACK

    # Once the storm is over and the lease TTL has passed, no lease is left and HBM is empty.
    gauges = lambda: scrape(ranker.metrics_port)  # noqa: E731
    wait_for(lambda: value(gauges(), "relaygr_leases_active") == 0, 5 + LEASE_TTL_S, "no lease is left")
    wait_for(lambda: value(gauges(), "relaygr_kv_cache_bytes", tier="hbm") == 0, 5, "HBM is empty")


@pytest.mark.timeout(SOAK_S + 300)
def test_a_soak_keeps_memory_flat_and_leaks_no_lease(tmp_path: Path) -> None:
    config = fleet_config(
        tmp_path / "logs",
        rankers=2,
        slo_ms=1.0,  # every request must relay: none is shed
        ranker_args="--torch-threads 1 --profile-lengths 32,128,512 --profile-repeats 1 --hbm-budget-mb 4 "
        f"--dram-budget-mb 8 --dram-ttl-s 10 --lease-ttl-ms {int(LEASE_TTL_S * 1000)}",
        trigger_args=f"{TRIGGER_ARGS} --lease-window-ms {int(LEASE_TTL_S * 1000)}",
    )
    with Fleet(config) as fleet:
        rankers = [fleet.children[name] for name in fleet.ranker_names]
        every_s = max(0.5, SOAK_S / 600)
        watches = [MemoryWatch(r.popen.pid, r.metrics_port, every_s).start() for r in rankers]
        # 3000 users at 10 per second: most come back within the DRAM tier's TTL now and then.
        soak = recommend_load(fleet.address(STUB), 10.0, users=3000, seed=7).start()
        time.sleep(SOAK_S)
        records = soak.stop()
        series = [watch.stop() for watch in watches]

        assert failures(records) == [], codes(records)
        assert len(records) > 5 * SOAK_S
        for watch, samples in zip(watches, series, strict=True):
            assert all(s.hbm <= watch.capacity["hbm"] and s.dram <= watch.capacity["dram"] for s in samples)
            # Flat: once the tiers have filled (the first half), the resident set no longer grows.
            tenth = max(1, len(samples) // 10)
            middle = statistics.median(s.rss for s in samples[4 * tenth : 5 * tenth])
            end = statistics.median(s.rss for s in samples[-tenth:])
            print(f"{watch.pid}: RSS {middle / MIB:.0f} MiB mid-soak, {end / MIB:.0f} MiB at the end")
            assert end - middle < 16 * MIB + 0.02 * middle

        # Load stopped: once the lease TTL has passed, no ranker holds a lease.
        for ranker in rankers:
            wait_for(
                lambda r=ranker: value(scrape(r.metrics_port), "relaygr_leases_active") == 0,
                5 + LEASE_TTL_S,
                f"{ranker.name} holds no lease",
            )
        fleet.check()
