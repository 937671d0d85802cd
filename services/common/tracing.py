"""Distributed traces of the relay race: OpenTelemetry, exported over OTLP/gRPC, off by default.

Contract:
- `setup(config, service)` runs once per process, before the app is built. With `--otlp-endpoint` empty it
  installs nothing and loads no SDK: servers register no tracing wrapper, calls carry no trace context, and
  what remains per request is a few `sampled()` checks that read a context variable (about 3 µs a Rank).
- With an endpoint, spans go to the collector in batches (`BatchSpanProcessor`, OTLP/gRPC; `http://` is
  plaintext, `https://` TLS), named by the resource's `service.name` (`relaygr-<service>`) and
  `service.instance.id`. `shutdown()` flushes what is still batched when the process stops.
- Sampling is decided once per Recommend, where its trace starts (the retrieval stub): `--trace-sample-ratio`
  of the trace ids. Every other service follows its caller's decision, carried in the W3C `traceparent`
  metadata of every call a traced server makes: a sampled request gets a server span in each service and a
  client span for each call, an unsampled one gets no span anywhere (its context still travels, flagged
  unsampled, so that no service downstream starts a trace of its own). A call without `traceparent` (from
  a client that does not trace) starts a trace, sampled at the ratio. Health checks, reflection and
  GetProfile polls are never traced.
- Written here by hand rather than with OpenTelemetry's gRPC instrumentation: its interceptors open a
  (non-recording) span, wrap the servicer context and inject metadata on every call, sampled or not, which
  cost about 0.2 ms of CPU per call here and 16 % of the fleet's CPU per request at ratio 0.01
  (`python -m bench tracing`); unsampled calls here cost one `traceparent` header. Spans keep the
  instrumentation's names (`/package.Service/Method`), kinds and `rpc.*` attributes.
- Attributes never carry a raw user id: `user_hash` is a short blake2b digest of it.
- `exemplar()` is the current trace id as an OpenMetrics exemplar label set, for a latency histogram's
  `observe`: a P99 panel links to the slow request's trace. None when the request is not sampled.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from services.common.config import ServiceConfig

log = logging.getLogger(__name__)

TRACER_NAME = "relaygr"
# The OpenMetrics exemplar label that carries the trace id (what Grafana's exemplar link reads).
EXEMPLAR_LABEL = "trace_id"
# Calls that are never traced: probes and polls, not requests.
UNTRACED_METHODS = ("GetProfile",)
UNTRACED_SERVICE_PREFIX = "grpc."  # health, reflection
TRACEPARENT = "traceparent"
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")

_provider = None  # the SDK's TracerProvider once `setup` installed one
tracer = trace.get_tracer(TRACER_NAME)


def enabled() -> bool:
    """Whether this process exports traces (`setup` was given an endpoint)."""
    return _provider is not None


def setup(config: ServiceConfig, service: str, instance: str = "") -> None:
    """Installs the tracer provider for `service` when `config.otlp_endpoint` is set; no-op otherwise."""
    global _provider
    if not config.otlp_endpoint or _provider is not None:
        return
    # Imported here: a process with tracing off never loads the SDK or the exporter.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    resource = Resource.create(
        {
            "service.name": f"relaygr-{service.replace('_', '-')}",
            "service.namespace": "relaygr",
            "service.instance.id": instance or f"{socket.gethostname()}-{os.getpid()}",
        }
    )
    provider = TracerProvider(
        resource=resource, sampler=ParentBased(root=TraceIdRatioBased(config.trace_sample_ratio))
    )
    insecure = config.otlp_endpoint.startswith("http://")
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(config.otlp_endpoint, insecure=insecure)))
    trace.set_tracer_provider(provider)
    _provider = provider
    log.info(
        "tracing to %s, %.4g of Recommends sampled", config.otlp_endpoint, config.trace_sample_ratio
    )  # fmt: skip


def shutdown() -> None:
    """Exports the spans still batched and stops the exporter (at process exit)."""
    if _provider is not None:
        _provider.shutdown()


def traced(service: str, method: str) -> bool:
    """Whether calls of `service`/`method` get spans: tracing is on, and they are requests, not probes."""
    return enabled() and not service.startswith(UNTRACED_SERVICE_PREFIX) and method not in UNTRACED_METHODS


class ServerSpan:
    """A served call's place in its trace, from its `traceparent`: a SERVER span, current while the handler
    runs, when the trace is sampled (or starts here and the sampler says so); otherwise only the caller's
    unsampled context, so that the calls the handler makes carry it on. `end(code)` closes it with the
    call's gRPC status."""

    __slots__ = ("_span", "_token")

    def __init__(self, full_method: str, metadata: Sequence[tuple[str, str | bytes]] | None) -> None:
        parent = _remote_parent(metadata)
        self._span: Span | None = None
        if parent is not None and not parent.trace_flags.sampled:
            context = trace.set_span_in_context(NonRecordingSpan(parent))
        else:
            parent_context = None if parent is None else trace.set_span_in_context(NonRecordingSpan(parent))
            service, _, method = full_method.lstrip("/").partition("/")
            self._span = tracer.start_span(
                full_method,
                context=parent_context,
                kind=SpanKind.SERVER,
                attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": method},
            )
            context = trace.set_span_in_context(self._span)
        self._token = otel_context.attach(context)

    def end(self, code: grpc.StatusCode) -> None:
        otel_context.detach(self._token)
        if self._span is not None:
            _set_status(self._span, code)
            self._span.end()


@contextmanager
def client_call(full_method: str) -> Iterator[tuple[tuple[str, str], ...] | None]:
    """The metadata an outgoing call carries: in a sampled trace, a CLIENT span named `full_method` around
    the call and its context as `traceparent`; in an unsampled one the current context, flagged so; None
    when nothing is traced (tracing off, or no trace context here)."""
    current = trace.get_current_span().get_span_context()
    if not current.is_valid:
        yield None
        return
    if not current.trace_flags.sampled:
        yield ((TRACEPARENT, _traceparent(current)),)
        return
    service, _, method = full_method.lstrip("/").partition("/")
    attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
    span = tracer.start_span(full_method, kind=SpanKind.CLIENT, attributes=attributes)
    try:
        yield ((TRACEPARENT, _traceparent(span.get_span_context())),)
    except grpc.aio.AioRpcError as exc:
        _set_status(span, exc.code())
        raise
    except BaseException as exc:
        _set_status(span, grpc.StatusCode.CANCELLED if isinstance(exc, asyncio.CancelledError) else None)
        raise
    else:
        _set_status(span, grpc.StatusCode.OK)
    finally:
        span.end()


def _traceparent(context: SpanContext) -> str:
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _remote_parent(metadata: Sequence[tuple[str, str | bytes]] | None) -> SpanContext | None:
    """The caller's span context from a W3C `traceparent` (version 00); None when absent or malformed."""
    for key, value in metadata or ():
        if key != TRACEPARENT:
            continue
        match = _TRACEPARENT.fullmatch(value if isinstance(value, str) else value.decode("ascii", "replace"))
        if match is None:
            return None
        trace_id, span_id, flags = int(match[1], 16), int(match[2], 16), int(match[3], 16)
        if not trace_id or not span_id:
            return None
        return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags & 1))
    return None


def _set_status(span: Span, code: grpc.StatusCode | None) -> None:
    """The call's outcome on its span: `rpc.grpc.status_code`, and ERROR status unless OK."""
    if code is None:
        span.set_status(Status(StatusCode.ERROR))
        return
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code is not grpc.StatusCode.OK:
        span.set_status(Status(StatusCode.ERROR, code.name))


def user_hash(user_id: str) -> str:
    """What a span says of a user: 16 hex digits of a blake2b digest, never the id itself."""
    return hashlib.blake2b(user_id.encode(), digest_size=8, person=b"relaygr-user").hexdigest()


def current() -> Span:
    """The span of the call being served (a non-recording one when tracing is off or not sampled)."""
    return trace.get_current_span()


def sampled() -> bool:
    """Whether the current request is traced: its span context is sampled. (Not `is_recording()`: a task a
    call started, such as a production, outlives the call's span and still belongs to its trace.)"""
    context = trace.get_current_span().get_span_context()
    return context.is_valid and context.trace_flags.sampled


def current_context() -> SpanContext | None:
    """The current span's context when it is sampled: what a later span links to."""
    context = trace.get_current_span().get_span_context()
    return context if context.is_valid and context.trace_flags.sampled else None


def exemplar() -> dict[str, str] | None:
    """The current trace id as exemplar labels for a histogram's `observe`; None when not sampled."""
    context = trace.get_current_span().get_span_context()
    if not (context.is_valid and context.trace_flags.sampled):
        return None
    return {EXEMPLAR_LABEL: format(context.trace_id, "032x")}


@contextmanager
def span(name: str, links: Sequence[SpanContext | None] = (), **attributes: object) -> Iterator[Span]:
    """A child span of the current one, current inside the block; no-op when the request is not sampled.
    `links` name spans of the same story elsewhere (a Rank links to the PreInfer that made its prefix)."""
    if not sampled():
        yield trace.INVALID_SPAN
        return
    linked = [Link(context) for context in links if context is not None]
    with tracer.start_as_current_span(name, links=linked, attributes=_clean(attributes)) as opened:
        yield opened


def record(name: str, start_ns: int, end_ns: int, **attributes: object) -> None:
    """A finished child span of the current one, from times measured elsewhere (`time.time_ns()`): what
    the device thread did for this request, told after the fact. No-op when not sampled."""
    if not sampled() or end_ns <= 0:
        return
    opened = tracer.start_span(
        name, start_time=start_ns, kind=SpanKind.INTERNAL, attributes=_clean(attributes)
    )
    opened.end(end_time=max(end_ns, start_ns))


def _clean(attributes: dict[str, object]) -> dict[str, object]:
    """Attributes under the `relaygr.` namespace, without the unset ones (None)."""
    return {f"relaygr.{key}": value for key, value in attributes.items() if value is not None}
