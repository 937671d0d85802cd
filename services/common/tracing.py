"""Distributed traces of the relay race: OpenTelemetry, exported over OTLP/gRPC, off by default.

Contract:
- `setup(config, service)` runs once per process, before the app is built. With `--otlp-endpoint` empty it
  installs nothing: every span below is OpenTelemetry's no-op, and servers and channels get no
  interceptor, so tracing off costs a handful of attribute reads per request (`sampled()` is False).
- With an endpoint, spans go to the collector in batches (`BatchSpanProcessor`, OTLP/gRPC; `http://` is
  plaintext, `https://` TLS), named by the resource's `service.name` (`relaygr-<service>`) and
  `service.instance.id`. `shutdown()` flushes what is still batched when the process stops.
- Sampling is decided once per Recommend, at the retrieval stub, where the trace starts:
  `--trace-sample-ratio` of the trace ids; every other service follows its caller's decision (parent-based),
  so a trace is whole or absent. Health checks, reflection and the trigger's GetProfile polls are never
  traced.
- W3C trace context travels in gRPC metadata (`traceparent`): OpenTelemetry's gRPC instrumentation
  starts a server span per call (`server_interceptors`) and a client span per call, injecting the context
  (`client_interceptors`, on every channel `dial` makes). The router forwards bytes, so its forward is a
  client span of its own under the caller's server span.
- Attributes never carry a raw user id: `user_hash` is a short blake2b digest of it.
- `exemplar()` is the current trace id as an OpenMetrics exemplar label set, for a latency histogram's
  `observe`: a P99 panel links to the slow request's trace. None when the request is not sampled.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import grpc
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanContext, SpanKind

from services.common.config import ServiceConfig

log = logging.getLogger(__name__)

TRACER_NAME = "relaygr"
# The OpenMetrics exemplar label that carries the trace id (what Grafana's exemplar link reads).
EXEMPLAR_LABEL = "trace_id"
# Calls that are never traced: probes and polls, not requests.
UNTRACED_METHODS = ("GetProfile",)

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


def _traced_calls():
    from opentelemetry.instrumentation.grpc import filters

    untraced = [filters.health_check(), filters.service_prefix("grpc.reflection")]
    untraced += [filters.method_name(method) for method in UNTRACED_METHODS]
    return filters.negate(filters.any_of(*untraced))


def server_interceptors() -> Sequence[grpc.aio.ServerInterceptor]:
    """OpenTelemetry's aio server interceptor when tracing is on: a server span per traced call, its
    parent read from the caller's `traceparent`. Empty when off."""
    if not enabled():
        return ()
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    return (aio_server_interceptor(filter_=_traced_calls()),)


def client_interceptors() -> Sequence[grpc.aio.ClientInterceptor]:
    """OpenTelemetry's aio client interceptors when tracing is on (a client span per call, the context
    injected into its metadata). Empty when off."""
    if not enabled():
        return ()
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    return tuple(aio_client_interceptors(filter_=_traced_calls()))


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
