"""An OTLP/gRPC trace receiver on loopback: the collector's own protocol, for tests and benchmarks.

`OtlpReceiver` serves `opentelemetry.proto.collector.trace.v1.TraceService` on 127.0.0.1 (a free port
unless told one) in this process's threads and keeps every span it is sent with the `service.name` and
`service.instance.id` of its resource. Use it as a context manager; `endpoint` is what a service's
`--otlp-endpoint` (or `RELAYGR_OTLP_ENDPOINT`) takes.

`python -m bench tracing.otlp --spans-file FILE` runs one in a process of its own, so that receiving spans
costs neither the load generator's CPU nor its event loop; it prints `listening on PORT` once serving, writes
every span it receives to FILE as one JSON `SpanRecord` a line, and stops on SIGTERM or SIGINT.
`ReceiverProcess` starts and stops that process and reads the file back (`bench.tracing` uses it).

`SpanRecord` is a span as plain data (ids as hex, times in ns since the epoch, attributes as Python
values), which is what reports and drawings read; `records` converts an export request into them.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from pathlib import Path
from typing import IO

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from services.common.config import load, setting

HOST = "127.0.0.1"
# OTLP's span kinds by their proto number, as the lower-case words a report prints.
KINDS = {
    trace_pb2.Span.SPAN_KIND_UNSPECIFIED: "unspecified",
    trace_pb2.Span.SPAN_KIND_INTERNAL: "internal",
    trace_pb2.Span.SPAN_KIND_SERVER: "server",
    trace_pb2.Span.SPAN_KIND_CLIENT: "client",
    trace_pb2.Span.SPAN_KIND_PRODUCER: "producer",
    trace_pb2.Span.SPAN_KIND_CONSUMER: "consumer",
}


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

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, fields: dict[str, object]) -> SpanRecord:
        links = tuple((str(trace), str(span)) for trace, span in fields.get("links", ()))  # type: ignore[union-attr]
        return cls(**{**fields, "links": links})  # type: ignore[arg-type]


def value_of(value: common_pb2.AnyValue) -> object:
    """An OTLP attribute value as a Python value (arrays as lists; bytes as hex)."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [value_of(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return {item.key: value_of(item.value) for item in value.kvlist_value.values}
    if which == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, which)


def attributes_of(attributes: Iterable[common_pb2.KeyValue]) -> dict[str, object]:
    return {attribute.key: value_of(attribute.value) for attribute in attributes}


def record_of(service: str, instance: str, span: trace_pb2.Span) -> SpanRecord:
    return SpanRecord(
        service=service,
        instance=instance,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex(),
        name=span.name,
        kind=KINDS.get(span.kind, "unspecified"),
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        attributes=attributes_of(span.attributes),
        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
    )


def spans_of(
    request: trace_service_pb2.ExportTraceServiceRequest,
) -> list[tuple[dict[str, object], trace_pb2.Span]]:
    """Every span of an export request with its resource's attributes."""
    found = []
    for resource_spans in request.resource_spans:
        resource = attributes_of(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            found.extend((resource, span) for span in scope_spans.spans)
    return found


def records(request: trace_service_pb2.ExportTraceServiceRequest) -> list[SpanRecord]:
    """An export request's spans as `SpanRecord`s."""
    return [
        record_of(str(resource.get("service.name", "")), str(resource.get("service.instance.id", "")), span)
        for resource, span in spans_of(request)
    ]


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Serves OTLP/gRPC's TraceService on loopback and keeps every span with its resource's service.name.

    `on_export` (optional) is called with each export request's records, on a server thread."""

    def __init__(self, port: int = 0, on_export: Callable[[list[SpanRecord]], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._spans: list[tuple[str, trace_pb2.Span]] = []
        self._on_export = on_export
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(f"{HOST}:{port}")

    @property
    def endpoint(self) -> str:
        """What `--otlp-endpoint` takes: plaintext OTLP/gRPC on loopback."""
        return f"http://{HOST}:{self.port}"

    def Export(self, request, context):  # the protocol's name
        received = spans_of(request)
        with self._lock:
            self._spans.extend((str(resource.get("service.name", "")), span) for resource, span in received)
        if self._on_export is not None:
            self._on_export(records(request))
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[tuple[str, trace_pb2.Span]]:
        """Every span received so far, as (service.name, span)."""
        with self._lock:
            return list(self._spans)

    def trace(self, trace_id: bytes) -> list[tuple[str, trace_pb2.Span]]:
        """The spans received so far of one trace."""
        return [(service, span) for service, span in self.spans() if span.trace_id == trace_id]

    def start(self) -> OtlpReceiver:
        self._server.start()
        return self

    def stop(self, grace_s: float | None = 1.0) -> None:
        self._server.stop(grace_s).wait()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def read_records(path: Path) -> list[SpanRecord]:
    """The spans a `python -m bench tracing.otlp` process wrote to `path` (none if it wrote nothing)."""
    if not path.exists():
        return []
    with path.open() as lines:
        return [SpanRecord.from_dict(json.loads(line)) for line in lines if line.strip()]


class ReceiverProcess:
    """`python -m bench tracing.otlp` as a child process writing to `path`. Use as a context manager;
    `records()` reads what it received (complete once it has stopped)."""

    def __init__(self, path: Path, startup_timeout_s: float = 60.0) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        self._popen = subprocess.Popen(
            [sys.executable, "-m", "bench.tracing.otlp", "--spans-file", str(path)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        self.port = self._read_port(startup_timeout_s)

    def _read_port(self, timeout_s: float) -> int:
        found: list[str] = []
        reader = threading.Thread(target=lambda: found.append(self._popen.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout_s)
        line = found[0] if found else ""
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"the OTLP receiver did not start (said {line!r})")
        return int(line.split()[-1])

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self._popen.pid

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._popen.poll() is None:
            self._popen.send_signal(signal.SIGTERM)
            try:
                self._popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._popen.kill()
                self._popen.wait()
        if self._popen.stdout is not None:
            self._popen.stdout.close()

    def records(self) -> list[SpanRecord]:
        return read_records(self.path)

    def __enter__(self) -> ReceiverProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def serve(out: IO[str], port: int = 0) -> None:
    """Receives spans until SIGTERM or SIGINT, writing each to `out` as a JSON line."""
    lock = threading.Lock()

    def write(received: list[SpanRecord]) -> None:
        with lock:
            out.writelines(record.to_json() + "\n" for record in received)
            out.flush()

    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    with OtlpReceiver(port, on_export=write) as receiver:
        print(f"listening on {receiver.port}", flush=True)
        stopped.wait()


@dataclasses.dataclass(frozen=True)
class ReceiverConfig:
    spans_file: str = setting("", "file the spans are written to, one JSON line each (replaced; required)")
    receiver_port: int = setting(0, "port to serve on (0: a free one)", minimum=0)

    def validate(self) -> None:
        if not self.spans_file:
            raise ValueError("--spans-file is required")


def main(argv: Sequence[str] | None = None) -> None:
    config = load(
        ReceiverConfig,
        argv,
        prog="python -m bench tracing.otlp",
        description="An OTLP/gRPC trace receiver on 127.0.0.1 writing every span it receives as a JSON line.",
    )
    with open(config.spans_file, "w") as out:
        serve(out, config.receiver_port)


if __name__ == "__main__":
    main()
