"""Start, health-check and stop service processes: used by the local fleet launcher and by tests.

Every child runs in its own process group, is stopped with SIGTERM (then SIGKILL after a grace), and
is stopped by `Processes.close()` however the parent leaves its `with` block; on Linux a child also gets
SIGTERM when its parent dies without cleaning up (even by SIGKILL), so no orphans remain: children start
through `services.launcher.child`, which arranges that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


# Ports are picked below the kernel's ephemeral range: a port picked there and bound later by a child can
# meanwhile become the source port of any outgoing connection (the rankers dial each other and retry while
# their peers warm up), and the child then fails to bind, or a client connects to itself.
PICK_FROM = 10_000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct free ports below the ephemeral range, in random order: each socket stays bound until
    all are picked, so none is picked twice."""
    if count <= 0:
        return []
    low = _ephemeral_low()
    candidates = random.SystemRandom().sample(range(PICK_FROM, low), low - PICK_FROM)
    with contextlib.ExitStack() as stack:
        picked = []
        for port in candidates:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((host, port))
            except OSError:
                sock.close()
                continue
            stack.enter_context(sock)
            picked.append(port)
            if len(picked) == count:
                return picked
    raise OSError(f"no {count} free ports between {PICK_FROM} and {low} on {host}")


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
    return low if low > PICK_FROM + 1000 else 32768


def health_status(
    address: str, service: str, timeout: float = 1.0, credentials: grpc.ChannelCredentials | None = None
) -> int | None:
    """The health status of `service` at `address` (over TLS with `credentials`), or None when it does
    not answer."""
    try:
        channel = grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
        with channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout).status
    except grpc.RpcError:
        return None


@dataclasses.dataclass
class ServiceProcess:
    """One running service: its name, addresses and OS process."""

    name: str
    module: str
    service: str  # full gRPC service name whose health gates readiness
    port: int
    metrics_port: int
    popen: subprocess.Popen
    log_path: Path | None
    credentials: grpc.ChannelCredentials | None = None  # TLS for health checks of a TLS service

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def stop(self, grace: float = 10.0) -> int | None:
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            return self.popen.wait(5)

    def wait_healthy(self, timeout: float, by_metrics: bool = False) -> None:
        """Waits until the service serves: by a health check on its gRPC port, or `by_metrics` on its own
        metrics port, which only this process answers (another may share its gRPC port: `--reuse-port`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}; {self.log_tail()}")
            if self.serving_by_metrics() if by_metrics else self.serving():
                return
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not healthy after {timeout:.0f}s; {self.log_tail()}")

    def serving(self) -> bool:
        status = health_status(self.address, self.service, timeout=0.5, credentials=self.credentials)
        return status == health_pb2.HealthCheckResponse.SERVING

    def serving_by_metrics(self) -> bool:
        """This very process says it serves: `relaygr_serving 1` on its own metrics port."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=0.5) as page:
                text = page.read().decode()
        except OSError:
            return False
        return any(line.split() == ["relaygr_serving", "1.0"] for line in text.splitlines())

    def log_tail(self, lines: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "no log"
        return "log tail:\n" + "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class Processes:
    """A set of service processes that are all stopped on exit, in reverse start order.

    With `credentials`, readiness is checked over TLS: pass them when the services serve TLS.
    """

    def __init__(
        self,
        log_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.log_dir = log_dir
        self.env = {**os.environ, **(env or {})}
        self.credentials = credentials
        self.children: list[ServiceProcess] = []

    def start(
        self,
        name: str,
        module: str,
        service: str,
        args: Sequence[str] = (),
        port: int | None = None,
        metrics_port: int | None = None,
    ) -> ServiceProcess:
        port = port or free_port()
        metrics_port = metrics_port or free_port()
        log_path = None
        stdout = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_path = self.log_dir / f"{name}.log"
            stdout = log_path.open("ab")
        command = [
            sys.executable, "-m", "services.launcher.child", str(os.getpid()), module,
            "--port", str(port), "--metrics-port", str(metrics_port), *args,
        ]  # fmt: skip
        popen = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=self.env,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if stdout is not subprocess.DEVNULL:
            stdout.close()
        child = ServiceProcess(name, module, service, port, metrics_port, popen, log_path, self.credentials)
        self.children.append(child)
        return child

    def close(self, grace: float = 10.0) -> None:
        for child in reversed(self.children):
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in reversed(self.children):
            try:
                child.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.signal(signal.SIGKILL)
                child.popen.wait(5)
        self.children.clear()

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
