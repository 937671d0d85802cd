"""One Recommend, one trace: every service it passes exports its spans to a real OTLP/gRPC receiver.

The receiver is the collector's protocol itself (`opentelemetry.proto.collector.trace.v1.TraceService`)
served by grpc on loopback; the fleet is the launcher's, every service a process told where to export by
its `RELAYGR_OTLP_ENDPOINT` twin, sampling every Recommend.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from opentelemetry.proto.trace.v1 import trace_pb2

from bench.tracing.otlp import OtlpReceiver
from relaygr.v1 import common_pb2, recommend_pb2, recommend_pb2_grpc
from services.common.tracing import user_hash
from services.launcher.fleet import STUB, Fleet, FleetConfig

RANKER_SERVICE_SPAN = "/relaygr.v1.RankerService/"
RECOMMEND_SPAN = "/relaygr.v1.RecommendService/Recommend"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    """A receiver of one test's spans only."""
    with OtlpReceiver() as receiver:
        yield receiver


def attributes(span: trace_pb2.Span) -> dict[str, object]:
    values: dict[str, object] = {}
    for attribute in span.attributes:
        value = attribute.value
        values[attribute.key] = getattr(value, value.WhichOneof("value"))
    return values


def wait_for_root(receiver: OtlpReceiver, timeout_s: float = 30) -> trace_pb2.Span:
    """The one Recommend span the stub exported: the root of the trace."""
    deadline = time.monotonic() + timeout_s
    while True:
        roots = [
            span for service, span in receiver.spans()
            if service == "relaygr-retrieval-stub" and span.name == RECOMMEND_SPAN
        ]  # fmt: skip
        if roots:
            (root,) = roots
            assert not root.parent_span_id
            return root
        assert time.monotonic() < deadline, "no Recommend span exported"
        time.sleep(0.1)


def wait_for_spans(
    receiver: OtlpReceiver, trace_id: bytes, expected: set[tuple[str, str]], timeout_s: float = 30
):
    deadline = time.monotonic() + timeout_s
    while True:
        spans = receiver.trace(trace_id)
        if expected <= {(service, span.name) for service, span in spans}:
            return spans
        if time.monotonic() > deadline:
            seen = sorted({(service, span.name) for service, span in spans})
            raise AssertionError(f"missing {sorted(expected - set(seen))}; seen {seen}")
        time.sleep(0.1)


@pytest.mark.parametrize("routing", ["direct", "router"])
def test_a_relayed_recommend_is_one_trace_across_the_services(
    receiver, tmp_path, monkeypatch, routing
) -> None:
    """Direct routing: stub -> trigger -> ranker and stub -> ranker; through the router, each call to a
    ranker passes the router's server span and its forward."""
    collector = receiver
    via = "relaygr-router" if routing == "router" else None
    monkeypatch.setenv("RELAYGR_OTLP_ENDPOINT", collector.endpoint)
    monkeypatch.setenv("RELAYGR_TRACE_SAMPLE_RATIO", "1")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within 0.1 s, not the SDK's 5 s
    config = FleetConfig(
        rankers=1, model_preset="cpu-tiny", base_port=0, metrics_base_port=0, log_dir=str(tmp_path / "logs"),
        routing=routing,
        ranker_args="--profile-lengths 32,128 --profile-repeats 1",
        # Admit everything, with a pre-processing window long enough for the prefix to be ready or joined,
        # and an Admit deadline a busy test machine cannot turn into no relay (the first traced Admit pays
        # the exporter's and the cold paths' start-up).
        trigger_args="--admit-all true",
        stub_args=(
            "--history-max 256 --num-candidates 16 --rank-timeout-ms 20000 --relay-window-ms 30 "
            "--admit-timeout-ms 5000"
        ),
    )  # fmt: skip
    with Fleet(config) as fleet:
        endpoints = fleet.endpoints()
        with grpc.insecure_channel(endpoints[STUB].address) as channel:
            stub = recommend_pb2_grpc.RecommendServiceStub(channel)
            answer = stub.Recommend(
                recommend_pb2.RecommendRequest(user_id="traced-user", top_k=4), timeout=30
            )
        assert answer.admitted and answer.cache_source == common_pb2.CACHE_SOURCE_HBM

        root = wait_for_root(collector)
        spans = wait_for_spans(
            collector,
            root.trace_id,
            {
                ("relaygr-retrieval-stub", RECOMMEND_SPAN),
                ("relaygr-retrieval-stub", "preprocess"),
                ("relaygr-trigger", "/relaygr.v1.TriggerService/Admit"),
                *(
                    [(via, RANKER_SERVICE_SPAN + "PreInfer"), (via, RANKER_SERVICE_SPAN + "Rank")]
                    if via
                    else []
                ),
                ("relaygr-ranker", RANKER_SERVICE_SPAN + "PreInfer"),
                ("relaygr-ranker", RANKER_SERVICE_SPAN + "Rank"),
                ("relaygr-ranker", "production"),
                ("relaygr-ranker", "compute"),
                ("relaygr-ranker", "prefix"),
                ("relaygr-ranker", "model"),
            },
        )
    by_id = {span.span_id: (service, span) for service, span in spans}

    def parent(service: str, name: str, kind: int | None = None) -> tuple[str, str]:
        """(service, name) of the parent of the one span of `service` called `name` (of `kind`)."""
        (span,) = [
            s for svc, s in spans if svc == service and s.name == name and (kind is None or s.kind == kind)
        ]
        parent_service, parent_span = by_id[span.parent_span_id]
        return parent_service, parent_span.name

    server = trace_pb2.Span.SPAN_KIND_SERVER
    # Admit -> PreInfer: stub (client) -> trigger (server) -> trigger's client -> [router] -> ranker.
    assert parent("relaygr-trigger", "/relaygr.v1.TriggerService/Admit", server) == (
        "relaygr-retrieval-stub", "/relaygr.v1.TriggerService/Admit",
    )  # fmt: skip
    # Rank: stub -> [router] -> ranker, and the ranker's stages under its Rank.
    for method, caller in (("PreInfer", "relaygr-trigger"), ("Rank", "relaygr-retrieval-stub")):
        if via:
            assert parent(via, RANKER_SERVICE_SPAN + method, server) == (caller, RANKER_SERVICE_SPAN + method)
            caller = via
        assert parent("relaygr-ranker", RANKER_SERVICE_SPAN + method, server) == (
            caller, RANKER_SERVICE_SPAN + method,
        )  # fmt: skip
    rank_span = ("relaygr-ranker", RANKER_SERVICE_SPAN + "Rank")
    assert parent("relaygr-ranker", "prefix") == rank_span
    assert parent("relaygr-ranker", "model") == rank_span
    # The pre-inference's production, queued and computed, under the ranker's PreInfer.
    pre_infer_span = ("relaygr-ranker", RANKER_SERVICE_SPAN + "PreInfer")
    assert parent("relaygr-ranker", "production") == pre_infer_span
    assert parent("relaygr-ranker", "compute") == ("relaygr-ranker", "production")
    assert parent("relaygr-retrieval-stub", "preprocess") == (
        "relaygr-retrieval-stub", RECOMMEND_SPAN,
    )  # fmt: skip

    # The relay: the Rank's prefix span links to the ranker's PreInfer span, in the same trace.
    (ranker_pre_infer,) = [s for svc, s in spans if (svc, s.name) == pre_infer_span and s.kind == server]
    (prefix,) = [s for svc, s in spans if (svc, s.name) == ("relaygr-ranker", "prefix")]
    assert [(link.trace_id, link.span_id) for link in prefix.links] == [
        (ranker_pre_infer.trace_id, ranker_pre_infer.span_id)
    ]
    assert attributes(prefix)["relaygr.production"] in ("hit", "joined")

    # What an operator asks, on the ranker's Rank span; the user only as its hash.
    (ranker_rank,) = [s for svc, s in spans if (svc, s.name) == rank_span and s.kind == server]
    rank_attributes = attributes(ranker_rank)
    assert rank_attributes["relaygr.cache_source"] == "hbm"
    assert rank_attributes["relaygr.instance"] == "ranker-0"
    assert rank_attributes["relaygr.long_term_length"] == answer.long_term_length
    assert rank_attributes["relaygr.batch_size"] >= 1
    assert rank_attributes["relaygr.user_hash"] == user_hash("traced-user")
    for _, span in spans:
        assert "traced-user" not in {str(value) for value in attributes(span).values()}, span.name
    (admit,) = [s for svc, s in spans if svc == "relaygr-trigger" and s.kind == server]
    assert attributes(admit)["relaygr.admitted"] is True
    assert attributes(admit)["relaygr.relay_instance"] == "ranker-0"
    # Every span is inside its trace's root in time, apart from the production it outlived.
    assert all(span.start_time_unix_nano >= root.start_time_unix_nano for _, span in spans)
    # Only the request was traced: no health check, reflection or GetProfile poll of the fleet's start-up
    # and steady state started a trace of its own, and every span exported is this Recommend's.
    assert {span.trace_id for _, span in collector.spans()} == {root.trace_id}
    assert all(span.status.code != span.status.STATUS_CODE_ERROR for _, span in spans)
    (ranker_rank_client,) = [
        s
        for svc, s in spans
        if (svc, s.name) == (via or "relaygr-retrieval-stub", rank_span[1]) and s.kind != server
    ]
    assert attributes(ranker_rank_client)["rpc.grpc.status_code"] == 0
