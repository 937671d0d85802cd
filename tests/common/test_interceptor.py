"""The shared interceptor records true status codes: OK, domain errors, aborts, deadlines, cancellation."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2
from prometheus_client import REGISTRY

from services.common.config import ServiceConfig
from services.common.errors import InvalidArgument
from services.common.server import GrpcServer
from tests.support.polling import eventually_equal

SERVICE = "test.Echo"


def handled(method: str, code: str) -> float:
    labels = {"grpc_type": "unary", "grpc_service": SERVICE, "grpc_method": method, "grpc_code": code}
    return REGISTRY.get_sample_value("grpc_server_handled_total", labels) or 0.0


async def ok(request, context):
    return request


async def invalid(request, context):
    raise InvalidArgument("user_id", "is required")


async def abort(request, context):
    await context.abort(grpc.StatusCode.PERMISSION_DENIED, "no")


async def slow(request, context):
    await asyncio.sleep(5)
    return request


async def downstream(request, context):
    raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "member down")


HANDLERS = {"Ok": ok, "Invalid": invalid, "Abort": abort, "Slow": slow, "Downstream": downstream}


def register(server: grpc.aio.Server) -> None:
    methods = {name: grpc.unary_unary_rpc_method_handler(fn) for name, fn in HANDLERS.items()}
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, methods)])


@pytest.mark.parametrize(
    ("method", "timeout", "client_code", "recorded"),
    [
        ("Ok", None, grpc.StatusCode.OK, "OK"),
        ("Invalid", None, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
        ("Abort", None, grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED"),
        ("Slow", 0.2, grpc.StatusCode.DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED"),
        ("Downstream", None, grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE"),
    ],
)
def test_codes_are_recorded_as_the_client_sees_them(method, timeout, client_code, recorded):
    async def scenario():
        server = GrpcServer(ServiceConfig(port=0, metrics_port=-1), SERVICE, register)
        await server.start()
        before = handled(method, recorded)
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                call = channel.unary_unary(f"/{SERVICE}/{method}")
                try:
                    await call(b"ping", timeout=timeout)
                    code = grpc.StatusCode.OK
                except grpc.aio.AioRpcError as exc:
                    code = exc.code()
            assert code == client_code
            # the server side may finish just after the client gives up
            await eventually_equal(lambda: handled(method, recorded), before + 1, what=recorded)
        finally:
            await server.server.stop(None)

    asyncio.run(scenario())


def test_cancellation_is_recorded_as_cancelled():
    async def scenario():
        server = GrpcServer(ServiceConfig(port=0, metrics_port=-1), SERVICE, register)
        await server.start()
        before = handled("Slow", "CANCELLED")
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                call = channel.unary_unary(f"/{SERVICE}/Slow")(b"ping", timeout=10)
                await asyncio.sleep(0.2)
                call.cancel()
                await eventually_equal(lambda: handled("Slow", "CANCELLED"), before + 1, what="CANCELLED")
        finally:
            await server.server.stop(None)

    asyncio.run(scenario())


def test_handlers_registered_by_generated_code_are_instrumented():
    """Generated code registers each method twice (generic and pre-registered, which gRPC prefers): both
    are wrapped, so health Check counts, and bytes that are no request are INVALID_ARGUMENT."""

    async def scenario():
        server = GrpcServer(ServiceConfig(port=0, metrics_port=-1), SERVICE, register)
        await server.start()
        await server.set_serving()
        labels = {"grpc_type": "unary", "grpc_service": "grpc.health.v1.Health", "grpc_method": "Check"}

        def count(code: str) -> float:
            sample = REGISTRY.get_sample_value("grpc_server_handled_total", {**labels, "grpc_code": code})
            return sample or 0.0

        ok, invalid = count("OK"), count("INVALID_ARGUMENT")
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                check = channel.unary_unary("/grpc.health.v1.Health/Check")
                assert await check(b"") == b"\x08\x01"  # status: SERVING
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await check(b"\xff")
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error.value.details().startswith("request: is not a valid protobuf message")
            counts = lambda: (count("OK"), count("INVALID_ARGUMENT"))  # noqa: E731
            await eventually_equal(counts, (ok + 1, invalid + 1), what="(OK, INVALID_ARGUMENT)")
        finally:
            await server.server.stop(None)

    asyncio.run(scenario())


STREAMS = "test.Streams"


async def count_up(request, context):
    for i in range(3):
        yield bytes([i])


async def fail_midway(request, context):
    yield b"\x00"
    raise InvalidArgument("user_id", "is required")


async def names(requests, context):
    return ",".join([request.service async for request in requests]).encode()


def register_streams(server: grpc.aio.Server) -> None:
    methods = {
        "CountUp": grpc.unary_stream_rpc_method_handler(count_up),
        "FailMidway": grpc.unary_stream_rpc_method_handler(fail_midway),
        "Names": grpc.stream_unary_rpc_method_handler(
            names, request_deserializer=health_pb2.HealthCheckRequest.FromString
        ),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(STREAMS, methods)])


def test_streaming_calls_are_instrumented_like_unary_ones():
    """A server stream and a client stream are counted under their kind with their true codes, an error
    raised mid-stream is its status, and each streamed request that does not parse is INVALID_ARGUMENT."""

    def count(kind: str, method: str, code: str) -> float:
        labels = {"grpc_type": kind, "grpc_service": STREAMS, "grpc_method": method, "grpc_code": code}
        return REGISTRY.get_sample_value("grpc_server_handled_total", labels) or 0.0

    calls = [
        ("server_stream", "CountUp", "OK"),
        ("server_stream", "FailMidway", "INVALID_ARGUMENT"),
        ("client_stream", "Names", "OK"),
        ("client_stream", "Names", "INVALID_ARGUMENT"),
    ]

    async def scenario():
        server = GrpcServer(ServiceConfig(port=0, metrics_port=-1), STREAMS, register_streams)
        await server.start()
        before = [count(*call) for call in calls]
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                counted = [r async for r in channel.unary_stream(f"/{STREAMS}/CountUp")(b"")]
                assert counted == [b"\0", b"\1", b"\2"]
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    [r async for r in channel.unary_stream(f"/{STREAMS}/FailMidway")(b"")]
                assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert error.value.details() == "user_id: is required"
                requests = [health_pb2.HealthCheckRequest(service=s).SerializeToString() for s in "ab"]
                assert await channel.stream_unary(f"/{STREAMS}/Names")(iter(requests)) == b"a,b"
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await channel.stream_unary(f"/{STREAMS}/Names")(iter([requests[0], b"\xff"]))
                assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert error.value.details().startswith("request: is not a valid protobuf message")
            counts = lambda: [count(*call) for call in calls]  # noqa: E731
            await eventually_equal(counts, [n + 1 for n in before], what="the streams' codes")
        finally:
            await server.server.stop(None)

    asyncio.run(scenario())
