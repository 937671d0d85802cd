"""An OTLP/gRPC trace receiver on loopback, the collector's own protocol, for tests and benchmarks.

`OtlpReceiver` serves `opentelemetry.proto.collector.trace.v1.TraceService` on a free port of 127.0.0.1 in
this process's threads and keeps every span with its resource's `service.name`; `endpoint` is what a
service's `--otlp-endpoint` takes. `ReceiverProcess` runs one in a process of its own (`serve`), so that
receiving costs neither the load generator's CPU nor its event loop, writing every span to a file as a JSON
`SpanRecord`: a span as plain data (ids as hex, times in ns since the epoch, attributes as Python values),
which `records` makes of an export request and reports and drawings read.
"""

from __future__ import annotations

import dataclasses
import json
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from concurrent import futures
from pathlib import Path
from typing import IO

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from services.launcher.procs import REPO_ROOT

HOST = "127.0.0.1"


@dataclasses.dataclass(frozen=True)
class SpanRecord:
    """One received span as plain data."""

    service: str  # the resource's service.name, e.g. relaygr-ranker
    instance: str  # the resource's service.instance.id
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str  # 16 hex digits; "" for a trace's root
    name: str
    kind: str  # server, client, internal, …
    start_ns: int
    end_ns: int
    attributes: dict[str, object]
    links: tuple[tuple[str, str], ...] = ()  # (trace_id, span_id) of each linked span

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    @classmethod
    def from_dict(cls, fields: dict) -> SpanRecord:
        return cls(
            **{**fields, "links": tuple((str(trace), str(span)) for trace, span in fields.get("links", ()))}
        )


def value_of(value: common_pb2.AnyValue) -> object:
    """An OTLP attribute value as a Python value (arrays as lists; bytes as hex)."""
    which = value.WhichOneof("value")
    if which == "array_value":
        return [value_of(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    if which == "bytes_value":
        return value.bytes_value.hex()
    return None if which is None else getattr(value, which)


def attributes_of(attributes: Iterable[common_pb2.KeyValue]) -> dict[str, object]:
    return {attribute.key: value_of(attribute.value) for attribute in attributes}


def spans_of(request: trace_service_pb2.ExportTraceServiceRequest) -> Iterator[tuple[dict, trace_pb2.Span]]:
    """Every span of an export request with its resource's attributes."""
    for resource_spans in request.resource_spans:
        resource = attributes_of(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            yield from ((resource, span) for span in scope_spans.spans)


def records(request: trace_service_pb2.ExportTraceServiceRequest) -> list[SpanRecord]:
    """An export request's spans as `SpanRecord`s."""
    return [
        SpanRecord(
            service=str(resource.get("service.name", "")),
            instance=str(resource.get("service.instance.id", "")),
            trace_id=span.trace_id.hex(), span_id=span.span_id.hex(), parent_id=span.parent_span_id.hex(),
            name=span.name, kind=trace_pb2.Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_").lower(),
            start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
            attributes=attributes_of(span.attributes),
            links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
        )
        for resource, span in spans_of(request)
    ]  # fmt: skip


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Serves OTLP/gRPC's TraceService on loopback and keeps every span with its resource's service.name;
    with `out`, it also writes each span to it as a JSON `SpanRecord` line."""

    def __init__(self, out: IO[str] | None = None) -> None:
        self._lock, self._out = threading.Lock(), out
        self._spans: list[tuple[str, trace_pb2.Span]] = []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(f"{HOST}:0")
        self.endpoint = f"http://{HOST}:{self.port}"  # what `--otlp-endpoint` takes: plaintext OTLP/gRPC

    def Export(self, request, context):  # the protocol's name
        received = [(str(resource.get("service.name", "")), span) for resource, span in spans_of(request)]
        lines = [json.dumps(dataclasses.asdict(r), separators=(",", ":")) + "\n" for r in records(request)]
        with self._lock:
            self._spans.extend(received)
            if self._out is not None:
                self._out.writelines(lines)
                self._out.flush()
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[tuple[str, trace_pb2.Span]]:
        """Every span received so far, as (service.name, span)."""
        with self._lock:
            return list(self._spans)

    def trace(self, trace_id: bytes) -> list[tuple[str, trace_pb2.Span]]:
        """The spans received so far of one trace."""
        return [(service, span) for service, span in self.spans() if span.trace_id == trace_id]

    def __enter__(self) -> OtlpReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.stop(1.0).wait()


def serve(path: str) -> None:
    """A `ReceiverProcess`'s body: receives spans, writing each to `path`, until SIGTERM or SIGINT; prints
    `listening on PORT` once serving."""
    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    with open(path, "w") as out, OtlpReceiver(out) as receiver:
        print(f"listening on {receiver.port}", flush=True)
        stopped.wait()


class ReceiverProcess:
    """An `OtlpReceiver` in a child process (`serve`) writing to `path`. Use as a context manager;
    `records()` reads what it received (complete once it has stopped)."""

    def __init__(self, path: Path, startup_timeout_s: float = 60.0) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        code = f"from bench.tracing.otlp import serve; serve({str(path)!r})"
        self._popen = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT
        )
        ready = select.select([self._popen.stdout], [], [], startup_timeout_s)[0]
        said = self._popen.stdout.readline() if ready else ""  # type: ignore[union-attr]
        if not said.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"the OTLP receiver did not start (said {said!r})")
        self.port = int(said.split()[-1])
        self.endpoint, self.pid = f"http://{HOST}:{self.port}", self._popen.pid

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._popen.poll() is None:
            self._popen.send_signal(signal.SIGTERM)  # it stops serving and closes its file
            try:
                self._popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._popen.kill()
                self._popen.wait()
        self._popen.stdout.close()  # type: ignore[union-attr]

    def records(self) -> list[SpanRecord]:
        """The spans it wrote (none if it wrote nothing)."""
        if not self.path.exists():
            return []
        with self.path.open() as lines:
            return [SpanRecord.from_dict(json.loads(line)) for line in lines if line.strip()]

    def __enter__(self) -> ReceiverProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
