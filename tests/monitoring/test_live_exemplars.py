"""From a P99 panel to the trace: a real Prometheus, started with `--enable-feature=exemplar-storage`, scrapes
a traced local fleet and holds, for every dashboard query that asks for exemplars, exemplars whose
`trace_id` is a trace the services exported.

The fleet (one cpu-tiny ranker, router, trigger, retrieval stub) exports its spans to an OTLP/gRPC receiver
in this test (the collector's TraceService on loopback) and samples every Recommend; Prometheus scrapes
the metrics ports every second with the labels the PodMonitor gives in a cluster (test_live_prometheus's
configuration), so the dashboards' own exemplar queries run unchanged.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from relaygr.v1 import recommend_pb2, recommend_pb2_grpc
from services.common.tracing import EXEMPLAR_LABEL
from services.launcher.fleet import STUB, Fleet, FleetConfig
from services.launcher.procs import free_port
from tests.monitoring.prometheus import VARIABLES, PrometheusApi, prometheus_config, running
from tools.dashboards.queries import exemplar_queries, expand

RECOMMENDS = 6
DEADLINE_S = 30.0
TRACE_ID = re.compile(r"[0-9a-f]{32}")


class TraceIds(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver that keeps the trace id (hex) of every span it is sent."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._lock = threading.Lock()

    def Export(self, request, context):
        with self._lock:
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    self._ids.update(span.trace_id.hex() for span in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def ids(self) -> set[str]:
        with self._lock:
            return set(self._ids)


@pytest.fixture
def receiver() -> Iterator[tuple[TraceIds, int]]:
    received = TraceIds()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(received, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield received, port
    finally:
        server.stop(0)


def query_exemplars(api: PrometheusApi, expr: str, start: float) -> list[str]:
    """The `trace_id`s of the exemplars Prometheus holds for `expr`'s series since `start`."""
    params = {"query": expr, "start": f"{start:.3f}", "end": f"{time.time() + 1:.3f}"}
    url = f"{api.base}/api/v1/query_exemplars?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=5) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return [
        exemplar["labels"].get(EXEMPLAR_LABEL, "")
        for series in body["data"]
        for exemplar in series["exemplars"]
    ]


def test_p99_panels_exemplars_are_trace_ids_the_collector_received(receiver, tmp_path, monkeypatch):
    prometheus_binary = shutil.which("prometheus")
    assert prometheus_binary, (
        "prometheus not found: tools/install-system-tools.sh (run by `make test`) installs it"
    )
    queries = {query.source: expand(query.expr, VARIABLES) for query in exemplar_queries()}
    assert queries, "no dashboard query asks for exemplars"
    received, otlp_port = receiver
    monkeypatch.setenv("RELAYGR_OTLP_ENDPOINT", f"http://127.0.0.1:{otlp_port}")
    monkeypatch.setenv("RELAYGR_TRACE_SAMPLE_RATIO", "1")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within 0.1 s, not the SDK's 5 s
    config = FleetConfig(
        rankers=1, model_preset="cpu-tiny", base_port=0, metrics_base_port=0, log_dir=str(tmp_path / "logs"),
        startup_timeout_s=120.0, ranker_args="--torch-threads 1 --profile-lengths 32,128 --profile-repeats 1",
        trigger_args="--admit-all true",  # every Recommend relays: Admit, PreInfer and Rank all observed
        stub_args="--history-max 256 --num-candidates 16 --rank-timeout-ms 20000 --relay-window-ms 10",
    )  # fmt: skip
    port = free_port()
    started = time.time() - 5
    with Fleet(config) as fleet:
        endpoints = fleet.endpoints()
        rules = tmp_path / "rules.yaml"
        rules.write_text(yaml.safe_dump({"groups": []}))
        prometheus_yml = tmp_path / "prometheus.yml"
        prometheus_yml.write_text(yaml.safe_dump(prometheus_config(endpoints, rules)))
        prometheus = [
            prometheus_binary, f"--config.file={prometheus_yml}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}", "--enable-feature=exemplar-storage",
        ]  # fmt: skip
        with running(prometheus, tmp_path / "prometheus.log"):
            api = PrometheusApi(port)
            with grpc.insecure_channel(endpoints[STUB].address) as channel:
                stub = recommend_pb2_grpc.RecommendServiceStub(channel)
                for i in range(RECOMMENDS):
                    stub.Recommend(
                        recommend_pb2.RecommendRequest(user_id=f"exemplar-{i}", top_k=4), timeout=30
                    )
            found: dict[str, list[str]] = {}
            deadline = time.monotonic() + DEADLINE_S
            while time.monotonic() < deadline:
                fleet.check()
                if api.ready():
                    found = {source: query_exemplars(api, expr, started) for source, expr in queries.items()}
                    exported = received.ids()
                    if all(ids and set(ids) <= exported for ids in found.values()):
                        break
                time.sleep(1)
    exported = received.ids()
    assert exported, "the receiver got no span"
    for source, ids in found.items():
        assert ids, f"no exemplar for {source}: {queries[source]}"
        assert all(TRACE_ID.fullmatch(trace_id) for trace_id in ids), (source, ids)
        assert set(ids) <= exported, f"{source}: exemplars of traces never exported: {set(ids) - exported}"
    assert found.keys() == queries.keys(), (tmp_path / "prometheus.log").read_text()[-2000:]
