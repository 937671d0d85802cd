"""Which pod may open a connection to which pod and port, as Kubernetes NetworkPolicies decide it.

The semantics of networking.k8s.io/v1: a pod selected by no policy of a direction is open in that
direction; a pod selected by some is closed but for the union of their rules. A connection needs both
the source's egress and the destination's ingress to allow it. Peers are pod and namespace selectors
(IP blocks and named ports are not modelled; a policy that uses them fails the evaluation).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from tests.deploy.manifests import Manifest
from tests.deploy.pods import selects

# Every process that routes to the rankers (PreInfer, GetProfile, Rank and its gRPC health checks of each
# ranker) reaches them on 50051: the trigger and the retrieval stub directly, the router for its callers;
# and the rankers reach each other there for the cache handoff (Push, Fetch, and the ring's health checks).
FLEET_PATHS = {
    ("retrieval-stub", "trigger", 50052),
    ("retrieval-stub", "ranker", 50051),
    ("trigger", "ranker", 50051),
    ("router", "ranker", 50051),
    ("ranker", "ranker", 50051),
}


@dataclasses.dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    labels: Mapping[str, str]

    @property
    def namespace_labels(self) -> Mapping[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace}


def _policy_types(spec: Mapping[str, Any]) -> list[str]:
    if "policyTypes" in spec:
        return spec["policyTypes"]
    return ["Ingress", "Egress"] if "egress" in spec else ["Ingress"]


def _peer_matches(peer: Mapping[str, Any], pod: Pod, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        raise NotImplementedError("ipBlock peers are not modelled")
    if "namespaceSelector" in peer:
        in_namespace = selects(peer["namespaceSelector"], pod.namespace_labels)
    else:
        in_namespace = pod.namespace == policy_namespace
    return in_namespace and selects(peer.get("podSelector", {}), pod.labels)


def _port_matches(ports: list[Mapping[str, Any]] | None, port: int, protocol: str) -> bool:
    if not ports:
        return True
    for entry in ports:
        if not isinstance(entry.get("port", 0), int):
            raise NotImplementedError("named ports are not modelled")
        if entry.get("protocol", "TCP") != protocol:
            continue
        low = entry.get("port")
        if low is None or low <= port <= entry.get("endPort", low):
            return True
    return False


def _allows(
    policies: Iterable[Manifest], direction: str, subject: Pod, peer: Pod, port: int, protocol: str
) -> bool:
    rules_key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    isolated = False
    for policy in policies:
        namespace, spec = policy["metadata"]["namespace"], policy["spec"]
        if namespace != subject.namespace or direction not in _policy_types(spec):
            continue
        if not selects(spec["podSelector"], subject.labels):
            continue
        isolated = True
        for rule in spec.get(rules_key) or []:
            peers = rule.get(peers_key)
            peer_ok = not peers or any(_peer_matches(p, peer, namespace) for p in peers)
            if peer_ok and _port_matches(rule.get("ports"), port, protocol):
                return True
    return not isolated


def allowed(
    policies: list[Manifest], source: Pod, destination: Pod, port: int, protocol: str = "TCP"
) -> bool:
    """Whether `source` may connect to `destination` on `port`."""
    return _allows(policies, "Egress", source, destination, port, protocol) and _allows(
        policies, "Ingress", destination, source, port, protocol
    )


def open_paths(policies: list[dict], pods: dict[str, Pod], ports: dict[str, dict[str, int]]) -> set:
    """(source, destination, port) for every pair of fleet pods (two pods of one workload too) and every
    port the destination exposes that the policies let the source connect to."""
    return {
        (source, destination, port)
        for source, destination in itertools.product(pods, repeat=2)
        for port in ports[destination].values()
        if allowed(policies, pods[source], pods[destination], port)
    }
