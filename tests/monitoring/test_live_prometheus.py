"""A real Prometheus scrapes the local fleet under load, and every dashboard query and every recording
rule returns data.

The fleet (two cpu-tiny rankers, router, trigger, retrieval stub) runs as local processes; Prometheus
(Debian's package, which the CI script installs) scrapes their metrics ports every second on loopback,
with the `job`, `namespace` and `pod` labels the PodMonitor gives them in a cluster, and evaluates
deploy/monitoring/rules.yaml every second instead of every 30 s. The load is Recommend traffic from
`services.loadgen` over the shipped ghz data, plus one burst of Ranks that overflows the rankers' queues
so that shedding and error panels have data too. The fleet is tuned so that every relay path happens
within seconds: every request is at risk, tiers are small enough to evict.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import grpc
import pytest
import yaml

from relaygr.v1 import common_pb2, ranker_pb2, ranker_pb2_grpc
from services.launcher.fleet import Fleet, FleetConfig
from services.launcher.procs import REPO_ROOT, free_port
from tests.monitoring.prometheus import VARIABLES, PrometheusApi, prometheus_config, running
from tools.dashboards.generate import RULES_FILE
from tools.dashboards.queries import all_queries, expand

LOAD = {
    "call": "relaygr.v1.RecommendService.Recommend",
    "insecure": True,
    "data-file": str(REPO_ROOT / "deploy" / "loadtest" / "data" / "recommend.json"),
    "load-schedule": "const",
    "rps": 25,
    "duration": "60s",
    "timeout": "2s",
}
DATA_DEADLINE_S = 60.0
BURST_RANKS = 96
BURST_LENGTH = 512


def has_data(result: list[dict]) -> bool:
    """At least one series with a finite value (a quantile of no observations is NaN)."""
    return any(math.isfinite(float(series["value"][1])) for series in result)


async def overflow_rank_queues(router: str) -> list[grpc.StatusCode]:
    """Many Ranks of distinct users at once: each needs a full compute, so the device queues overflow."""
    events = range(BURST_LENGTH)
    long_term = common_pb2.BehaviorSequence(
        item_ids=list(events), action_types=[i % 8 for i in events], timestamps_ms=list(events)
    )
    async with grpc.aio.insecure_channel(router) as channel:
        stub = ranker_pb2_grpc.RankerServiceStub(channel)

        async def rank(i: int) -> grpc.StatusCode:
            request = ranker_pb2.RankRequest(
                user_id=f"burst-{i}", long_term=long_term, candidate_item_ids=list(range(64))
            )
            try:
                await stub.Rank(request, timeout=10)
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK

        return await asyncio.gather(*(rank(i) for i in range(BURST_RANKS)))


@pytest.fixture
def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    assert path, "prometheus not found: tools/install-system-tools.sh (run by `make test`) installs it"
    return path


def tuned_fleet(log_dir: Path) -> FleetConfig:
    """Every request at risk (a 1 ms SLO), tiers small enough to evict, short histories, short queues."""
    return FleetConfig(
        rankers=2,
        model_preset="cpu-tiny",
        hbm_budget_mb=0.5,
        dram_budget_mb=0.25,
        slo_ms=1.0,
        base_port=0,
        metrics_base_port=0,
        log_dir=str(log_dir),
        startup_timeout_s=120.0,
        ranker_args="--profile-lengths 32,128,512 --profile-repeats 1 --max-queued-ranks 2 --dram-ttl-s 5",
        trigger_args="--relay-overhead-ms 0",  # relay even cpu-tiny's short histories
        stub_args="--history-min 24 --history-median 64 --history-max 256 --relay-window-ms 10",
    )


def fast_rules(path: Path) -> Path:
    """rules.yaml with every group evaluated each second, so a short run sees recorded series."""
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    path.write_text(yaml.safe_dump({"groups": [{**group, "interval": "1s"} for group in groups]}))
    return path


def test_every_dashboard_query_and_recording_rule_returns_data(prometheus_binary, tmp_path):
    missing = {query.source: expand(query.expr, VARIABLES) for query in all_queries()}
    port = free_port()
    with Fleet(tuned_fleet(tmp_path / "logs")) as fleet:
        endpoints = fleet.endpoints()
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump(prometheus_config(endpoints, fast_rules(tmp_path / "rules.yaml"))))
        load = tmp_path / "recommend.json"
        load.write_text(json.dumps({**LOAD, "host": endpoints["retrieval-stub"].address}))
        prometheus = [
            prometheus_binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]  # fmt: skip
        loadgen = [sys.executable, "-m", "services.loadgen", "--config", str(load), "--output", os.devnull]
        with (
            running(prometheus, tmp_path / "prometheus.log"),
            running(loadgen, tmp_path / "loadgen.log") as load_run,
        ):
            codes = asyncio.run(overflow_rank_queues(endpoints["router"].address))
            assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes, codes
            api = PrometheusApi(port)
            deadline = time.monotonic() + DATA_DEADLINE_S
            while missing and time.monotonic() < deadline:
                time.sleep(2)
                fleet.check()
                assert load_run.poll() is None, (tmp_path / "loadgen.log").read_text()
                if api.ready():
                    missing = {
                        source: expr for source, expr in missing.items() if not has_data(api.query(expr))
                    }
    assert not missing, "no data for:\n" + "\n".join(f"{source}: {expr}" for source, expr in missing.items())
