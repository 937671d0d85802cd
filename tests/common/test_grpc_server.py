"""The shared server bootstrap over loopback: the connection age limit, the plaintext health-only port
beside a mutual-TLS main port, and the settings that configure them and the targets services dial."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from relaygr.v1 import ranker_pb2
from services.common.config import ServiceConfig, check_target, load
from services.common.contract import RANKER_SERVICE
from services.common.server import GrpcServer, dial
from services.retrieval_stub.config import RetrievalStubConfig
from services.trigger.config import TriggerConfig
from tests.security.certs import Authority

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class RankEcho:
    """A RankerService with only Rank, answering as `name` and noting the client connection of each call."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.peers: list[str] = []

    def register(self, server: grpc.aio.Server) -> None:
        handler = grpc.unary_unary_rpc_method_handler(self._rank)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(RANKER_SERVICE, {"Rank": handler}),)
        )

    async def _rank(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.peers.append(context.peer())  # ipv4:127.0.0.1:<the client's port>: one per connection
        return ranker_pb2.RankResponse(instance=self.name).SerializeToString()


async def rank(channel: grpc.aio.Channel, timeout_s: float = 5.0) -> ranker_pb2.RankResponse:
    call = channel.unary_unary(f"/{RANKER_SERVICE}/Rank")
    request = ranker_pb2.RankRequest(user_id="u", request_id="r").SerializeToString()
    return ranker_pb2.RankResponse.FromString(await call(request, timeout=timeout_s))


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The error argparse printed last (the usage above it lists every flag)."""
    return capsys.readouterr().err.strip().splitlines()[-1]


async def health_status(channel: grpc.aio.Channel, service: str) -> int:
    check = health_pb2_grpc.HealthStub(channel).Check
    return (await check(health_pb2.HealthCheckRequest(service=service), timeout=5)).status


def test_old_connections_are_sent_away_and_clients_reconnect_without_a_failed_call() -> None:
    """A client calling for 3.5 s is made to reconnect about every second (a new client port each time)
    when the server limits connection age to 1 s, and keeps its one connection when it does not."""

    async def connections(max_connection_age_s: float) -> tuple[int, int, int]:
        echo = RankEcho("aged" if max_connection_age_s else "unaged")
        config = ServiceConfig(
            port=0,
            metrics_port=-1,
            drain_grace_s=0.5,
            max_connection_age_s=max_connection_age_s,
            max_connection_age_grace_s=0.5,
        )
        server = GrpcServer(config, RANKER_SERVICE, echo.register)
        await server.start()
        await server.set_serving()
        calls = failed = 0
        try:
            async with dial(server.address, ServiceConfig()) as channel:
                deadline = time.monotonic() + 3.5
                while time.monotonic() < deadline:
                    try:
                        assert (await rank(channel)).instance == echo.name
                    except grpc.aio.AioRpcError:
                        failed += 1
                    calls += 1
                    await asyncio.sleep(0.02)
        finally:
            await server.drain()
        return len(set(echo.peers)), calls, failed

    async def both() -> list[tuple[int, int, int]]:
        return await asyncio.gather(connections(1.0), connections(0))

    (aged, aged_calls, aged_failed), (unaged, unaged_calls, unaged_failed) = asyncio.run(both())
    assert aged_calls > 50 and unaged_calls > 50
    assert aged >= 3, aged  # GOAWAY at ~1 s (jittered), a fresh connection each time
    assert unaged == 1
    assert aged_failed == unaged_failed == 0


def test_the_health_port_is_plaintext_mirrors_the_servers_health_and_serves_nothing_else(
    tmp_path: Path,
) -> None:
    leaf = Authority(tmp_path, "fleet").issue("relaygr")
    config = ServiceConfig(
        port=0,
        metrics_port=-1,
        health_port=0,
        drain_grace_s=1.0,
        tls_cert=str(leaf.cert),
        tls_key=str(leaf.key),
        tls_ca=str(leaf.ca),  # mutual TLS: the main port refuses clients without a fleet certificate
    )

    async def main() -> None:
        draining, release = asyncio.Event(), asyncio.Event()

        async def on_drain() -> None:
            draining.set()
            await release.wait()

        echo = RankEcho("main")
        server = GrpcServer(config, RANKER_SERVICE, echo.register, on_drain)
        await server.start()
        assert server.health_port not in (-1, 0, server.port)
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{server.health_port}") as probe,
            grpc.aio.insecure_channel(server.address) as plaintext_main,
            dial(server.address, config) as fleet_client,
        ):
            assert await health_status(probe, RANKER_SERVICE) == NOT_SERVING  # warming up
            await server.set_serving()
            assert await health_status(probe, RANKER_SERVICE) == SERVING
            assert await health_status(probe, "") == SERVING
            assert await health_status(fleet_client, RANKER_SERVICE) == SERVING

            # The main port wants TLS with a client certificate; only the fleet's client gets through.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await health_status(plaintext_main, RANKER_SERVICE)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert (await rank(fleet_client)).instance == "main"
            # The health port serves the health service and nothing else.
            with pytest.raises(grpc.aio.AioRpcError) as unimplemented:
                await rank(probe)
            assert unimplemented.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert len(echo.peers) == 1

            # Draining turns the health port NOT_SERVING with the main server, which still serves.
            drain = asyncio.create_task(server.drain())
            await asyncio.wait_for(draining.wait(), 5)
            assert await health_status(probe, RANKER_SERVICE) == NOT_SERVING
            assert await health_status(probe, "") == NOT_SERVING
            assert await health_status(fleet_client, RANKER_SERVICE) == NOT_SERVING
            release.set()
            await drain
            # Stopped, the health port is closed too.
            with pytest.raises(grpc.aio.AioRpcError) as closed:
                await health_status(probe, RANKER_SERVICE)
            assert closed.value.code() == grpc.StatusCode.UNAVAILABLE

    asyncio.run(main())


def test_no_health_port_unless_asked() -> None:
    async def main() -> None:
        server = GrpcServer(ServiceConfig(port=0, metrics_port=-1), RANKER_SERVICE, RankEcho("x").register)
        await server.start()
        try:
            assert server.health_server is None and server.health_port == -1
        finally:
            await server.drain()

    asyncio.run(main())


GOOD_TARGETS = [
    "router:50050",
    "127.0.0.1:50050",
    "[::1]:50050",
    "dns:///router-headless.relaygr.svc.cluster.local:50050",
    "dns://127.0.0.1:5353/routers.relaygr.test:50050",
    "dns:router:50050",
    "ipv4:127.0.0.1:50050,127.0.0.2:50050",
    "ipv6:[::1]:50050,[fd00::2]:1",
]
BAD_TARGETS = [
    "router",  # no port
    "dns:///router-headless.relaygr.svc.cluster.local",  # gRPC would dial 443
    "dns:///router:http",
    "ipv4:127.0.0.1",
    "ipv4:router:50050",
    "ipv4:127.0.0.1:50050,",
    "ipv4:[::1]:50050",
    "ipv6:::1:50050",  # an IPv6 address with a port needs brackets
    "ipv6:[127.0.0.1]:50050",
    "unix:/run/router.sock",
]


@pytest.mark.parametrize("target", GOOD_TARGETS)
def test_clients_accept_every_kind_of_grpc_target(target: str) -> None:
    check_target(target, "--router")
    stub = load(RetrievalStubConfig, ["--router", target, "--trigger", target], {})
    assert (stub.router, stub.trigger) == (target, target)
    assert load(TriggerConfig, ["--router", target], {}).router == target


@pytest.mark.parametrize("target", BAD_TARGETS)
def test_a_bad_target_is_refused_naming_the_flag(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="--router"):
        check_target(target, "--router")
    for cls, flag in (
        (RetrievalStubConfig, "--router"),
        (RetrievalStubConfig, "--trigger"),
        (TriggerConfig, "--router"),
    ):
        with pytest.raises(SystemExit):
            load(cls, [flag, target], {})
        assert f"error: {flag}: " in error_line(capsys), (cls.__name__, flag)
    # The baseline stub sends no Admit: its --trigger is not dialled, so not checked.
    assert load(RetrievalStubConfig, ["--relay", "false", "--trigger", target], {}).trigger == target


def test_balancing_and_health_port_settings(capsys: pytest.CaptureFixture[str]) -> None:
    config = load(ServiceConfig, [], {})
    assert (config.lb_policy, config.max_connection_age_s, config.max_connection_age_grace_s) == (
        "round_robin",
        30.0,
        10.0,
    )
    assert config.health_port == -1
    assert load(ServiceConfig, [], {"RELAYGR_HEALTH_PORT": "50061"}).health_port == 50061
    for argv in (["--health-port", "-2"], ["--health-port", "70000"], ["--port", "5", "--health-port", "5"]):
        with pytest.raises(SystemExit):
            load(ServiceConfig, argv, {})
        assert "error: --health-port " in error_line(capsys), argv
