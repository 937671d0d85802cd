"""Open-loop runs over loopback: every request sent on schedule, latency counted from its intended time."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import time

import grpc
from google.protobuf import json_format

from relaygr.v1 import ranker_pb2, ranker_pb2_grpc
from services.launcher.procs import REPO_ROOT, Processes
from services.loadgen.openloop import CallRecord, run_open_loop
from services.workload.universe import UniverseConfig, UserUniverse
from tests.loadgen import ghz_types

SERVICE_DELAY_S = 0.005


class SlowRanker(ranker_pb2_grpc.RankerServiceServicer):
    """Answers every Rank after a fixed delay; users named "down-…" get UNAVAILABLE."""

    async def Rank(self, request, context):
        await asyncio.sleep(SERVICE_DELAY_S)
        if request.user_id.startswith("down-"):
            await context.abort(grpc.StatusCode.UNAVAILABLE, "ranker down")
        return ranker_pb2.RankResponse(scores=[1.0] * len(request.candidate_item_ids), instance="slow")


async def with_server(body):
    server = grpc.aio.server()
    ranker_pb2_grpc.add_RankerServiceServicer_to_server(SlowRanker(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            return await body(ranker_pb2_grpc.RankerServiceStub(channel).Rank)
    finally:
        await server.stop(0)


def rank(user_id: str) -> ranker_pb2.RankRequest:
    return ranker_pb2.RankRequest(user_id=user_id, candidate_item_ids=[1, 2, 3])


def test_a_total_run_sends_every_request_round_robin_and_records_it():
    requests = [rank("user-a"), rank("down-b")]
    records = asyncio.run(with_server(lambda call: run_open_loop(call, requests, rate=200, total=40, seed=1)))
    assert [r.index for r in records] == list(range(40))
    assert all(later.intended_s > earlier.intended_s for earlier, later in itertools.pairwise(records))
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    assert [r.index % 2 for r in ok] == [0] * 20 and len(failed) == 20
    assert all(r.response.instance == "slow" and list(r.response.scores) == [1.0] * 3 for r in ok)
    assert {(r.code, r.details, r.response) for r in failed} == {
        (grpc.StatusCode.UNAVAILABLE, "ranker down", None)
    }
    assert all(r.latency_s >= SERVICE_DELAY_S for r in records)


def test_latency_counts_from_the_intended_send_time_when_the_sender_falls_behind():
    stall_s = 0.2

    def stall_once(record: CallRecord) -> None:
        if record.index == 0:
            time.sleep(stall_s)  # blocks the event loop: requests due meanwhile leave late

    async def body(call):
        return await run_open_loop(call, lambda i: rank(f"user-{i}"), rate=100, duration_s=1.0, seed=2,
                                   on_record=stall_once)  # fmt: skip

    records = asyncio.run(with_server(body))
    late = [r for r in records if r.send_lag_s > stall_s / 2]
    assert late, "the stall must delay some sends"
    assert all(r.latency_s >= r.send_lag_s + SERVICE_DELAY_S for r in records)
    assert max(r.latency_s for r in late) >= stall_s / 2 + SERVICE_DELAY_S
    assert 70 <= len(records) <= 130  # Poisson count at 100/s over 1 s


def test_a_stop_event_ends_an_unbounded_run_and_in_flight_requests_finish():
    seen: list[CallRecord] = []

    async def body(call):
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, stop.set)
        return await run_open_loop(
            call, [rank("u")], rate=100, stop=stop, on_record=seen.append, collect=False
        )

    assert asyncio.run(with_server(body)) == []
    assert 10 <= len(seen) <= 60 and all(r.ok for r in seen)


def test_the_cli_runs_a_ghz_config_against_a_real_ranker(tmp_path):
    config = UniverseConfig(universe_epoch_ms=1_750_000_000_000, history_max=300, num_candidates=16)
    universe = UserUniverse(config)
    entries = []
    for i in range(4):
        history = universe.history(f"user-{i}", universe.epoch_ms)
        request = ranker_pb2.RankRequest(
            user_id=f"user-{i}",
            long_term=history.long_term.to_proto(),
            short_term=history.short_term.to_proto(),
            candidate_item_ids=universe.candidates(f"user-{i}", universe.epoch_ms).tolist(),
        )
        entries.append(json_format.MessageToDict(request))
    (tmp_path / "data.json").write_text(json.dumps(entries))
    with Processes() as processes:
        ranker = processes.start(
            "ranker-0", "services.ranker", "relaygr.v1.RankerService",
            ["--instance-name", "ranker-0", "--model-preset", "cpu-tiny", "--profile-lengths", "32,128",
             "--profile-repeats", "1", "--torch-threads", "1"],
        )  # fmt: skip
        ranker.wait_healthy(120)
        (tmp_path / "config.json").write_text(json.dumps({
            "call": "relaygr.v1.RankerService.Rank", "host": ranker.address, "insecure": True, "rps": 20,
            "total": 30, "concurrency": 8, "timeout": "5s", "data-file": str(tmp_path / "data.json"),
            "name": "rank-smoke",
        }))  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "services.loadgen", "--config", str(tmp_path / "config.json"),
             "--output", str(tmp_path / "report.json"), "--arrival-seed", "3"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["count"] == 30 and report["statusCodeDistribution"] == {"OK": 30}
    assert report["endReason"] == "normal" and report["name"] == "rank-smoke"
    assert 0 < report["fastest"] <= report["slowest"] and report["rps"] > 0
    assert len(report["details"]) == 30
    assert "30 requests" in done.stderr
    # ghz's own Go types read the report: durations in nanoseconds, in the options too.
    assert ghz_types.decode(report, ghz_types.REPORT) == ([], ["report.sendLag"])
    assert (report["options"]["timeout"], report["options"]["total"]) == (5 * 10**9, 30)
