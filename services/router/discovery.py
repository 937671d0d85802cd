"""Where the router's members come from: a fixed list, or DNS for a Kubernetes headless service.

From `--rankers name=host:port,...` the names are given. From DNS, the service name resolves to one A/AAAA
record per ready pod, and the PTR record of each pod IP is the pod's DNS name, whose first label is the pod
name (`ranker-0`). An IP without a PTR record is skipped with a warning: naming a member by its IP would
move its arc whenever the pod restarts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DnsRecord:
    """One address of a discovered service and the name its PTR record gives it."""

    ip: str
    hostname: str


# Blocking: host -> its records. Injectable so that tests can serve a fixed record set.
DnsLookup = Callable[[str], list[DnsRecord]]

# Async: the current members as {name: host:port}.
Discovery = Callable[[], Awaitable[dict[str, str]]]


def system_dns_lookup(host: str) -> list[DnsRecord]:
    """A and AAAA records of `host` (getaddrinfo), each named by the PTR record of its IP."""
    ips = sorted({info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)})
    records = []
    for ip in ips:
        try:
            hostname = socket.gethostbyaddr(ip)[0]
        except OSError as exc:
            log.warning("skipping %s of %s: no PTR record names it (%s)", ip, host, exc)
            continue
        records.append(DnsRecord(ip, hostname))
    return records


def members_from_records(records: list[DnsRecord], port: int) -> dict[str, str]:
    """{pod name: ip:port}, the pod name being the first label of the PTR name; duplicates resolve alike."""
    members: dict[str, str] = {}
    for record in sorted(records, key=lambda r: (r.hostname, r.ip)):
        name = record.hostname.split(".", 1)[0]
        if name in members:
            log.warning("%s also names %s; keeping %s", record.hostname, record.ip, members[name])
            continue
        host = f"[{record.ip}]" if ipaddress.ip_address(record.ip).version == 6 else record.ip
        members[name] = f"{host}:{port}"
    return members


def static_discovery(members: Mapping[str, str]) -> Discovery:
    fixed = dict(members)

    async def discover() -> dict[str, str]:
        return dict(fixed)

    return discover


def dns_discovery(host: str, port: int, lookup: DnsLookup = system_dns_lookup) -> Discovery:
    async def discover() -> dict[str, str]:
        records = await asyncio.get_running_loop().run_in_executor(None, lookup, host)
        return members_from_records(records, port)

    return discover
