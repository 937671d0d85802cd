"""Settings of affinity routing, shared by every service that routes to the rankers.

The router declares them (it routes for its clients); the trigger and the retrieval stub declare them too,
and route their own PreInfer and Rank calls with them when `--rankers` or `--rankers-srv` is given (direct
routing: the router's policy in process, one gRPC hop less each way). Every process that routes for one
fleet must agree on the ring (`--virtual-nodes`) and the member names, so a user lands on the same ranker
whoever placed it; the relay hint keeps a Rank with its PreInfer's ranker either way. A ranker declares them
as well: it knows the same ring, to hand its prefixes to their next owners and to read misses through from
them (`services.ranker.handoff`).
"""

from __future__ import annotations

import dataclasses
import re

from services.affinity.ring import LOAD_FACTOR, LOAD_FLOOR, VIRTUAL_NODES
from services.common.config import setting, split_host_port

ROUTING_POLICIES = ("affinity", "random")

# One label of a DNS name as SRV record names use them: letters, digits, hyphens, and the leading
# underscore of `_grpc._tcp`; at most 63 characters.
_DNS_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?")


@dataclasses.dataclass(frozen=True)
class AffinitySettings:
    rankers: str = setting(
        "",
        "the rankers as name=host:port,... (each name that ranker's --instance-name), for direct routing "
        "instead of through --router and for the cache handoff",
    )
    rankers_srv: str = setting(
        "",
        "SRV record name listing the rankers, overriding --rankers: each target is a member named by its "
        "first label (in Kubernetes, the pod's name)",
    )
    dns_refresh_s: float = setting(10.0, "seconds between DNS re-resolutions of --rankers-srv", above=0)
    virtual_nodes: int = setting(
        VIRTUAL_NODES,
        "points per member on the hash ring (the same in every process routing to one fleet)",
        above=0,
    )
    load_factor: float = setting(
        LOAD_FACTOR,
        "bounded load: a member with in-flight >= ceil(factor * (total + 1) / members) spills clockwise "
        "(each routing process counts its own calls in flight)",
    )
    load_floor: int = setting(
        LOAD_FLOOR,
        "a member with fewer requests in flight than this never spills (0: pure bound)",
        minimum=0,
    )
    routing_policy: str = setting(
        "affinity",
        "affinity (relay hint, then the bounded-load ring), or random: uniform over healthy members, "
        "ignoring hints and the ring (an ablation: relay without affinity)",
        choices=ROUTING_POLICIES,
    )
    health_interval_s: float = setting(1.0, "seconds between gRPC health checks of each member", above=0)
    health_timeouts: int = setting(
        3,
        "consecutive health checks without an answer in time that make a member unhealthy (a busy ranker "
        "answers late; NOT_SERVING or a refused connection counts at once)",
        above=0,
    )
    circuit_failures: int = setting(3, "consecutive failed calls that open a member's circuit", above=0)
    circuit_open_s: float = setting(5.0, "seconds an open circuit keeps a member off the ring", above=0)

    @property
    def routes_directly(self) -> bool:
        """Whether this process routes to the rankers itself (it was given them)."""
        return bool(self.rankers_srv or self.rankers)

    def validate_affinity(self) -> None:
        """Checks the members and the bound (the declared bounds are `check()`'s)."""
        if self.load_factor < 1.0:
            raise ValueError("--load-factor must be at least 1.0 (below 1 no member may be under the bound)")
        if self.rankers_srv:
            self.srv_name()
        elif self.rankers:
            self.static_members()

    def static_members(self) -> dict[str, str]:
        """`--rankers` as {member name: host:port}."""
        members: dict[str, str] = {}
        for entry in filter(None, (part.strip() for part in self.rankers.split(","))):
            name, sep, address = entry.partition("=")
            name, address = name.strip(), address.strip()
            if not sep or not name or not address:
                raise ValueError(f"--rankers: {entry!r} is not name=host:port")
            if name in members:
                raise ValueError(f"--rankers: member name {name!r} appears twice")
            split_host_port(address, "--rankers")
            members[name] = address
        if not members:
            raise ValueError("--rankers lists no member")
        return members

    def srv_name(self) -> str:
        """`--rankers-srv`, checked to be a DNS name (without the port an SRV record carries itself)."""
        name = self.rankers_srv.strip().removesuffix(".")
        labels = name.split(".")
        if len(name) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
            raise ValueError(
                f"--rankers-srv: {self.rankers_srv!r} is no DNS name; give the SRV record name, such as "
                "_grpc._tcp.ranker-headless.relaygr.svc.cluster.local (its records carry the port)"
            )
        return name
