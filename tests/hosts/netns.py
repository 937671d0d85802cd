"""Separate test hosts inside one machine: Linux network namespaces on a private switch, with a DNS server.

`HostNetwork` makes, for one test run, a network namespace per host (`relaygr-<run>-<host>`, the run a
random suffix) and one more, the switch, holding a Linux bridge. Each host is plugged into the bridge by a
veth pair (`eth0` in the host, a port named after the host at the switch) and has one address on a /24 of
198.18.0.0/15, the range set aside for network tests (RFC 2544), picked so that no route or address of the
machine covers it. Nothing is added to the machine's own namespace: every packet stays on these
namespaces' links and loopbacks.

DNS as a cluster has it: `start_dns` runs dnsmasq in one host, answering on port 53 of that host's address
with the A and SRV records it is given (a headless Service's per-pod names and its named port) and with
NXDOMAIN for any other name of the zone; it forwards nothing. Every host's
`/etc/netns/<namespace>/resolv.conf` names that server, and `ip netns exec` mounts it over /etc/resolv.conf
for each process it starts there, as a pod's resolv.conf names the cluster DNS.

`cut(host)` takes the host's switch port down: its packets go nowhere and nobody is told (no reset, no
ICMP), as when a machine drops off the network; `mend(host)` plugs it in again.

`start_service` starts a service in a host like `services.launcher.procs` starts it locally (through
`services.launcher.child`, so it dies with the test; in its own process group; logging to a file), bound
to the host's address. `close()` (also on leaving the `with` block) stops every process it started, then
deletes the namespaces and their resolv.conf folders; `leftovers()` then lists anything that remained
(a process still running in a namespace, a namespace, a folder), for the test to assert there is none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from services.launcher.procs import REPO_ROOT, ServiceProcess

PREFIX = "relaygr-"
TEST_RANGE = ipaddress.ip_network("198.18.0.0/15")
NETNS_ETC = Path("/etc/netns")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Where each tool comes from, for the reason given when it is missing.
TOOLS = {"ip": "iproute2", "dnsmasq": "dnsmasq-base", "setpriv": "util-linux"}
STOP_GRACE_S = 10.0


class NetworkError(RuntimeError):
    """An `ip` command failed."""


def tool(name: str) -> str | None:
    """The path of a system tool, also where PATH lacks the sbin folders (a non-login root shell)."""
    return shutil.which(name) or shutil.which(name, path=SYSTEM_PATH)


def ip(*args: str) -> str:
    """Runs `ip ARGS...` and returns its output; NetworkError with its message when it fails."""
    done = subprocess.run([tool("ip") or "ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def unavailable() -> str | None:
    """What this machine lacks to make test hosts (a reason for a skip), or None when it has it all."""
    if not sys.platform.startswith("linux"):
        return f"Linux network namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return f"root, to make network namespaces (it runs as uid {os.geteuid()})"
    for name, package in TOOLS.items():
        if tool(name) is None:
            return f"`{name}` (Debian package {package}; `make system-tools` installs it)"
    probe = f"{PREFIX}probe-{secrets.token_hex(3)}"
    try:
        ip("netns", "add", probe)
        ip("-n", probe, "link", "add", "name", "br0", "type", "bridge")
        ip("-n", probe, "link", "add", "name", "va", "type", "veth", "peer", "name", "vb")
    except NetworkError as exc:
        return f"network namespaces, bridges and veth pairs, which this machine refuses ({exc})"
    finally:
        with contextlib.suppress(NetworkError):
            ip("netns", "delete", probe)
    return None


def machine_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks the machine's own namespace routes or has addresses in."""
    routes = json.loads(ip("-j", "-4", "route", "show", "table", "all") or "[]")
    addresses = json.loads(ip("-j", "-4", "address", "show") or "[]")
    networks = [
        ipaddress.ip_network(r["dst"], strict=False) for r in routes if r.get("dst", "default") != "default"
    ]
    for link in addresses:
        for entry in link.get("addr_info", []):
            networks.append(ipaddress.ip_network(f"{entry['local']}/{entry['prefixlen']}", strict=False))
    return networks


def free_subnet(rng: random.Random) -> ipaddress.IPv4Network:
    """A random /24 of the test range that overlaps nothing the machine routes."""
    taken = machine_networks()
    candidates = list(TEST_RANGE.subnets(new_prefix=24))
    rng.shuffle(candidates)
    for subnet in candidates:
        if not any(subnet.overlaps(network) for network in taken):
            return subnet
    raise NetworkError(f"every /24 of {TEST_RANGE} overlaps a route of this machine")


@dataclasses.dataclass(frozen=True)
class Host:
    """One test host: its namespace, its address, and its port at the switch."""

    name: str
    netns: str
    address: str

    @property
    def switch_port(self) -> str:
        return self.name

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside this host."""
        return [tool("ip") or "ip", "netns", "exec", self.netns, *argv]


@dataclasses.dataclass(frozen=True)
class HostedService:
    """A service process running in a test host."""

    host: Host
    process: ServiceProcess

    @property
    def name(self) -> str:
        return self.process.name

    @property
    def address(self) -> str:
        """Where it serves gRPC, as seen from any test host."""
        return f"{self.host.address}:{self.process.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host.address}:{self.process.metrics_port}/metrics"


class HostNetwork:
    """Test hosts on one switch, made on entry and removed on exit (see the module docstring)."""

    def __init__(self, hosts: Sequence[str], log_dir: Path, seed: int | None = None) -> None:
        self.run = secrets.token_hex(3)
        self.log_dir = log_dir
        self._rng = random.Random(seed)
        self.switch = f"{PREFIX}{self.run}-switch"
        self.subnet: ipaddress.IPv4Network | None = None
        self._names = list(hosts)
        self.hosts: dict[str, Host] = {}
        self.dns: Host | None = None
        self.services: list[HostedService] = []
        self._others: list[subprocess.Popen] = []  # DNS server, clients
        self._made: list[str] = []  # namespaces in creation order
        self._stray: dict[str, list[int]] = {}  # processes found in a namespace after everything stopped
        self._made_etc = False  # /etc/netns was made here, and goes when empty

    # ---- making and removing the network ----

    def __enter__(self) -> HostNetwork:
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _make(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.subnet = free_subnet(self._rng)
        self._add_namespace(self.switch)
        ip("-n", self.switch, "link", "add", "name", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        for index, name in enumerate(self._names):
            host = Host(name, f"{PREFIX}{self.run}-{name}", str(self.subnet[10 + index]))
            self._add_namespace(host.netns)
            ip("-n", self.switch, "link", "add", "name", host.switch_port, "type", "veth",
               "peer", "name", "eth0", "netns", host.netns)  # fmt: skip
            ip("-n", self.switch, "link", "set", host.switch_port, "master", "br0", "up")
            ip("-n", host.netns, "address", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
            ip("-n", host.netns, "link", "set", "eth0", "up")
            self.hosts[name] = host

    def _add_namespace(self, netns: str) -> None:
        ip("netns", "add", netns)
        self._made.append(netns)
        ip("-n", netns, "link", "set", "lo", "up")

    def close(self) -> None:
        """Stops every process started here, then removes the namespaces and their /etc/netns folders."""
        for service in reversed(self.services):
            service.process.stop(grace=STOP_GRACE_S)
        for popen in reversed(self._others):
            _stop(popen)
        for netns in reversed(self._made):
            stray = self._pids(netns)
            if stray:  # reported by leftovers(); killed so that the namespace really goes
                self._stray[netns] = stray
                for pid in stray:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(NetworkError):
                ip("netns", "delete", netns)
            shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)
        self._made.clear()
        if self._made_etc:
            with contextlib.suppress(OSError):  # another run's folders are still in it
                NETNS_ETC.rmdir()

    def _pids(self, netns: str) -> list[int]:
        try:
            return [int(pid) for pid in ip("netns", "pids", netns).split()]
        except NetworkError:
            return []

    def leftovers(self) -> list[str]:
        """What close() left or had to kill: [] after a clean run."""
        found = [f"process {pid} still ran in {netns}" for netns, pids in self._stray.items() for pid in pids]
        found += [f"{child.name} (pid {child.process.popen.pid}) did not exit" for child in self.services
                  if child.process.alive()]  # fmt: skip
        found += [f"pid {popen.pid} did not exit" for popen in self._others if popen.poll() is None]
        ours = f"{PREFIX}{self.run}-"
        found += [f"namespace {line.split()[0]}" for line in ip("netns", "list").splitlines()
                  if line.startswith(ours)]  # fmt: skip
        if NETNS_ETC.is_dir():
            found += [f"folder {path}" for path in NETNS_ETC.iterdir() if path.name.startswith(ours)]
        return found

    # ---- the network's state ----

    def cut(self, name: str) -> None:
        """Unplugs a host: its switch port goes down, and its packets with it, without a word to anyone."""
        ip("-n", self.switch, "link", "set", self.hosts[name].switch_port, "down")

    def mend(self, name: str) -> None:
        """Plugs a cut host in again."""
        ip("-n", self.switch, "link", "set", self.hosts[name].switch_port, "up")

    # ---- DNS ----

    def start_dns(
        self,
        name: str,
        search: Sequence[str],
        a_records: Mapping[str, Sequence[str]],
        srv_records: Mapping[str, Sequence[tuple[str, int]]],
    ) -> Host:
        """Runs the DNS server in host `name` and names it in every host's resolv.conf, with the search
        domains `search` (a pod's: its namespace's zone first, the cluster domain last).

        It answers A records {name: [address, ...]} and SRV records {name: [(target, port), ...]}
        (priority 0, equal weights, as a cluster's DNS lists a headless Service's endpoints), and NXDOMAIN
        for any other name of the cluster domain, so that a resolver walking the search list goes on to
        the next domain as it does in a cluster."""
        host = self.hosts[name]
        records = [f"--host-record={record},{address}" for record, addresses in a_records.items()
                   for address in addresses]  # fmt: skip
        for record, targets in srv_records.items():
            weight = 100 // max(1, len(targets))
            records += [f"--srv-host={record},{target},{port},0,{weight}" for target, port in targets]
        command = [
            # Dies with the test even when the test is killed: dnsmasq stays root (user and group), since a
            # change of credentials would clear the parent-death signal.
            tool("setpriv"), "--pdeathsig", "TERM", "--",
            tool("dnsmasq"), "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
            "--bind-interfaces", f"--listen-address={host.address}", "--port=53",
            "--user=root", "--group=root", f"--pid-file={self.log_dir / 'dnsmasq.pid'}",
            "--log-facility=-", "--log-queries",
            f"--local=/{search[-1]}/", *records,
        ]  # fmt: skip
        self._others.append(self.start(name, command, self.log_dir / "dnsmasq.log"))
        self._made_etc = self._made_etc or not NETNS_ETC.exists()
        for other in self.hosts.values():
            folder = NETNS_ETC / other.netns
            folder.mkdir(parents=True, exist_ok=True)
            resolv = f"nameserver {host.address}\nsearch {' '.join(search)}\noptions ndots:5\n"
            (folder / "resolv.conf").write_text(resolv)
        self.dns = host
        return host

    def dns_log(self) -> str:
        path = self.log_dir / "dnsmasq.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # ---- processes ----

    def start(self, name: str, argv: Sequence[str], log_path: Path, pipes: bool = False) -> subprocess.Popen:
        """Runs `argv` in host `name` from the repository root, in its own process group, logging to
        `log_path` (with `pipes`, stdin and stdout are pipes to the caller). The caller stops it, or
        close() does."""
        with log_path.open("ab") as log:
            popen = subprocess.Popen(
                self.hosts[name].command(argv),
                cwd=REPO_ROOT,
                stdin=subprocess.PIPE if pipes else subprocess.DEVNULL,
                stdout=subprocess.PIPE if pipes else log,
                stderr=log,
                start_new_session=True,
            )
        return popen

    def start_client(self, name: str, module: str, log_name: str) -> subprocess.Popen:
        """Runs Python module `module` in host `name`, dying with the test, stdin and stdout piped."""
        argv = [sys.executable, "-m", "services.launcher.child", str(os.getpid()), module]
        popen = self.start(name, argv, self.log_dir / f"{log_name}.log", pipes=True)
        self._others.append(popen)
        return popen

    def start_service(
        self,
        name: str,
        service_name: str,
        module: str,
        health_service: str,
        port: int,
        metrics_port: int,
        args: Sequence[str] = (),
    ) -> HostedService:
        """Starts `python -m module` as `service_name` in host `name`, bound to the host's address on the
        given ports (each host has ports of its own, so they are fixed, as a pod's are)."""
        host = self.hosts[name]
        log_path = self.log_dir / f"{service_name}.log"
        argv = [
            sys.executable, "-m", "services.launcher.child", str(os.getpid()), module,
            "--host", host.address, "--port", str(port), "--metrics-port", str(metrics_port), *args,
        ]  # fmt: skip
        popen = self.start(name, argv, log_path)
        process = ServiceProcess(service_name, module, health_service, port, metrics_port, popen, log_path)
        service = HostedService(host, process)
        self.services.append(service)
        return service


def _stop(popen: subprocess.Popen, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM to the process group, SIGKILL after `grace`."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(wait)
