"""Server bootstrap shared by every service: gRPC server, health, reflection, metrics, TLS, drain.

`GrpcServer` owns the server's options and its lifecycle:

1. `start()` binds the gRPC port, the health-only port when `--health-port` asks for one, and the
   Prometheus metrics port (port 0 picks a free one; the bound ports are exposed), with health
   NOT_SERVING for the service's full name;
2. the caller warms up, then calls `set_serving()` (in a service process, the warm heap is frozen out of the
   garbage collector's way first: `services/common/garbage.py`);
3. `wait()` serves until SIGTERM or SIGINT (or `stop()`), then drains: health goes NOT_SERVING at once
   so load balancers stop sending, the `on_drain` hook runs, and in-flight RPCs get `drain_grace_s`.

Every service runs the same way (`service_main` → `serve_app`): its `app.py` builds a `ServiceApp` (the
wiring: config, logic, servicer, `GrpcServer`), whose `start()` does 1 and 2, and `serve_app` installs the
signal handlers, does 3 and closes the app.

The health-only port is a second server sharing the main server's `HealthServicer`, so both always
answer the same status. It is plaintext even when the main port requires mutual TLS: kubelet's native
gRPC probes present no client certificate. It serves nothing but `grpc.health.v1.Health`.

Connections are balanced the gRPC way: `dial()` gives every channel the `--lb-policy` through its
service config (a `dns:///name:port` target lists every replica), and the server sends GOAWAY to a
connection older than `--max-connection-age-s`, so long-lived clients reconnect, re-resolve, and
spread onto replicas that started after them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from services.common import garbage, tracing
from services.common.config import ServiceConfig, load
from services.common.interceptor import Interceptor
from services.common.logs import setup_logging
from services.common.metrics import SERVING

log = logging.getLogger(__name__)

C = TypeVar("C", bound=ServiceConfig)


def message_options(config: ServiceConfig) -> list[tuple[str, int]]:
    """Message size limits, the same for servers and channels."""
    size = config.max_message_mb * 1024 * 1024
    return [("grpc.max_receive_message_length", size), ("grpc.max_send_message_length", size)]


def grpc_options(config: ServiceConfig) -> list[tuple[str, int]]:
    """Options of a service's gRPC server: message limits, port reuse and the connection age limit."""
    options = [*message_options(config), ("grpc.so_reuseport", int(config.reuse_port))]
    if config.max_connection_age_s > 0:
        options += [
            ("grpc.max_connection_age_ms", round(config.max_connection_age_s * 1000)),
            ("grpc.max_connection_age_grace_ms", round(config.max_connection_age_grace_s * 1000)),
        ]
    return options


def service_config(lb_policy: str) -> str:
    """A channel's gRPC service config (JSON) choosing its load-balancing policy."""
    return json.dumps({"loadBalancingConfig": [{lb_policy: {}}]})


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def server_credentials(config: ServiceConfig) -> grpc.ServerCredentials:
    root = _read(config.tls_ca) if config.tls_ca else None
    return grpc.ssl_server_credentials(
        [(_read(config.tls_key), _read(config.tls_cert))],
        root_certificates=root,
        require_client_auth=root is not None,
    )


def channel_credentials(config: ServiceConfig) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=_read(config.tls_ca) if config.tls_ca else None,
        private_key=_read(config.tls_key),
        certificate_chain=_read(config.tls_cert),
    )


def dial(
    target: str, config: ServiceConfig, extra_options: Iterable[tuple[str, object]] = ()
) -> grpc.aio.Channel:
    """An aio channel to a peer service, over TLS when this service is configured for it.

    `target` is any gRPC target (`host:port`, `dns:///name:port`, `ipv4:a:p,b:q`); calls are spread over
    its addresses by `--lb-policy`. The policy is fixed here, not taken from DNS TXT records. A name is
    re-resolved whenever a connection drops (a GOAWAY from the server's connection age included), at
    most once per longest reconnect wait, rather than gRPC's default 30 s, so replaced replicas are
    found as fast as they are redialled.
    """
    defaults = [
        *message_options(config),
        ("grpc.keepalive_time_ms", config.keepalive_ms),
        ("grpc.initial_reconnect_backoff_ms", config.reconnect_backoff_ms),
        ("grpc.max_reconnect_backoff_ms", 10 * config.reconnect_backoff_ms),
        ("grpc.service_config", service_config(config.lb_policy)),
        ("grpc.service_config_disable_resolution", 1),
        ("grpc.dns_min_time_between_resolutions_ms", 10 * config.reconnect_backoff_ms),
    ]
    options = list({**dict(defaults), **dict(extra_options)}.items())  # the caller's options win
    if config.tls:
        return grpc.aio.secure_channel(target, channel_credentials(config), options=options)
    return grpc.aio.insecure_channel(target, options=options)


class GrpcServer:
    """One service's gRPC server with health (also on a plaintext health-only port), reflection, metrics
    and graceful drain."""

    def __init__(
        self,
        config: ServiceConfig,
        service_name: str,
        register: Callable[[Interceptor], None],
        on_drain: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.config = config
        self.service_name = service_name
        self.server = grpc.aio.server(options=grpc_options(config))
        instrumented = Interceptor(self.server)
        register(instrumented)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, instrumented)
        # Reflection streams, which are not instrumented; it must see the aio server itself.
        reflection.enable_server_reflection(
            (service_name, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )
        self.health_server: grpc.aio.Server | None = None
        if config.health_port >= 0:
            # Port reuse as on the main port, so a replacement process can bind both.
            self.health_server = grpc.aio.server(options=[("grpc.so_reuseport", int(config.reuse_port))])
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self.health_server)
        self._on_drain = on_drain
        self._stop = asyncio.Event()
        self._metrics_http = None
        self.port = 0
        self.health_port = -1
        self.metrics_port = -1

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    async def start(self) -> None:
        bind = f"{self.config.host}:{self.config.port}"
        if self.config.tls:
            self.port = self.server.add_secure_port(bind, server_credentials(self.config))
        else:
            self.port = self.server.add_insecure_port(bind)
        if self.health_server is not None:
            health_bind = f"{self.config.host}:{self.config.health_port}"
            self.health_port = self.health_server.add_insecure_port(health_bind)
        if self.config.metrics_port >= 0:
            self._metrics_http, _ = start_http_server(self.config.metrics_port, addr=self.config.host)
            self.metrics_port = self._metrics_http.server_port
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()
        if self.health_server is not None:
            await self.health_server.start()
        log.info(
            "%s listening on %s (health-only port %s, metrics on %s:%s)",
            self.service_name, self.address, self.health_port, self.config.host, self.metrics_port,
        )  # fmt: skip

    async def _set_health(self, status: int) -> None:
        await self.health.set(self.service_name, status)
        await self.health.set("", status)
        SERVING.set(int(status == health_pb2.HealthCheckResponse.SERVING))

    async def set_serving(self) -> None:
        garbage.on_serving()
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)

    def request_stop(self) -> None:
        self._stop.set()

    async def wait(self) -> None:
        """Serves until a stop is requested, then drains and stops."""
        await self._stop.wait()
        await self.drain()

    async def drain(self) -> None:
        log.info("%s draining (grace %.1fs)", self.service_name, self.config.drain_grace_s)
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._on_drain is not None:
            await self._on_drain()
        await self.server.stop(self.config.drain_grace_s)
        if self.health_server is not None:
            await self.health_server.stop(0)
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
        log.info("%s stopped", self.service_name)


class ServiceApp(Protocol):
    """One service's components behind its `GrpcServer`: what `serve_app` runs. Every service's `app.py`
    has one (`RankerApp`, `RouterApp`, `TriggerApp`, `RetrievalStubApp`), built in a running event loop."""

    grpc: GrpcServer

    async def start(self) -> None:
        """Binds the ports and starts serving; health turns SERVING when the service is ready (at once, after
        a warm-up, or when a dependency answers)."""

    async def close(self) -> None:
        """Releases what `start` and the constructor took (channels, threads, tasks), after the drain."""


async def serve_app(app: ServiceApp) -> None:
    """Start-up, signals and drain, written once for every service: SIGTERM and SIGINT request a stop (also
    during start-up), the server serves until then, drains (`GrpcServer.wait`), and the app closes."""
    app.grpc.install_signal_handlers()
    try:
        await app.start()
        await app.grpc.wait()
    finally:
        await app.close()


def service_main(
    config_class: type[C],
    make_app: Callable[[C], ServiceApp],
    argv: Sequence[str] | None,
    name: str,
    description: str,
    log_name: Callable[[C], str] | None = None,
) -> None:
    """A service's command line: settings from flags and `RELAYGR_…`, logging (as `log_name(config)`, or
    `name`), tracing when `--otlp-endpoint` is set, then the app `make_app(config)` built and served
    (`serve_app`) on uvloop; the spans still batched are exported on the way out."""
    config = load(config_class, argv, prog=f"python -m services.{name}", description=description)
    instance = name if log_name is None else log_name(config)
    setup_logging(config.log_level, instance)
    garbage.install(config.gc_freeze)
    tracing.setup(config, name, instance if log_name is not None else "")

    async def main() -> None:
        await serve_app(make_app(config))

    try:
        run(main)
    finally:
        tracing.shutdown()


def run(main: Callable[[], Awaitable[None]]) -> None:
    """Runs a service's async main on uvloop when available."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())
