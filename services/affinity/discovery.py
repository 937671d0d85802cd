"""Where the members come from: a fixed list, or the SRV records of a Kubernetes headless Service.

From `--rankers name=host:port,...` the names are given. From DNS, `--rankers-srv` names an SRV record
(`_grpc._tcp.ranker-headless.relaygr.svc.cluster.local`: the headless Service's port named `grpc`), which
Kubernetes answers with one record per ready pod of the StatefulSet: target
`ranker-0.ranker-headless.relaygr.svc.cluster.local.`, port 50051. Each target is a member, named by the
target's first label (the pod name, `ranker-0`, which is also the ranker's `--instance-name`) and dialled
by the target's DNS name, so the name is stable across pod restarts, TLS verifies a DNS SAN, and no reverse
zone is needed.

Lookups go through dnspython with the system resolver configuration (`/etc/resolv.conf`, read afresh for
each lookup; under `ip netns exec NS` that is `/etc/netns/NS/resolv.conf`). A name that does not exist
(NXDOMAIN) or has no SRV records means there are no members; any other failure (no server answered, a
SERVFAIL, a timeout) raises `DiscoveryFailed`, and the membership keeps the members it has.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping

import dns.exception
import dns.resolver

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SrvRecord:
    """One SRV record of the members' name: the target host name and the port to dial it on."""

    target: str
    port: int


class DiscoveryFailed(OSError):
    """The lookup got no usable answer: the members cannot be known this time (not: there are none)."""


# Blocking: SRV record name -> its records, or DiscoveryFailed. Injectable so that tests can serve records.
DnsLookup = Callable[[str], list[SrvRecord]]

# Async: the current members as {name: host:port}.
Discovery = Callable[[], Awaitable[dict[str, str]]]


def srv_lookup(name: str, resolver: dns.resolver.Resolver | None = None) -> list[SrvRecord]:
    """The SRV records of `name`, from `resolver` or one configured from the system's resolv.conf.

    The name is taken as absolute: the pod's search domains (and ndots) do not multiply the queries.
    """
    try:
        resolver = resolver or dns.resolver.Resolver()
        answer = resolver.resolve(name, "SRV", search=False)
    except dns.resolver.NXDOMAIN:
        log.warning("SRV %s does not exist (NXDOMAIN): no members", name)
        return []
    except dns.resolver.NoAnswer:
        log.warning("SRV %s has no records: no members", name)
        return []
    except dns.exception.DNSException as exc:
        raise DiscoveryFailed(f"SRV lookup of {name} failed: {exc}") from exc
    return [SrvRecord(record.target.to_text(), record.port) for record in answer]


def members_from_srv(records: list[SrvRecord]) -> dict[str, str]:
    """{first label of the target: target:port}; targets sharing a first label resolve alike (the first in
    sorted order wins), and the root target "." (RFC 2782: no service) is no member."""
    members: dict[str, str] = {}
    for record in sorted(records, key=lambda r: (r.target, r.port)):
        host = record.target.removesuffix(".")
        if not host:
            continue
        name = host.split(".", 1)[0]
        if name in members:
            log.warning("SRV target %s also names %s; keeping %s", record.target, name, members[name])
            continue
        members[name] = f"{host}:{record.port}"
    return members


def static_discovery(members: Mapping[str, str]) -> Discovery:
    fixed = dict(members)

    async def discover() -> dict[str, str]:
        return dict(fixed)

    return discover


def srv_discovery(name: str, lookup: DnsLookup = srv_lookup) -> Discovery:
    """Discovery from the SRV records of `name`; the blocking lookup runs in the loop's executor."""

    async def discover() -> dict[str, str]:
        records = await asyncio.get_running_loop().run_in_executor(None, lookup, name)
        return members_from_srv(records)

    return discover
