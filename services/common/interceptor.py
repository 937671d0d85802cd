"""The server interceptor every service runs: standard gRPC server metrics with true status codes, and
domain errors mapped to their status codes."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from google.protobuf.message import DecodeError

from services.common.errors import InvalidArgument, RequestError
from services.common.metrics import GRPC_HANDLED, GRPC_HANDLING_SECONDS, GRPC_STARTED

log = logging.getLogger(__name__)


def _split_method(full_method: str) -> tuple[str, str]:
    service, _, method = full_method.lstrip("/").partition("/")
    return service, method


class ServerInterceptor(grpc.aio.ServerInterceptor):
    """Records the standard gRPC server metrics with true status codes, and maps domain errors.

    `RequestError`s become their status code; errors from a downstream call (`AioRpcError`) keep their
    code, so a proxy never turns UNAVAILABLE into UNKNOWN. Requests are parsed here rather than by gRPC,
    whose own parse failure would answer UNKNOWN: bytes that are no valid request are INVALID_ARGUMENT.
    Cancellation is reported as CANCELLED, or DEADLINE_EXCEEDED when the deadline has passed.
    """

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler  # streaming RPCs (health Watch, reflection) are not instrumented
        service, method = _split_method(handler_call_details.method)
        behavior = handler.unary_unary
        parse = handler.request_deserializer

        async def instrumented(request, context: grpc.aio.ServicerContext):
            GRPC_STARTED.labels("unary", service, method).inc()
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                if parse is not None:
                    request = _parse(parse, request)
                return await behavior(request, context)
            except RequestError as exc:
                code = exc.code
                await context.abort(exc.code, exc.message)
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                await context.abort(code, exc.details() or code.name)
            except asyncio.CancelledError:
                remaining = context.time_remaining()
                expired = remaining is not None and remaining <= 0
                code = grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED
                raise
            except grpc.aio.AbortError:
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            except Exception:
                log.exception("unhandled error in %s/%s", service, method)
                code = grpc.StatusCode.INTERNAL
                await context.abort(code, "internal error")
            finally:
                set_code = context.code()
                if code == grpc.StatusCode.OK and set_code not in (None, grpc.StatusCode.OK):
                    code = set_code
                GRPC_HANDLED.labels("unary", service, method, code.name).inc()
                GRPC_HANDLING_SECONDS.labels("unary", service, method).observe(time.perf_counter() - started)

        return grpc.unary_unary_rpc_method_handler(
            instrumented,
            request_deserializer=None,
            response_serializer=handler.response_serializer,
        )


def _parse(deserialize, raw: bytes):
    try:
        return deserialize(raw)
    except DecodeError as exc:
        raise InvalidArgument("request", f"is not a valid protobuf message ({exc})") from exc
