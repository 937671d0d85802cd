"""ghz config files parse into real protobuf requests, their paths taken from the working directory as ghz
takes them; reports have ghz's shape and arithmetic, and decode into ghz's own Go types."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import grpc
import pytest

from relaygr.v1 import ranker_pb2, recommend_pb2
from services.launcher.procs import REPO_ROOT
from services.loadgen.__main__ import channel_options
from services.loadgen.ghz_config import (
    GHZ_DURATION_TOTAL,
    GhzConfig,
    go_duration_ns,
    load_ghz_config,
    parse_go_duration,
)
from services.loadgen.openloop import CallRecord
from services.loadgen.report import ghz_report, go_code_name
from services.loadgen.schedule import RateSchedule
from tests.loadgen import ghz_types

# The top-level keys of a ghz JSON report (runner/reporter.go), and the keys of its nested entries.
GHZ_REPORT_KEYS = {
    "date", "endReason", "options", "count", "total", "average", "fastest", "slowest", "rps",
    "errorDistribution", "statusCodeDistribution", "latencyDistribution", "histogram", "details",
}  # fmt: skip

RANK_ENTRY = {
    "userId": "user-1",
    "requestId": "r-1",
    "longTerm": {"itemIds": ["11", "12", "13"], "actionTypes": [0, 1, 2], "timestampsMs": ["1", "2", "3"]},
    "shortTerm": {"itemIds": ["14"], "actionTypes": [3], "timestampsMs": ["4"]},
    "candidateItemIds": ["7", "8"],
}


def test_go_durations_parse_like_go():
    assert parse_go_duration("10s", "d") == 10
    assert parse_go_duration("1m30s", "d") == 90
    assert parse_go_duration("250ms", "d") == pytest.approx(0.25)
    assert parse_go_duration("1.5h", "d") == 5400
    for bad in ("10", "ten seconds", "10s junk", ""):
        with pytest.raises(ValueError, match="d"):
            parse_go_duration(bad, "d")
    # time.Duration's unit, exactly: no float rounding on the way.
    assert go_duration_ns("1m30.5s", "d") == 90_500_000_000
    assert go_duration_ns("1.000000001s", "d") == 1_000_000_001


def test_a_rank_config_with_a_data_file_parses_into_rank_requests(tmp_path):
    (tmp_path / "rank.json").write_text(json.dumps([RANK_ENTRY, {**RANK_ENTRY, "userId": "user-2"}]))
    config_path = tmp_path / "rank-config.json"
    config_path.write_text(json.dumps({
        "call": "relaygr.v1.RankerService.Rank", "host": "127.0.0.1:50050", "insecure": True, "rps": 50,
        "duration": "2s", "total": 999, "concurrency": 50, "timeout": "500ms", "data-file": "rank.json",
        "metadata": {"X-Tenant": "demo"},
    }))  # fmt: skip
    config = load_ghz_config(config_path, base_dir=tmp_path)
    assert config.method.path == "/relaygr.v1.RankerService/Rank"
    assert config.method.request_class is ranker_pb2.RankRequest
    first, second = config.requests
    assert isinstance(first, ranker_pb2.RankRequest)
    assert (first.user_id, second.user_id) == ("user-1", "user-2")
    assert list(first.long_term.item_ids) == [11, 12, 13] and list(first.candidate_item_ids) == [7, 8]
    assert config.schedule == RateSchedule.constant(50)
    assert (config.duration_s, config.total) == (2.0, None)  # ghz: a duration overrides total
    assert config.timeout_s == 0.5
    assert config.metadata == (("x-tenant", "demo"),)


def test_a_step_schedule_and_inline_data_with_field_names_parse():
    config = GhzConfig.from_dict({
        "call": "relaygr.v1.RecommendService/Recommend", "host": "h:1", "total": 10,
        "load-schedule": "step", "load-start": 5, "load-step": 5, "load-step-duration": "2s", "load-end": 20,
        "data": {"user_id": "u", "top_k": 3},
    })  # fmt: skip
    assert config.requests == (recommend_pb2.RecommendRequest(user_id="u", top_k=3),)
    assert config.schedule == RateSchedule(start=5, step=5, step_duration_s=2.0, end=20)
    assert (config.total, config.duration_s, config.insecure) == (10, None, False)


def test_relative_paths_are_taken_from_the_working_directory_as_ghz_takes_them(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rank.json").write_text(json.dumps([RANK_ENTRY]))
    config_path = tmp_path / "data" / "config.json"
    config_path.write_text(json.dumps({
        "call": "relaygr.v1.RankerService.Rank", "host": "h:1", "rps": 5, "data-file": "data/rank.json",
    }))  # fmt: skip
    monkeypatch.chdir(tmp_path)
    config = load_ghz_config("data/config.json")
    assert config.paths == {"data-file": tmp_path / "data" / "rank.json"}
    assert config.requests[0].user_id == "user-1"
    # From the config's own folder the same path names nothing: ghz would fail there too.
    monkeypatch.chdir(tmp_path / "data")
    with pytest.raises(ValueError, match=r"data-file: no file data/rank.json in .*working directory"):
        load_ghz_config("config.json")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"concurency": 5}, "unknown ghz config keys: concurency"),
        ({"call": "relaygr.v1.RankerService.Nope"}, "no method"),
        ({"data": [{"userId": "u", "bogus": 1}]}, r"data\[0\]"),
        ({"data": []}, "non-empty array"),
        ({"rps": 0}, "needs a rate"),
        ({"timeout": "20"}, "timeout"),
        # ghz reads these into Go integers, booleans and strings, and refuses the config otherwise.
        ({"rps": 2.5}, "rps: ghz takes a whole number"),
        ({"connections": "2"}, "connections: ghz takes a whole number"),
        ({"concurrency": -1}, "concurrency: must be at least 0"),
        ({"insecure": "true"}, "insecure: ghz takes true or false"),
        ({"keepalive": 30}, "keepalive"),
        ({"tags": {"run": 1}}, "tags"),
        ({"protoset": "no/such.protoset"}, "protoset: no file no/such.protoset"),
        ({"lb-strategy": "roundrobin"}, "lb-strategy: 'roundrobin' is not one of"),
    ],
)
def test_mistakes_in_a_config_are_reported_by_key(change, message):
    raw = {"call": "relaygr.v1.RankerService.Rank", "host": "h:1", "rps": 10, "data": RANK_ENTRY, **change}
    with pytest.raises(ValueError, match=message):
        GhzConfig.from_dict(raw)


def record(index: int, latency_s: float, code: grpc.StatusCode = grpc.StatusCode.OK) -> CallRecord:
    ok = code == grpc.StatusCode.OK
    return CallRecord(index, index * 0.01, index * 0.01 + 0.001, latency_s, code, "" if ok else "boom", None)


def test_the_report_has_ghz_keys_nanoseconds_and_ghz_percentiles():
    latencies = [0.001 * (i + 1) for i in range(100)]  # 1..100 ms
    records = [record(i, latency) for i, latency in enumerate(latencies)]
    records.append(record(100, 0.5, grpc.StatusCode.UNAVAILABLE))
    records.append(record(101, 0.5, grpc.StatusCode.DEADLINE_EXCEEDED))
    started = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    report = ghz_report(records, 2.0, started, {"call": "x"}, skip_first=0)
    assert set(report) >= GHZ_REPORT_KEYS
    assert json.loads(json.dumps(report)) == report
    assert report["count"] == 102 and report["total"] == 2_000_000_000 and report["rps"] == 51.0
    assert report["fastest"] == 1_000_000 and report["slowest"] == 100_000_000  # successes only
    assert report["average"] == round((sum(latencies) + 1.0) / 102 * 1e9)  # every result
    assert report["statusCodeDistribution"] == {"OK": 100, "Unavailable": 1, "DeadlineExceeded": 1}
    assert report["errorDistribution"] == {
        "rpc error: code = Unavailable desc = boom": 1,
        "rpc error: code = DeadlineExceeded desc = boom": 1,
    }
    # ghz's nearest rank: P50 of 1..100 ms is the 50th value, P99 the 99th.
    percentiles = {entry["percentage"]: entry["latency"] for entry in report["latencyDistribution"]}
    assert list(percentiles) == [10, 25, 50, 75, 90, 95, 99]
    assert percentiles[50] == 50_000_000 and percentiles[99] == 99_000_000
    buckets = report["histogram"]
    assert len(buckets) == 11 and sum(bucket["count"] for bucket in buckets) == 100
    assert buckets[0]["mark"] == pytest.approx(0.001) and buckets[-1]["mark"] == pytest.approx(0.1)
    assert report["details"][0] == {
        "timestamp": "2026-01-02T03:04:05.000000Z", "latency": 1_000_000, "error": "", "status": "OK",
    }  # fmt: skip
    assert ghz_types.decode(report, ghz_types.REPORT) == ([], ["report.sendLag"])


def test_skip_first_leaves_warm_up_out_of_the_report():
    records = [record(0, 5.0)] + [record(i, 0.01) for i in range(1, 11)]
    report = ghz_report(records, 1.0, datetime.datetime.now(datetime.UTC), {}, skip_first=1)
    assert report["count"] == 10 and report["slowest"] == 10_000_000


def test_status_names_follow_go():
    assert go_code_name(grpc.StatusCode.CANCELLED) == "Canceled"
    assert go_code_name(grpc.StatusCode.RESOURCE_EXHAUSTED) == "ResourceExhausted"
    assert go_code_name(grpc.StatusCode.OK) == "OK"


SHIPPED_CONFIGS = sorted((REPO_ROOT / "deploy" / "loadtest").glob("*.json"))


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=[path.name for path in SHIPPED_CONFIGS])
def test_every_shipped_ghz_config_and_data_entry_parses_into_real_messages(path):
    config = load_ghz_config(path, base_dir=REPO_ROOT)
    raw = json.loads(path.read_text())
    entries = json.loads((REPO_ROOT / raw["data-file"]).read_text()) if "data-file" in raw else raw["data"]
    assert len(config.requests) == (len(entries) if isinstance(entries, list) else 1)
    assert all(isinstance(request, config.method.request_class) for request in config.requests)


def shipped_report(path: Path, host: str = "127.0.0.1:50050") -> tuple[dict, dict, GhzConfig]:
    """The report the CLI writes for a run of the shipped config at `path` (one success, one failure)."""
    config = load_ghz_config(path, base_dir=REPO_ROOT)
    records = [record(0, 0.004), record(1, 0.5, grpc.StatusCode.UNAVAILABLE)]
    started = datetime.datetime(2026, 1, 2, 3, 4, 5, 250_000, tzinfo=datetime.UTC)
    options = {**config.options, "host": host}
    report = ghz_report(
        records, 1.0, started, options, "timeout", config.skip_first, config.name, config.tags
    )
    return json.loads(json.dumps(report)), json.loads(path.read_text()), config


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=[path.name for path in SHIPPED_CONFIGS])
def test_a_report_of_every_shipped_config_decodes_into_ghz_go_types(path):
    report, raw, config = shipped_report(path)
    assert ghz_types.decode(report, ghz_types.REPORT) == ([], ["report.sendLag"])
    options = report["options"]
    # Exactly runner.Options' JSON names, and every field Go always writes.
    assert ghz_types.OPTIONS_ALWAYS <= set(options) <= set(ghz_types.OPTIONS)
    # Durations in time.Duration's nanoseconds, as ghz reads them from the config.
    assert options["duration"] == go_duration_ns(raw["duration"], "duration")
    assert options["timeout"] == go_duration_ns(raw["timeout"], "timeout")
    assert options["dial-timeout"] == 10 * 10**9  # ghz's default connect-timeout
    if "load-step-duration" in raw:
        assert options["load-step-duration"] == go_duration_ns(raw["load-step-duration"], "s")
        assert options["load-max-duration"] == go_duration_ns(raw["load-max-duration"], "m")
    assert options["total"] == GHZ_DURATION_TOTAL  # what ghz sets when a duration bounds the run
    assert (options["call"], options["host"], options["protoset"]) == (
        raw["call"], "127.0.0.1:50050", raw["protoset"],
    )  # fmt: skip
    assert (options["connections"], options["concurrency"]) == (raw["connections"], raw["concurrency"])
    # The call data itself, which ghz reads a data-file into; name and tags at the top, as ghz puts them.
    assert options["data"] == json.loads((REPO_ROOT / raw["data-file"]).read_text())
    assert (report["name"], report["tags"]) == (raw["name"], raw["tags"]) == (config.name, config.tags)
    assert report["date"].endswith("Z") and report["details"][0]["timestamp"] == "2026-01-02T03:04:05.250000Z"


def test_the_go_types_refuse_what_ghz_refuses():
    """The check above is not vacuous: a Go duration string, a fraction where Go has an integer, or a
    date that is not RFC 3339 is refused, as Go's decoder refuses it."""
    report, _, _ = shipped_report(SHIPPED_CONFIGS[0])
    spoiled = {
        **report,
        "options": {**report["options"], "duration": "60s", "rps": 20.5},
        "count": 2.0,
        "date": "2026-01-02 03:04:05",
    }
    errors, _ = ghz_types.decode(spoiled, ghz_types.REPORT)
    assert [error.split(":")[0] for error in errors] == [
        "report.date", "report.options.rps", "report.options.duration", "report.count",
    ]  # fmt: skip


def test_the_lb_strategy_becomes_each_channels_balancing_policy():
    raw = {"call": "relaygr.v1.RankerService.Rank", "host": "dns:///routers:1", "rps": 10, "data": RANK_ENTRY}
    balanced = GhzConfig.from_dict({**raw, "lb-strategy": "round_robin", "connections": 2})
    assert balanced.lb_strategy == "round_robin"
    assert ("grpc.lb_policy_name", "round_robin") in channel_options(balanced)
    plain = GhzConfig.from_dict(raw)
    assert plain.lb_strategy == "" and all(key != "grpc.lb_policy_name" for key, _ in channel_options(plain))
    # The shipped router configs dial the routers' headless Service with round_robin, as ghz would.
    for name in ("rank.json", "pre-infer.json"):
        shipped = load_ghz_config(REPO_ROOT / "deploy" / "loadtest" / name, base_dir=REPO_ROOT)
        assert shipped.host.startswith("dns:///") and shipped.lb_strategy == "round_robin", name
