"""The local fleet: N rankers, the router, the trigger and the retrieval stub as child processes.

`Fleet` starts the services tier by tier (rankers, router, trigger, retrieval stub), each once the tier
it calls is healthy (with `--routing direct`, the default, the trigger and the stub are given the rankers
and route their own calls; the router serves the clients that call RankerService, such as ghz), and
stops them front door first. Every ranker is given the ring's members too (`--rankers`, itself among
them), to hand its cached prefixes off when it drains and to read misses through from its peers, so the
rankers' ports are picked before any ranker starts. The members are the rankers started and any spares
(`--spare-rankers`): declared to every process but not started, a spare is on the ring but unroutable, so
its users go to their next member until `start_ranker` starts it (a scale-out with a static member list).

Every child runs in its own process group under `services.launcher.procs.Processes`, so `stop()` (and
leaving the `with` block, however it is left) ends them all. `check()` raises `ServiceExited` for a child
that died on its own, naming it with its log tail; `kill` / `restart` (and `kill_ranker` /
`restart_ranker`) take one service down and bring it back on the same name and ports (SIGTERM drains a
ranker, which hands its prefixes off); `replace` swaps a router or trigger for a new process without a
gap, as a rolling update with surge does.

Ports, from `base_port` B and `metrics_base_port` M (0: free ports, as tests use):

| service        | gRPC       | metrics    |
|----------------|------------|------------|
| router         | B          | M          |
| trigger        | B + 2      | M + 2      |
| retrieval-stub | B + 3      | M + 3      |
| ranker-i       | B + 10 + i | M + 10 + i |

(spares included: ranker-i for i up to rankers + spares - 1).

With the defaults: router 50050, trigger 50052, retrieval stub 50053, rankers 50060…; metrics 9100, 9102,
9103, 9110….
"""

from __future__ import annotations

import dataclasses
import shlex
import signal
from pathlib import Path

from services.common.contract import RANKER_SERVICE, RECOMMEND_SERVICE, TRIGGER_SERVICE
from services.common.cpus import cpu_budget
from services.common.server import channel_credentials
from services.launcher.config import ROUTER, STUB, TRIGGER, FleetConfig
from services.launcher.procs import Processes, ServiceProcess, free_ports

__all__ = ["ROUTER", "STUB", "TRIGGER", "Endpoint", "Fleet", "FleetConfig", "ServiceExited", "ranker_share"]

# A free port is picked by the launcher and bound by the child, so another process may take it in
# between; a child that lost its port that way is started again on new ones, this many times at most.
PORT_CLASH_MARKERS = ("Address already in use", "Failed to bind to address")
PORT_CLASH_ATTEMPTS = 3
# Stateless services that `replace` can swap in place: they are started with --reuse-port.
SURGE_SERVICES = (ROUTER, TRIGGER)


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


class _PortLost(Exception):
    """A child exited because another process took a free port picked for it before it bound it."""

    def __init__(self, exited: ServiceExited) -> None:
        super().__init__(str(exited))
        self.exited = exited


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
        # Every member's (gRPC, metrics) ports, picked before any starts: each ranker's list names them all.
        self._member_ports = dict(zip(self.member_names, self._pick_ports(self.member_names), strict=True))

    @property
    def ranker_names(self) -> list[str]:
        """The rankers the fleet starts."""
        return [ranker_name(i) for i in range(self.config.rankers)]

    @property
    def member_names(self) -> list[str]:
        """Every ring member: the rankers the fleet starts, then the spares."""
        return [ranker_name(i) for i in range(self.config.members)]

    def start(self) -> dict[str, Endpoint]:
        """Starts every service and waits until each is healthy; returns their endpoints by name (`with
        Fleet(...)` starts it: a second start would clash with the first's picked ports, so it is refused)."""
        if self.children:
            raise RuntimeError("the fleet is already started (entering its `with` block starts it)")
        try:
            self._start_all()
        except BaseException:
            self.stop()
            raise
        return self.endpoints()

    def _start_all(self) -> None:
        c = self.config
        for name in [*self.member_names, ROUTER, TRIGGER, STUB]:
            (self.log_dir / f"{name}.log").unlink(missing_ok=True)
        self._start_rankers()
        router_args = ["--rankers", self.members(), "--reuse-port", "true", *shlex.split(c.router_args)]
        self._spawn(ROUTER, "services.router", RANKER_SERVICE, router_args)
        self._wait_healthy(ROUTER)
        self._spawn(TRIGGER, "services.trigger", TRIGGER_SERVICE, self._trigger_args())
        self._wait_healthy(TRIGGER)
        self._spawn(STUB, "services.retrieval_stub", RECOMMEND_SERVICE, self._stub_args())
        self._wait_healthy(STUB)
        self.check()  # none of the earlier tiers died meanwhile

    def _start_rankers(self) -> None:
        """Starts the rankers, each given every member's address (`--rankers`), and waits until they are
        healthy. A ranker that lost a free port picked for it to another process gets new ones, and the
        rankers start again together, so that every member list stays the same."""
        for attempt in range(1, PORT_CLASH_ATTEMPTS + 1):
            for name in self.ranker_names:
                self._spawn(name, "services.ranker", RANKER_SERVICE, self._ranker_args(name))
            try:
                for name in self.ranker_names:
                    self._healthy(name)
                return
            except _PortLost as lost:
                if attempt == PORT_CLASH_ATTEMPTS:
                    raise lost.exited from lost
                for name in self.ranker_names:
                    self.children[name].stop()
                (self._member_ports[lost.exited.name],) = self._pick_ports([lost.exited.name])

    def _pick_ports(self, names: list[str]) -> list[tuple[int, int]]:
        """Each service's (gRPC, metrics) ports: its configured ones, or distinct free ones where 0."""
        wanted = [self.config.ports(name) for name in names]
        free = iter(free_ports(sum(port == 0 for pair in wanted for port in pair)))
        return [(port or next(free), metrics_port or next(free)) for port, metrics_port in wanted]

    def _ranker_args(self, name: str) -> list[str]:
        c = self.config
        return [
            "--instance-name", name, "--model-preset", c.model_preset,
            *c.ranker_device_args(int(name.removeprefix("ranker-"))),
            *given({"--hbm-budget-mb": c.hbm_budget_mb, "--dram-budget-mb": c.dram_budget_mb}),
            *given({"--checkpoint": c.checkpoint}), "--rankers", self.members(),
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
        """The ring's members, spares included, as `--rankers` lists them: name=host:port,..."""
        return ",".join(f"{name}=127.0.0.1:{self._member_ports[name][0]}" for name in self.member_names)

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
        ports = self._member_ports.get(name, self.config.ports(name))
        self._launches[name] = _Launch(module, service, tuple(args), ports)
        self._respawn(name)

    def _respawn(self, name: str) -> None:
        launch = self._launches[name]
        port, metrics_port = launch.ports
        self.children[name] = self.processes.start(
            name, launch.module, launch.service, launch.args, port=port, metrics_port=metrics_port
        )

    def _wait_healthy(self, name: str) -> None:
        """Waits until `name` is healthy; one that lost a free port is started again on new ones."""
        for attempt in range(1, PORT_CLASH_ATTEMPTS + 1):
            try:
                self._healthy(name)
                return
            except _PortLost as lost:
                if attempt == PORT_CLASH_ATTEMPTS:
                    raise lost.exited from lost
                self._respawn(name)

    def _healthy(self, name: str) -> None:
        """Waits until `name` is healthy; raises `_PortLost` when it exited because a free port picked for
        it was taken meanwhile, ServiceExited when it exited otherwise."""
        child = self.children[name]
        try:
            child.wait_healthy(self.config.startup_timeout_s)
        except RuntimeError as exc:  # it exited while starting
            tail = child.log_tail()
            exited = ServiceExited(name, child.popen.returncode, tail)
            free = self.config.ports(name) == (0, 0)
            if free and any(marker in tail for marker in PORT_CLASH_MARKERS):
                raise _PortLost(exited) from exc
            raise exited from exc

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

    def start_ranker(self, name: str) -> Endpoint:
        """Starts a spare ranker (a declared member never started: a scale-out) on the ports every member
        list gives it, and waits until it is healthy. Its ports were free when the fleet started; should
        another process have taken one since, it fails (ServiceExited): the members know no other."""
        if name not in self.member_names or name in self.children:
            raise ValueError(f"{name} is not a spare ranker that was never started")
        self._spawn(name, "services.ranker", RANKER_SERVICE, self._ranker_args(name))
        try:
            self._healthy(name)
        except _PortLost as lost:
            raise lost.exited from lost
        return self.endpoints()[name]

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
