"""The server interceptor every service runs: standard gRPC server metrics with true status codes,
domain errors mapped to their status codes, and, with tracing on, each request's place in its trace
(`tracing.ServerSpan`: a server span when sampled).

It intercepts at registration rather than per call: `Interceptor` stands in for the server while a service
registers its handlers, and wraps each handler once, unary or streaming, with the metric series of its
method bound then. A `grpc.aio.ServerInterceptor` would instead run a coroutine per call to find the
handler, wrap it anew and look every label up again, about 30 µs of CPU a call.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import grpc
from google.protobuf.message import DecodeError

from services.common import tracing
from services.common.errors import InvalidArgument, RequestError
from services.common.metrics import GRPC_HANDLED, GRPC_HANDLING_SECONDS, GRPC_STARTED, Children

log = logging.getLogger(__name__)


def _split_method(full_method: str) -> tuple[str, str]:
    service, _, method = full_method.lstrip("/").partition("/")
    return service, method


class Interceptor:
    """Registers handlers on `server`, each wrapped by `instrument`; what a service's `register`
    is given in place of the server (it takes the two registration calls that generated code makes)."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_InstrumentedGeneric(handler) for handler in handlers))

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        instrumented = {method: instrument(handler, service, method) for method, handler in handlers.items()}
        self._server.add_registered_method_handlers(service, instrumented)


class _InstrumentedGeneric(grpc.GenericRpcHandler):
    """A generic handler whose handlers come instrumented, each wrapped once (per method)."""

    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self._inner = inner
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        full_method = handler_call_details.method
        known = self._wrapped.get(full_method)
        if known is None or known[0] is not handler:  # a generic handler may answer anew each call
            known = self._wrapped[full_method] = (handler, instrument(handler, *_split_method(full_method)))
        return known[1]


# The `grpc_type` label of each kind of handler (go-grpc-prometheus's names), with its handler's attribute.
KINDS = (
    ("unary", "unary_unary"),
    ("server_stream", "unary_stream"),
    ("client_stream", "stream_unary"),
    ("bidi_stream", "stream_stream"),
)
_MAKE = {
    "unary": grpc.unary_unary_rpc_method_handler,
    "server_stream": grpc.unary_stream_rpc_method_handler,
    "client_stream": grpc.stream_unary_rpc_method_handler,
    "bidi_stream": grpc.stream_stream_rpc_method_handler,
}


def instrument(handler: grpc.RpcMethodHandler, service: str, method: str) -> grpc.RpcMethodHandler:
    """`handler` recording the standard gRPC server metrics with true status codes, and mapping errors.

    `RequestError`s become their status code; errors from a downstream call (`AioRpcError`) keep their
    code, so a proxy never turns UNAVAILABLE into UNKNOWN. Requests are parsed here rather than by gRPC,
    whose own parse failure would answer UNKNOWN: bytes that are no valid request are INVALID_ARGUMENT.
    Cancellation is reported as CANCELLED, or DEADLINE_EXCEEDED when the deadline has passed. Streaming
    handlers get the same (`grpc_type` server_stream, client_stream or bidi_stream): a call is counted once,
    when its stream ends, with the time from its start; each streamed request is parsed as it is read. A
    handler of no kind this knows (a synchronous one) is returned as it is.
    """
    kind, behavior = next(((k, getattr(handler, a)) for k, a in KINDS if getattr(handler, a)), (None, None))
    streams_responses = kind in ("server_stream", "bidi_stream")
    if kind is None or not (
        inspect.iscoroutinefunction(behavior) or (streams_responses and inspect.isasyncgenfunction(behavior))
    ):
        return handler
    parse = handler.request_deserializer
    series = _Series(kind, service, method)

    if kind == "unary":  # the serving path's calls: no more per call than the bookkeeping itself
        started_total, seconds, handled = series.started, series.seconds, series.handled
        traced, full_method = series.traced, series.full_method

        async def unary(request, context: grpc.aio.ServicerContext):
            started_total.inc()
            started = time.perf_counter()
            code, details = grpc.StatusCode.OK, None
            span = tracing.ServerSpan(full_method, context.invocation_metadata()) if traced else None
            try:
                if parse is not None:
                    request = _parse(parse, request)
                return await behavior(request, context)
            except BaseException as exc:
                code, details = series.outcome(exc, context)
                if details is None:
                    raise
            finally:
                if code == grpc.StatusCode.OK:
                    set_code = context.code()
                    if set_code not in (None, grpc.StatusCode.OK):
                        code = set_code
                handled("unary", service, method, code.name).inc()
                # A sampled call's trace id rides along as an exemplar: the P99 panel links to its trace.
                seconds.observe(time.perf_counter() - started, tracing.exemplar())
                if span is not None:
                    span.end(code)
            # An error is answered only once it is counted and its span ended, so a client that has the
            # status finds both; a handler's own abort, a cancellation or a deadline are counted just after.
            await context.abort(code, details)

        return grpc.unary_unary_rpc_method_handler(
            unary, request_deserializer=None, response_serializer=handler.response_serializer
        )

    def requests(request):
        if parse is None:
            return request
        return _parse(parse, request) if kind == "server_stream" else _parsed(parse, request)

    if inspect.isasyncgenfunction(behavior):  # its responses are yielded

        async def instrumented(request, context: grpc.aio.ServicerContext):
            async with _Observed(series, context):
                async for response in behavior(requests(request), context):
                    yield response

    else:  # its response is returned (or, for a stream, written with `context.write`)

        async def instrumented(request, context: grpc.aio.ServicerContext):
            async with _Observed(series, context):
                return await behavior(requests(request), context)

    return _MAKE[kind](
        instrumented, request_deserializer=None, response_serializer=handler.response_serializer
    )


class _Series:
    """One method's metric series and tracing decision, bound once, when its handler is wrapped; and the
    bookkeeping of each of its calls."""

    def __init__(self, kind: str, service: str, method: str) -> None:
        self.kind, self.service, self.method = kind, service, method
        self.full_method = f"/{service}/{method}"
        self.traced = tracing.traced(service, method)  # decided once: tracing off adds nothing per call
        self.started = GRPC_STARTED.labels(kind, service, method)
        self.seconds = GRPC_HANDLING_SECONDS.labels(kind, service, method)
        self.handled = Children(GRPC_HANDLED)

    def start(self, context: grpc.aio.ServicerContext) -> tuple[float, tracing.ServerSpan | None]:
        """Counts a call as started; when it began, and its span (when traced)."""
        self.started.inc()
        span = tracing.ServerSpan(self.full_method, context.invocation_metadata()) if self.traced else None
        return time.perf_counter(), span

    def outcome(
        self, exc: BaseException, context: grpc.aio.ServicerContext
    ) -> tuple[grpc.StatusCode, str | None]:
        """The status code a call that raised `exc` ends with, and the details to answer it with (None:
        `exc` goes on as it is: a handler's own abort, a cancellation)."""
        if isinstance(exc, RequestError):
            return exc.code, exc.message
        if isinstance(exc, grpc.aio.AioRpcError):
            return exc.code(), exc.details() or exc.code().name
        if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
            remaining = context.time_remaining()
            expired = remaining is not None and remaining <= 0
            return (grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED), None
        if isinstance(exc, grpc.aio.AbortError):
            return context.code() or grpc.StatusCode.UNKNOWN, None
        if isinstance(exc, Exception):
            log.error("unhandled error in %s/%s", self.service, self.method, exc_info=exc)
            return grpc.StatusCode.INTERNAL, "internal error"
        return grpc.StatusCode.UNKNOWN, None

    def end(
        self,
        context: grpc.aio.ServicerContext,
        code: grpc.StatusCode,
        began: float,
        span: tracing.ServerSpan | None,
    ) -> None:
        """Counts a call as handled with its true code, observes its time, and ends its span."""
        if code == grpc.StatusCode.OK:
            set_code = context.code()
            if set_code not in (None, grpc.StatusCode.OK):
                code = set_code
        self.handled(self.kind, self.service, self.method, code.name).inc()
        # A sampled call's trace id rides along as an exemplar: the P99 panel links to its trace.
        self.seconds.observe(time.perf_counter() - began, tracing.exemplar())
        if span is not None:
            span.end(code)


class _Observed:
    """A streaming call's bookkeeping around its handler (`_Series`): an error is answered only once it is
    counted and its span ended."""

    def __init__(self, series: _Series, context: grpc.aio.ServicerContext) -> None:
        self.series = series
        self.context = context

    async def __aenter__(self) -> None:
        self.began, self.span = self.series.start(self.context)

    async def __aexit__(self, kind, exc, traceback) -> bool:
        code, details = grpc.StatusCode.OK, None
        if exc is not None:
            code, details = self.series.outcome(exc, self.context)
        self.series.end(self.context, code, self.began, self.span)
        if details is not None:
            await self.context.abort(code, details)
        return False


async def _parsed(deserialize: Callable[[bytes], object], raw_requests):
    """A stream's requests, each parsed as it is read."""
    async for raw in raw_requests:
        yield _parse(deserialize, raw)


def _parse(deserialize: Callable[[bytes], object], raw: bytes):
    try:
        return deserialize(raw)
    except DecodeError as exc:
        raise InvalidArgument("request", f"is not a valid protobuf message ({exc})") from exc
