"""The local fleet: N rankers, the router, the trigger and the retrieval stub as child processes.

`Fleet` starts the services tier by tier (rankers, router, trigger, retrieval stub), each once the tier
it calls is healthy (with `--routing direct`, the default, the trigger and the stub are given the rankers
and route their own calls; the router serves the clients that call RankerService, such as ghz), and
stops them front door first. Every child runs in its own process group under
`services.launcher.procs.Processes`, so `stop()` (and leaving the `with` block, however it is left) ends
them all. `check()` raises `ServiceExited` for a child that died on its own, naming it with its log tail;
`kill` / `restart` (and `kill_ranker` / `restart_ranker`) take one service down and bring it back on the
same name and ports; `replace` swaps a router or trigger for a new process without a gap, as a rolling
update with surge does.

Ports, from `base_port` B and `metrics_base_port` M (0: free ports, as tests use):

| service        | gRPC       | metrics    |
|----------------|------------|------------|
| router         | B          | M          |
| trigger        | B + 2      | M + 2      |
| retrieval-stub | B + 3      | M + 3      |
| ranker-i       | B + 10 + i | M + 10 + i |

With the defaults: router 50050, trigger 50052, retrieval stub 50053, rankers 50060…; metrics 9100, 9102,
9103, 9110….
"""

from __future__ import annotations

import dataclasses
import shlex
import signal
from pathlib import Path

from services.common.config import ServiceConfig, check, setting
from services.common.contract import RANKER_SERVICE, RECOMMEND_SERVICE, TRIGGER_SERVICE
from services.common.cpus import cpu_budget
from services.common.server import channel_credentials
from services.launcher.procs import Processes, ServiceProcess

# Health-checked service names; the router serves RankerService like a ranker.

ROUTER, TRIGGER, STUB = "router", "trigger", "retrieval-stub"
ROUTINGS = ("direct", "router")
PORT_OFFSETS = {ROUTER: 0, TRIGGER: 2, STUB: 3}
RANKER_PORT_OFFSET = 10
# A free port is picked by the launcher and bound by the child, so another process may take it in
# between; a child that lost its port that way is started again on new ones, this many times at most.
PORT_CLASH_MARKERS = ("Address already in use", "Failed to bind to address")
PORT_CLASH_ATTEMPTS = 3
# Stateless services that `replace` can swap in place: they are started with --reuse-port.
SURGE_SERVICES = (ROUTER, TRIGGER)


@dataclasses.dataclass(frozen=True)
class FleetConfig:
    """What the local fleet runs; each extra-args string is split like a shell command line.

    The fleet passes a service only the flags it sets: a setting left unset (None; `(empty)` in
    docs/configuration.md) is not passed on, so the service's own default applies, and no service's
    configuration is imported here to copy it."""

    rankers: int = setting(2, "number of rankers (named ranker-0 … ranker-N-1)")
    model_preset: str = setting("cpu-small", "every ranker's model preset: cpu-tiny, cpu-small or gpu-dlrmv3")
    checkpoint: str | None = setting(
        None,
        "model every ranker serves: a model directory (e.g. from services.ranker.convert; its architecture "
        "replaces --model-preset) or a state_dict file (unset: seeded weights)",
    )
    hbm_budget_mb: float | None = setting(
        None,
        "HBM-tier byte budget of each ranker, MiB (-1: the ranker's auto one; unset: the ranker's default)",
    )
    dram_budget_mb: float | None = setting(
        None,
        "DRAM-tier byte budget of each ranker, MiB (-1: the ranker's auto one; unset: the ranker's default)",
    )
    slo_ms: float | None = setting(
        None,
        "the trigger's ranking latency SLO (P99), ms: it never sheds what would miss it (unset: the "
        "trigger's default)",
    )
    relay_window_ms: float | None = setting(
        None,
        "the relay window, ms: passed to both the trigger and the retrieval stub, which read it as one "
        "setting (the stub's pre-processing time, the window the trigger places prefixes against); unset: "
        "their shared default",
    )
    relay: bool = setting(True, "run the relay; false starts the baseline (retrieval stub without Admit)")
    routing: str = setting(
        "direct",
        "how the trigger and the retrieval stub reach the rankers: direct (each routes its own PreInfer and "
        "Rank with the router's policy, given the rankers: one hop less each way) or router (through the "
        "router); the router runs either way, for clients that call RankerService",
        choices=ROUTINGS,
    )
    base_port: int = setting(50050, "gRPC port of the router; the others follow it (0: free ports)")
    metrics_base_port: int = setting(9100, "metrics port of the router; the others follow it (0: free ports)")
    log_dir: str = setting(".run/logs", "folder of the services' logs, one <service>.log each")
    startup_timeout_s: float = setting(300.0, "seconds each service gets to become healthy", above=0)
    ranker_args: str = setting(
        "--profile-lengths 128,512,2048",
        "extra flags for every ranker (the default: a quick warm-up). Without --torch-threads among them, "
        "each ranker gets its share of the launcher's CPUs (its affinity and cgroup quota, divided by "
        "--rankers, at least one)",
    )
    router_args: str = setting("", "extra flags for the router")
    trigger_args: str = setting("", "extra flags for the trigger")
    stub_args: str = setting(
        "--history-max 2048", "extra flags for the retrieval stub (the default keeps a CPU demo on 2 cores)"
    )
    tls_cert: str = setting("", "PEM certificate chain of every service; with --tls-key the fleet uses TLS")
    tls_key: str = setting("", "PEM private key for --tls-cert")
    tls_ca: str = setting("", "PEM CA bundle every service verifies its peers with; it makes TLS mutual")

    def client_tls(self) -> ServiceConfig:
        """The TLS settings of the fleet's own clients: the launcher's health checks and demo traffic."""
        return ServiceConfig(tls_cert=self.tls_cert, tls_key=self.tls_key, tls_ca=self.tls_ca)

    def tls_args(self) -> list[str]:
        """The TLS flags every service gets."""
        flags = {"--tls-cert": self.tls_cert, "--tls-key": self.tls_key, "--tls-ca": self.tls_ca}
        return [part for flag, path in flags.items() if path for part in (flag, path)]

    def validate(self) -> None:
        check(self)
        self.client_tls().validate()
        if self.rankers < 1:
            raise ValueError("--rankers must be at least 1")
        for name in ("base_port", "metrics_base_port"):
            port = getattr(self, name)
            if port and not 0 < port + RANKER_PORT_OFFSET + self.rankers < 65536:
                raise ValueError(f"--{name.replace('_', '-')} leaves no room for the fleet's ports")
        for name in ("ranker_args", "router_args", "trigger_args", "stub_args"):
            shlex.split(getattr(self, name))

    def ports(self, name: str) -> tuple[int, int]:
        """(gRPC port, metrics port) of a service; 0 means a free port."""
        offset = PORT_OFFSETS.get(name)
        if offset is None:
            offset = RANKER_PORT_OFFSET + int(name.removeprefix("ranker-"))
        return (
            self.base_port + offset if self.base_port else 0,
            self.metrics_base_port + offset if self.metrics_base_port else 0,
        )


@dataclasses.dataclass(frozen=True)
class _Launch:
    """How a child was started, so that it can be started again."""

    module: str
    service: str
    args: tuple[str, ...]
    ports: tuple[int, int]  # as requested: 0 lets the fleet pick a free port


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Where one running service answers."""

    name: str
    address: str
    metrics_port: int
    pid: int

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"


class ServiceExited(RuntimeError):
    """A child of the fleet exited without being asked to."""

    def __init__(self, name: str, returncode: int | None, log_tail: str) -> None:
        super().__init__(f"{name} exited with code {returncode}; {log_tail}")
        self.name = name
        self.returncode = returncode


def given(flags: dict[str, object]) -> list[str]:
    """`flag value` for each flag whose value is set; an unset one (None) is left to the service's default."""
    return [part for flag, value in flags.items() if value is not None for part in (flag, str(value))]


def ranker_share(cpus: int, rankers: int) -> int:
    """Intra-op threads each of `rankers` local rankers gets of `cpus`: an equal share, at least one."""
    return max(1, cpus // rankers)


def ranker_name(index: int) -> str:
    return f"ranker-{index}"


class Fleet:
    """The local fleet's processes. Not thread-safe: drive it from one thread."""

    def __init__(self, config: FleetConfig) -> None:
        config.validate()
        self.config = config
        self.log_dir = Path(config.log_dir)
        tls = config.client_tls()
        credentials = channel_credentials(tls) if tls.tls else None
        self.processes = Processes(log_dir=self.log_dir, credentials=credentials)
        self.children: dict[str, ServiceProcess] = {}
        self._launches: dict[str, _Launch] = {}
        self._stopped_on_purpose: set[str] = set()

    @property
    def ranker_names(self) -> list[str]:
        return [ranker_name(i) for i in range(self.config.rankers)]

    def start(self) -> dict[str, Endpoint]:
        """Starts every service and waits until each is healthy; returns their endpoints by name."""
        try:
            self._start_all()
        except BaseException:
            self.stop()
            raise
        return self.endpoints()

    def _start_all(self) -> None:
        c = self.config
        for name in [*self.ranker_names, ROUTER, TRIGGER, STUB]:
            (self.log_dir / f"{name}.log").unlink(missing_ok=True)
        for name in self.ranker_names:
            self._spawn(name, "services.ranker", RANKER_SERVICE, self._ranker_args(name))
        for name in self.ranker_names:
            self._wait_healthy(name)
        router_args = ["--rankers", self.members(), "--reuse-port", "true", *shlex.split(c.router_args)]
        self._spawn(ROUTER, "services.router", RANKER_SERVICE, router_args)
        self._wait_healthy(ROUTER)
        self._spawn(TRIGGER, "services.trigger", TRIGGER_SERVICE, self._trigger_args())
        self._wait_healthy(TRIGGER)
        self._spawn(STUB, "services.retrieval_stub", RECOMMEND_SERVICE, self._stub_args())
        self._wait_healthy(STUB)
        self.check()  # none of the earlier tiers died meanwhile

    def _ranker_args(self, name: str) -> list[str]:
        c = self.config
        return [
            "--instance-name", name, "--model-preset", c.model_preset,
            *given({"--hbm-budget-mb": c.hbm_budget_mb, "--dram-budget-mb": c.dram_budget_mb}),
            *given({"--checkpoint": c.checkpoint}),
            *self._torch_threads(), *shlex.split(c.ranker_args),
        ]  # fmt: skip

    def _torch_threads(self) -> list[str]:
        """`--torch-threads` with each ranker's share of the CPUs, unless the ranker flags set it: rankers
        started together, each sizing its pool by the whole host, would oversubscribe the cores and measure
        each other at warm-up instead of the model."""
        if any(arg.startswith("--torch-threads") for arg in shlex.split(self.config.ranker_args)):
            return []
        return ["--torch-threads", str(ranker_share(cpu_budget().cpus, self.config.rankers))]

    def members(self) -> str:
        """The rankers as `--rankers` lists them: name=host:port,..."""
        return ",".join(f"{name}={self.children[name].address}" for name in self.ranker_names)

    def ranker_route_args(self) -> list[str]:
        """The flags that give a trigger or retrieval stub its way to the rankers (`--routing`)."""
        if self.config.routing == "direct":
            return ["--rankers", self.members()]
        return ["--router", self.address(ROUTER)]

    def _trigger_args(self) -> list[str]:
        c = self.config
        return [
            *self.ranker_route_args(),
            *given({"--slo-ms": c.slo_ms, "--relay-window-ms": c.relay_window_ms}), "--reuse-port", "true",
            *shlex.split(c.trigger_args),
        ]  # fmt: skip

    def _stub_args(self) -> list[str]:
        c = self.config
        return [
            *self.ranker_route_args(), "--trigger", self.address(TRIGGER), "--relay", str(c.relay).lower(),
            *given({"--relay-window-ms": c.relay_window_ms}), *shlex.split(c.stub_args),
        ]  # fmt: skip

    def _spawn(self, name: str, module: str, service: str, args: list[str]) -> None:
        args = [*args, *self.config.tls_args()]
        self._launches[name] = _Launch(module, service, tuple(args), self.config.ports(name))
        self._respawn(name)

    def _respawn(self, name: str) -> None:
        launch = self._launches[name]
        port, metrics_port = launch.ports
        self.children[name] = self.processes.start(
            name, launch.module, launch.service, launch.args, port=port, metrics_port=metrics_port
        )

    def _wait_healthy(self, name: str) -> None:
        for attempt in range(1, PORT_CLASH_ATTEMPTS + 1):
            child = self.children[name]
            try:
                child.wait_healthy(self.config.startup_timeout_s)
                break
            except RuntimeError as exc:  # it exited while starting
                tail = child.log_tail()
                free_ports = self._launches[name].ports == (0, 0)
                lost_port = free_ports and any(marker in tail for marker in PORT_CLASH_MARKERS)
                if not lost_port or attempt == PORT_CLASH_ATTEMPTS:
                    raise ServiceExited(name, child.popen.returncode, tail) from exc
                self._respawn(name)

    def address(self, name: str) -> str:
        return self.children[name].address

    def endpoints(self) -> dict[str, Endpoint]:
        return {
            name: Endpoint(name, child.address, child.metrics_port, child.popen.pid)
            for name, child in self.children.items()
        }

    def check(self) -> None:
        """Raises ServiceExited for the first child that died without being stopped on purpose."""
        for name, child in self.children.items():
            if name not in self._stopped_on_purpose and not child.alive():
                raise ServiceExited(name, child.popen.returncode, child.log_tail())

    def kill_ranker(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Takes one ranker down (SIGKILL by default: a crash, no drain) and waits until it is gone."""
        self.kill(name, sig)

    def restart_ranker(self, name: str) -> Endpoint:
        """Starts a stopped ranker again under its name and ports, and waits until it is healthy."""
        return self.restart(name)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Takes one service down (SIGKILL by default: a crash, no drain) and waits until it is gone."""
        child = self.children[name]
        self._stopped_on_purpose.add(name)
        child.signal(sig)
        child.popen.wait(self.config.startup_timeout_s)

    def restart(self, name: str) -> Endpoint:
        """Starts a stopped service again under its name and ports, and waits until it is healthy."""
        old = self.children[name]
        if old.alive():
            raise RuntimeError(f"{name} is still running; kill it first")
        # Same ports, even where they were picked free: the router knows the ranker by this address.
        self._launches[name] = dataclasses.replace(self._launches[name], ports=(old.port, old.metrics_port))
        self._respawn(name)
        self._stopped_on_purpose.discard(name)
        self._wait_healthy(name)
        return self.endpoints()[name]

    def replace(self, name: str) -> Endpoint:
        """Replaces a running router or trigger without a gap, as a rolling update with surge does: a new
        process binds the same gRPC port (SO_REUSEPORT) and a new metrics port; once it serves, by its
        own metrics, the old one gets SIGTERM, drains and exits (its `popen.returncode` tells how)."""
        if name not in SURGE_SERVICES:
            raise ValueError(f"only {' and '.join(SURGE_SERVICES)} can be replaced in place, not {name}")
        old = self.children[name]
        self._launches[name] = dataclasses.replace(self._launches[name], ports=(old.port, 0))
        self._respawn(name)
        new = self.children[name]
        try:
            new.wait_healthy(self.config.startup_timeout_s, by_metrics=True)
        except RuntimeError as exc:  # it exited while starting
            raise ServiceExited(name, new.popen.returncode, new.log_tail()) from exc
        old.stop(grace=self.config.startup_timeout_s)
        return self.endpoints()[name]

    def stop(self) -> None:
        """Stops every child (SIGTERM, then SIGKILL after a grace), the front door first."""
        self._stopped_on_purpose.update(self.children)
        self.processes.close()

    def __enter__(self) -> Fleet:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
