"""`python -m bench tracing` without a fleet: the relayed trace it picks and draws from a synthetic span list
shaped like the fleet's (every span the trace test shows, with its parents, kinds, attributes and the
prefix's link), the overhead arithmetic, the OTLP receiver's records and its process, and the command's
--help."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from bench.lib.probes import LOAD_GENERATOR
from bench.tracing.otlp import ReceiverProcess, SpanRecord, records
from bench.tracing.report import (
    RECEIVER,
    Setting,
    SpanCounts,
    TracingRun,
    count_spans,
    cpu_ms_per_request,
    markdown,
    overhead,
)
from bench.tracing.timeline import draw as draw_timeline
from bench.tracing.timeline import drawable, layout, pick_relayed, relay_facts
from services.launcher.procs import REPO_ROOT

STUB, TRIGGER, ROUTER, RANKER = (
    "relaygr-retrieval-stub",
    "relaygr-trigger",
    "relaygr-router",
    "relaygr-ranker",
)
RANK_METHOD, PRE_INFER_METHOD = "/relaygr.v1.RankerService/Rank", "/relaygr.v1.RankerService/PreInfer"
ADMIT_METHOD, RECOMMEND_METHOD = "/relaygr.v1.TriggerService/Admit", "/relaygr.v1.RecommendService/Recommend"
MS = 1_000_000
T0 = 1_800_000_000_000 * MS
_ids = itertools.count(1)


def make_trace(
    number: int,
    recommend_ms: float,
    production: str = "hit",
    link: bool = True,
    compute_ms: float = 40.0,
    kind: str = "compute",
) -> list[SpanRecord]:
    """One Recommend's spans as the fleet exports them (times in ms from its start): Admit and the
    PreInfer relayed through trigger and router to ranker-1, the production computing the prefix inside
    the 100 ms pre-processing window, then the Rank through the router consuming it."""
    trace_id = f"{number:032x}"
    spans: list[SpanRecord] = []

    def span(service, name, parent, start, end, kind="internal", links=(), **attributes) -> SpanRecord:
        made = SpanRecord(
            service=service, instance="ranker[ranker-1]" if service == RANKER else f"{service}-host-1",
            trace_id=trace_id, span_id=f"{next(_ids):016x}",
            parent_id="" if parent is None else parent.span_id,
            name=name, kind=kind, start_ns=T0 + number * 10_000 * MS + int(start * MS),
            end_ns=T0 + number * 10_000 * MS + int(end * MS), attributes=attributes, links=tuple(links),
        )  # fmt: skip
        spans.append(made)
        return made

    recommend = span(STUB, RECOMMEND_METHOD, None, 0, recommend_ms, "server", **{"relaygr.admitted": True})
    span(STUB, "preprocess", recommend, 0.3, 100.5, **{"relaygr.window_ms": 100.0})
    admit_out = span(STUB, ADMIT_METHOD, recommend, 0.4, 6.0, "client")
    admit = span(TRIGGER, ADMIT_METHOD, admit_out, 1.0, 5.5, "server", **{"relaygr.admitted": True})
    pre_out = span(TRIGGER, PRE_INFER_METHOD, admit, 1.5, 5.0, "client")
    routed = span(ROUTER, PRE_INFER_METHOD, pre_out, 2.0, 4.6, "server")
    forward = span(ROUTER, PRE_INFER_METHOD, routed, 2.2, 4.4, "client")
    pre_infer = span(
        RANKER, PRE_INFER_METHOD, forward, 2.6, 4.0, "server", **{"relaygr.instance": "ranker-1"}
    )
    made = span(RANKER, "production", pre_infer, 2.8, 8.0 + compute_ms, **{"relaygr.kind": kind})
    span(RANKER, "queue", made, 3.0, 7.0, **{"relaygr.op": "compute"})
    span(RANKER, "compute", made, 7.0, 7.0 + compute_ms, **{"relaygr.batch_size": 1})
    rank_out = span(STUB, RANK_METHOD, recommend, 101.0, recommend_ms - 1, "client")
    rank_routed = span(ROUTER, RANK_METHOD, rank_out, 102.0, recommend_ms - 2, "server")
    rank_forward = span(ROUTER, RANK_METHOD, rank_routed, 102.3, recommend_ms - 2.3, "client")
    about = {"relaygr.instance": "ranker-1", "relaygr.long_term_length": 1500, "relaygr.cache_source": "hbm"}
    rank = span(RANKER, RANK_METHOD, rank_forward, 103.0, recommend_ms - 3, "server", **about)
    links = [(trace_id, pre_infer.span_id)] if link else []
    ready = max(103.4, 7.2 + compute_ms)  # a joined prefix is ready when its computation ends
    span(RANKER, "prefix", rank, 103.2, ready, links=links, **{"relaygr.production": production})
    span(RANKER, "queue", rank, ready + 0.1, ready + 0.6, **{"relaygr.op": "model"})
    span(RANKER, "model", rank, ready + 0.6, recommend_ms - 4, **{"relaygr.batch_size": 2})
    return spans


def test_the_picked_trace_is_relayed_and_near_the_median() -> None:
    spans = [
        *make_trace(1, 110.0),  # relayed, fast
        *make_trace(2, 121.0),  # relayed, nearest the median (120) among the relayed
        *make_trace(3, 120.0, production="computed", link=False),  # the median itself, but a miss
        *make_trace(4, 150.0, production="joined"),
        *make_trace(5, 125.0, link=False),  # a hit without its PreInfer link: not relayed by this trace
    ]
    assert pick_relayed(spans) == f"{2:032x}"
    # A PreInfer that computed the whole prefix is preferred to one that extended a prefix kept in DRAM.
    assert pick_relayed([*spans, *make_trace(9, 120.0, kind="extend")]) == f"{2:032x}"
    assert pick_relayed([*make_trace(10, 120.0, kind="extend"), *make_trace(11, 140.0, kind="reload")]) == (
        f"{10:032x}"
    )
    # A trace missing a span the picture needs is not drawable; none at all gives None.
    incomplete = [s for s in make_trace(6, 120.0) if s.name != "compute"]
    assert not drawable(incomplete)
    assert pick_relayed(incomplete + make_trace(7, 120.0, link=False)) is None


def test_the_timeline_is_drawn_from_the_picked_trace(tmp_path) -> None:
    spans = make_trace(8, 130.0, production="joined", compute_ms=110.0)
    path = tmp_path / "timeline.png"
    draw_timeline(spans, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000

    # One lane per service (ranker-1 its own), a child below its parent within a lane.
    bars = {bar.span.span_id: bar for bar in layout(spans)}
    assert sorted({bar.lane[1] for bar in bars.values()}) == [
        "ranker-1",
        "retrieval stub",
        "router",
        "trigger",
    ]
    for bar in bars.values():
        parent = bars.get(bar.span.parent_id)
        if parent is not None and parent.lane == bar.lane:
            assert bar.row > parent.row, bar.span.name

    facts = relay_facts(spans)
    assert facts.production == "joined" and facts.production_kind == "compute"
    assert facts.long_term_length == 1500 and facts.instance == "ranker-1"
    assert facts.window_ms == (0.3, 100.5) and facts.compute_ms == (7.0, 117.0)
    assert facts.compute_in_window == pytest.approx(93.5 / 110, abs=1e-3)


def test_cpu_per_request_by_service() -> None:
    cpu_s = {
        "ranker-0": 3.0, "ranker-1": 1.0, "router": 0.5, "trigger": 0.25, "retrieval-stub": 0.75,
        LOAD_GENERATOR: 2.0, RECEIVER: 1.0,
    }  # fmt: skip
    ms = cpu_ms_per_request(cpu_s, 500)
    assert (
        ms["rankers"] == 8.0 and ms["router"] == 1.0 and ms["trigger"] == 0.5 and ms["retrieval stub"] == 1.5
    )
    assert ms["total"] == 11.0  # the fleet's four services only
    assert ms["load generator"] == 4.0 and ms[RECEIVER] == 2.0
    assert cpu_ms_per_request(cpu_s, 0)["total"] == 0.0


def setting(
    name: str, ratio: float | None, p50: float, p99: float, cpu: dict[str, float], spans=()
) -> Setting:
    cpu_ms = {**cpu, "total": sum(cpu.values()), "load generator": 1.0, RECEIVER: 0.0}
    return Setting(
        name=name, sample_ratio=ratio, rate=10.0, requests=650, measured=600, errors=0,
        recommend_ms={"p50": p50, "p90": p99, "p99": p99},
        rank_ms={"p50": p50 - 100, "p90": None, "p99": p99 - 100},
        cache_sources={"hbm": 600}, cpu_ms=cpu_ms, foreign_cores=0.01, send_lag_p99_ms=0.5, wall_s=70.0,
        received=count_spans(list(spans)),
    )  # fmt: skip


def test_the_overhead_against_tracing_off() -> None:
    off = setting(
        "off", None, 110.0, 150.0, {"retrieval stub": 2.0, "trigger": 1.0, "router": 1.5, "rankers": 15.5}
    )
    full = setting(
        "1", 1.0, 115.5, 180.0, {"retrieval stub": 3.0, "trigger": 1.5, "router": 3.0, "rankers": 17.5}
    )
    o = overhead(full, off)
    assert (o.recommend_p50, o.recommend_p99, o.rank_p50, o.rank_p99) == (1.05, 1.2, 1.55, 1.6)
    assert o.cpu == {"retrieval stub": 1.5, "trigger": 1.5, "router": 2.0, "rankers": 1.129, "total": 1.25}
    assert o.cpu_added_ms == {
        "retrieval stub": 1.0,
        "trigger": 0.5,
        "router": 1.5,
        "rankers": 2.0,
        "total": 5.0,
    }
    # A latency that fell on a failed request (None) gives no ratio rather than a wrong one.
    failed = setting(
        "1", 1.0, 115.5, 180.0, {"retrieval stub": 3.0, "trigger": 1.5, "router": 3.0, "rankers": 1}
    )
    failed.recommend_ms["p99"] = None
    assert overhead(failed, off).recommend_p99 is None

    traced = make_trace(1, 120.0) + make_trace(2, 130.0)
    counts = count_spans([s for s in traced if s.name != "preprocess"] + [orphan(traced[0])])
    assert counts.traces == 3 and counts.roots == 2 and counts.orphans == 1
    assert counts.spans == len(traced) - 2 + 1 and counts.by_name["ranker prefix"] == 2

    run = TracingRun(
        started_at="2026-01-01T00:00:00+00:00", wall_s=300.0, git_commit="abc1234",
        machine={"cores": 2, "load_average_at_start": [0.1, 0.2, 0.3], "load_average_at_end": [0.5, 0.4, 0.3],
                 "busy_at_start": []},
        configuration={"rankers": 2, "model_preset": "cpu-small", "rate": 10.0, "warmup": 50, "requests": 600,
                       "universe": "mix", "relay_window_ms": 100.0, "bsp_schedule_delay_ms": 5000},
        settings=[off, full], overhead=[o], timeline=None,
    )  # fmt: skip
    text = markdown(run)
    assert "| 1 | x1.05 | x1.20 | x1.60 |" in text and "**x1.25** | +5.00 |" in text
    assert "No complete relayed trace" in text


def orphan(like: SpanRecord) -> SpanRecord:
    return SpanRecord(**{**like.__dict__, "trace_id": "f" * 32, "span_id": "e" * 16, "parent_id": "d" * 16})


def test_records_of_an_export_request(tmp_path) -> None:
    def text(key: str, value: str) -> common_pb2.KeyValue:
        return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=value))

    span = trace_pb2.Span(
        trace_id=bytes(range(16)), span_id=bytes(range(8)), parent_span_id=b"", name="prefix",
        kind=trace_pb2.Span.SPAN_KIND_INTERNAL, start_time_unix_nano=5, end_time_unix_nano=9,
        attributes=[text("relaygr.production", "hit"),
                    common_pb2.KeyValue(key="relaygr.batch_size", value=common_pb2.AnyValue(int_value=3))],
        links=[trace_pb2.Span.Link(trace_id=bytes(range(16)), span_id=bytes([7] * 8))],
    )  # fmt: skip
    request = trace_service_pb2.ExportTraceServiceRequest(
        resource_spans=[
            trace_pb2.ResourceSpans(
                resource=resource_pb2.Resource(
                    attributes=[text("service.name", RANKER), text("service.instance.id", "ranker-0")]
                ),
                scope_spans=[trace_pb2.ScopeSpans(spans=[span])],
            )
        ]
    )
    (record,) = records(request)
    assert (record.service, record.instance, record.name, record.kind) == (
        RANKER,
        "ranker-0",
        "prefix",
        "internal",
    )
    assert record.trace_id == bytes(range(16)).hex() and record.parent_id == ""
    assert record.attributes == {"relaygr.production": "hit", "relaygr.batch_size": 3}
    assert record.links == ((bytes(range(16)).hex(), "07" * 8),)
    assert isinstance(count_spans([record]), SpanCounts)

    # A receiver process gets the same over OTLP/gRPC, writes it and reads it back once stopped.
    with ReceiverProcess(tmp_path / "spans.jsonl") as receiver:
        assert receiver.endpoint == f"http://127.0.0.1:{receiver.port}" and receiver.pid != os.getpid()
        with grpc.insecure_channel(f"127.0.0.1:{receiver.port}") as channel:
            trace_service_pb2_grpc.TraceServiceStub(channel).Export(request, timeout=30)
        receiver.stop()
        assert receiver.records() == [record]
    assert not Path(f"/proc/{receiver.pid}").exists()  # stopped and reaped: nothing left behind


def test_the_command_line_help() -> None:
    answer = subprocess.run(
        [sys.executable, "-m", "bench", "tracing", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert answer.returncode == 0, answer.stderr
    for flag in ("--rate", "--requests", "--output", "--sample-ratios", "--model-preset", "--quiet-wait-s"):
        assert flag in answer.stdout
    assert "bench/results/tracing" in answer.stdout and "RELAYGR_RATE" in answer.stdout
