"""The tls component (deploy/components/tls) as rendered in overlays/cpu-tls and composed with every overlay:
cert-manager objects that cert-manager would accept, certificates whose DNS names cover every name a peer
dials (checked by RFC 6125 matching against the addresses the services' own config loaders parse), Secrets
mounted read-only where the services' TLS settings point, probes on the plaintext health port, /metrics
reachable by Prometheus only, and the platform-issuer patch deploy/README.md documents.

kubernetes-validate has no schemas for cert-manager's kinds, so the tests check their fields against the
cert-manager.io/v1 API themselves.
"""

from __future__ import annotations

import re

import pytest
import yaml

from tests.deploy.compose import composed
from tests.deploy.configs import loaded_configs
from tests.deploy.manifests import DEPLOY, NAMESPACE, OVERLAYS, named, objects, of_kind, render, workloads
from tests.deploy.network_policy import Pod, allowed
from tests.deploy.pods import container_ports, containers, environment, pod_labels, pod_spec, selects
from tests.deploy.validate import unvalidated_kinds

TREE = "overlays/cpu-tls"
FLEET = ("ranker", "router", "trigger", "retrieval-stub")
MOUNT = "/etc/relaygr/tls"
# The keys cert-manager writes into a certificate's Secret, and the setting that reads each.
SECRET_FILES = {"RELAYGR_TLS_CERT": "tls.crt", "RELAYGR_TLS_KEY": "tls.key", "RELAYGR_TLS_CA": "ca.crt"}
DOMAIN = "cluster.local"
PROMETHEUS = Pod("prometheus-0", "monitoring", {"app.kubernetes.io/name": "prometheus"})
NEIGHBOUR = Pod("neighbour", NAMESPACE, {"app.kubernetes.io/name": "neighbour"})

# cert-manager.io/v1 (its API reference): the fields a Certificate, its privateKey and issuerRef may have,
# the key usages it knows, and the issuer types an Issuer names exactly one of.
CERTIFICATE_FIELDS = {
    "additionalOutputFormats", "commonName", "dnsNames", "duration", "emailAddresses",
    "encodeUsagesInRequest", "ipAddresses", "isCA", "issuerRef", "keystores", "literalSubject",
    "nameConstraints", "otherNames", "privateKey", "renewBefore", "renewBeforePercentage",
    "revisionHistoryLimit", "secretName", "secretTemplate", "subject", "uris", "usages",
}  # fmt: skip
PRIVATE_KEY_FIELDS = {"algorithm", "encoding", "rotationPolicy", "size"}
ISSUER_REF_FIELDS = {"name", "kind", "group"}
KEY_USAGES = {
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
    "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any", "server auth",
    "client auth", "code signing", "email protection", "s/mime", "ipsec end system", "ipsec tunnel",
    "ipsec user", "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc",
}  # fmt: skip
KEY_SIZES = {"RSA": {2048, 4096, 8192}, "ECDSA": {256, 384, 521}}
ISSUER_TYPES = {"acme", "ca", "vault", "selfSigned", "venafi"}
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def go_duration_s(text: str) -> float:
    """A Go time.Duration string ("2160h", "1h30m") in seconds; cert-manager accepts no other form."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|ns|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a Go duration: {text!r}"
    return sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)


def san_matches(san: str, host: str) -> bool:
    """RFC 6125 §6.4.3 as TLS libraries apply it: case-insensitive, and a wildcard only as the whole
    leftmost label, standing for exactly one label."""
    san, host = san.lower().rstrip("."), host.lower().rstrip(".")
    if san.startswith("*."):
        first, _, rest = host.partition(".")
        return bool(first) and rest == san[2:]
    return san == host


def name_forms(service: str) -> list[str]:
    """A Service's DNS names, short to fully qualified: each resolves through a pod's search path."""
    labels = [service, NAMESPACE, "svc", DOMAIN]
    return [".".join(labels[:count]) for count in range(1, len(labels) + 1)]


def certificates(manifests) -> dict[str, dict]:
    """Certificates by the Secret they write."""
    return {c["spec"]["secretName"]: c for c in of_kind(manifests, "Certificate")}


def tls_volume(workload: dict) -> dict:
    (volume,) = [v for v in pod_spec(workload).get("volumes", []) if v["name"] == "tls"]
    return volume


def certificate_of(manifests, workload: dict) -> dict:
    """The certificate a workload serves with: the one writing the Secret its pods mount."""
    return certificates(manifests)[tls_volume(workload)["secret"]["secretName"]]


def serving_workload(manifests, host: str) -> dict:
    """The workload whose pods answer a DNS name: a Service's (`svc[.ns[.svc[.domain]]]`), or a
    StatefulSet pod's under its governing headless Service (`pod.svc.ns.svc.domain`)."""
    labels = host.split(".")
    services = {s["metadata"]["name"]: s for s in of_kind(manifests, "Service")}
    if labels[0] in services:
        service = services[labels[0]]
        forms = ([], [NAMESPACE], [NAMESPACE, "svc"], [NAMESPACE, "svc", *DOMAIN.split(".")])
        assert labels[1:] in forms, host
        selector = {"matchLabels": service["spec"]["selector"]}
        (workload,) = [w for w in workloads(manifests) if selects(selector, pod_labels(w))]
        return workload
    pod, governing = labels[0], labels[1]
    (stateful_set,) = [
        s
        for s in of_kind(manifests, "StatefulSet")
        if s["spec"]["serviceName"] == governing and re.fullmatch(rf"{s['metadata']['name']}-\d+", pod)
    ]
    assert int(pod.rpartition("-")[2]) < stateful_set["spec"]["replicas"], host
    assert labels[2:] == [NAMESPACE, "svc", *DOMAIN.split(".")], host
    return stateful_set


def dns_target_host(target: str) -> str:
    """The host of a gRPC target: `dns:///host:port` (or `dns://authority/host:port`) or `host:port`."""
    match = re.fullmatch(r"(?:dns://[^/]*/)?([^:/]+):(\d+)", target)
    assert match, f"not a host:port gRPC target: {target!r}"
    return match.group(1)


def dialled_names(tree_overlay: str) -> dict[str, set[str]]:
    """{caller: the DNS names it dials}, from the settings each service's own config loader parses out of
    the rendered environment. A service that routes to the rankers (the router; the trigger and the
    retrieval stub directly) dials each ranker the SRV record lists by its target name, which for a
    StatefulSet's pod is `<pod>.<governing service>.<namespace>.svc.<domain>`; one that does not dials
    its `router` target."""
    manifests = objects(f"overlays/{tree_overlay}")
    configs = loaded_configs(tree_overlay)
    ranker = named(manifests, "StatefulSet", "ranker")

    def rankers(name: str) -> set[str]:
        config = configs[name]
        if not config.routes_directly:
            return {dns_target_host(config.router)}
        srv = config.srv_name()
        prefix = "_grpc._tcp."
        assert srv.startswith(prefix), srv
        domain = srv.removeprefix(prefix)
        assert domain == f"{ranker['spec']['serviceName']}.{NAMESPACE}.svc.{DOMAIN}"
        return {f"ranker-{i}.{domain}" for i in range(ranker["spec"]["replicas"])}

    return {
        "router": rankers("router"),
        "trigger": rankers("trigger"),
        "retrieval-stub": {*rankers("retrieval-stub"), dns_target_host(configs["retrieval-stub"].trigger)},
    }


def test_san_matching_follows_rfc_6125():
    wildcard = "*.ranker-headless.relaygr.svc.cluster.local"
    assert san_matches(wildcard, "ranker-2.ranker-headless.relaygr.svc.cluster.local")
    assert san_matches("router.relaygr.svc", "Router.relaygr.svc.")
    assert not san_matches(wildcard, "ranker-headless.relaygr.svc.cluster.local")
    assert not san_matches(wildcard, "a.ranker-0.ranker-headless.relaygr.svc.cluster.local")
    assert not san_matches("router.relaygr.svc", "router.relaygr.svc.cluster.local")


def test_tls_overlay_passes_strict_validation_and_adds_only_cert_manager_kinds(tmp_path):
    assert unvalidated_kinds(render(TREE), tmp_path) == {
        "PodMonitor",
        "PrometheusRule",
        "Certificate",
        "Issuer",
    }
    plain = {(m["kind"], m["metadata"]["name"]) for m in objects("overlays/cpu")}
    added = {(m["kind"], m["metadata"]["name"]) for m in objects(TREE)} - plain
    # The ConfigMaps come back under new hashes: the TLS settings are part of their content.
    assert {(kind, name) for kind, name in added if kind != "ConfigMap"} == {
        ("Issuer", "relaygr-selfsigned"),
        ("Certificate", "relaygr-ca"),
        ("Issuer", "relaygr-ca"),
        *(("Certificate", f"{service}-tls") for service in FLEET),
    }


def test_cert_manager_objects_use_only_fields_of_the_v1_api():
    manifests = objects(TREE)
    for certificate in of_kind(manifests, "Certificate"):
        name, spec = certificate["metadata"]["name"], certificate["spec"]
        assert certificate["apiVersion"] == "cert-manager.io/v1", name
        assert certificate["metadata"]["namespace"] == NAMESPACE, name
        assert spec.keys() <= CERTIFICATE_FIELDS and spec["secretName"], name
        assert spec["issuerRef"].keys() <= ISSUER_REF_FIELDS and spec["issuerRef"]["name"], name
        key = spec["privateKey"]
        assert key.keys() <= PRIVATE_KEY_FIELDS and key["size"] in KEY_SIZES[key["algorithm"]], name
        assert key["rotationPolicy"] in {"Always", "Never"}, name
        assert set(spec.get("usages", [])) <= KEY_USAGES, name
        # cert-manager's limits: duration at least 1 h, renewBefore at least 5 min and below duration.
        duration, renew = go_duration_s(spec["duration"]), go_duration_s(spec["renewBefore"])
        assert duration >= 3600 and 300 <= renew < duration, name
        assert spec.get("dnsNames") or spec.get("commonName"), name
    for issuer in of_kind(manifests, "Issuer"):
        assert issuer["apiVersion"] == "cert-manager.io/v1"
        assert issuer["metadata"]["namespace"] == NAMESPACE
        assert len(issuer["spec"].keys() & ISSUER_TYPES) == len(issuer["spec"]) == 1, issuer["spec"]


def test_service_certificates_chain_to_one_bootstrapped_ca():
    manifests = objects(TREE)
    by_secret = certificates(manifests)
    issuers = {i["metadata"]["name"]: i["spec"] for i in of_kind(manifests, "Issuer")}
    service_issuers = set()
    for service in FLEET:
        ref = by_secret[f"{service}-tls"]["spec"]["issuerRef"]
        assert ref.get("kind", "Issuer") == "Issuer", service
        assert ref.get("group", "cert-manager.io") == "cert-manager.io", service
        service_issuers.add(ref["name"])
    # Every service's Secret gets the same ca.crt, so each trusts exactly the certificates of its peers.
    (ca_issuer,) = service_issuers
    ca = by_secret[issuers[ca_issuer]["ca"]["secretName"]]["spec"]
    assert ca["isCA"] is True and ca["subject"]["organizations"]
    # A renewed CA keeps its key: certificates it signed before still verify against the new ca.crt.
    assert ca["privateKey"]["rotationPolicy"] == "Never"
    assert issuers[ca["issuerRef"]["name"]] == {"selfSigned": {}}
    assert go_duration_s(ca["duration"]) > 10 * go_duration_s(by_secret["ranker-tls"]["spec"]["duration"])
    for service in FLEET:
        assert by_secret[f"{service}-tls"]["spec"].get("isCA", False) is False


def test_every_name_a_peer_dials_is_on_the_certificate_it_is_served_with():
    manifests = objects(TREE)
    dialled = dialled_names("cpu-tls")
    # Direct routing: the trigger and the stub dial each ranker by its pod name, as the router does, so
    # the ranker's certificate must answer to them and accept their certificates as clients.
    members = {f"ranker-{i}.ranker-headless.{NAMESPACE}.svc.{DOMAIN}" for i in range(3)}
    assert dialled == {
        "router": members,
        "trigger": members,
        "retrieval-stub": {*members, f"trigger-headless.{NAMESPACE}.svc.{DOMAIN}"},
    }
    for caller, hosts in dialled.items():
        client = certificate_of(manifests, named(manifests, "Deployment", caller))
        # Mutual TLS: a server with a CA requires the caller's certificate, presented as a client.
        assert "client auth" in client["spec"]["usages"], caller
        for host in hosts:
            server = certificate_of(manifests, serving_workload(manifests, host))
            assert "server auth" in server["spec"]["usages"], host
            assert any(san_matches(san, host) for san in server["spec"]["dnsNames"]), (caller, host)


def test_every_name_of_a_fleet_service_is_on_its_pods_certificate():
    """Port-forwards, ghz and in-cluster callers may use any form of a Service's name; so do SANs."""
    manifests = objects(TREE)
    for service in of_kind(manifests, "Service"):
        name = service["metadata"]["name"]
        workload = serving_workload(manifests, name)
        own = certificate_of(manifests, workload)
        for host in name_forms(name):
            assert any(san_matches(san, host) for san in own["spec"]["dnsNames"]), host
            # No other certificate answers to this service's names.
            for other in of_kind(manifests, "Certificate"):
                if other is not own:
                    others = other["spec"].get("dnsNames", [])
                    assert not any(san_matches(san, host) for san in others), (host, other["metadata"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_are_mounted_read_only_where_the_tls_settings_point(overlay):
    manifests = composed(f"overlays/{overlay}", "tls")
    by_secret = certificates(manifests)
    fleet = {w["metadata"]["name"]: w for w in workloads(manifests)}
    assert set(fleet) == set(FLEET)
    for name, workload in fleet.items():
        volume = tls_volume(workload)
        assert volume["secret"]["secretName"] == f"{name}-tls" and f"{name}-tls" in by_secret, name
        # 0440: readable by the pod's fsGroup, the only group the service runs in besides its own uid's.
        assert volume["secret"]["defaultMode"] == 0o440, name
        (container,) = containers(workload)
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tls"]
        # No subPath: the kubelet then refreshes the files when cert-manager renews the Secret.
        assert mount == {"name": "tls", "mountPath": MOUNT, "readOnly": True}, name
        env = environment(manifests, workload, container)
        assert {key: env[key] for key in SECRET_FILES} == {k: f"{MOUNT}/{f}" for k, f in SECRET_FILES.items()}


def test_every_service_runs_mutual_tls_with_probes_on_the_plaintext_health_port():
    manifests = objects(TREE)
    for name, config in loaded_configs("cpu-tls").items():
        workload = named(manifests, "StatefulSet" if name == "ranker" else "Deployment", name)
        (container,) = containers(workload)
        ports = container_ports(container)
        assert config.tls and config.tls_ca, f"{name}: a CA makes the server require client certificates"
        assert config.health_port == ports["health"] != config.port == ports["grpc"], name
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == ports["health"], (name, probe)


def test_metrics_stay_plain_http_that_only_prometheus_may_reach():
    manifests = objects(TREE)
    policies = of_kind(manifests, "NetworkPolicy")
    fleet = {w["metadata"]["name"]: w for w in workloads(manifests)}
    pods = {name: Pod(name, NAMESPACE, pod_labels(w)) for name, w in fleet.items()}
    (monitor,) = of_kind(manifests, "PodMonitor")
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert endpoint.get("scheme", "http") == "http" and "tlsConfig" not in endpoint
    for name, workload in fleet.items():
        metrics = container_ports(containers(workload)[0])["metrics"]
        assert allowed(policies, PROMETHEUS, pods[name], metrics), name
        for other in [*pods.values(), NEIGHBOUR]:
            assert not allowed(policies, other, pods[name], metrics), (other.name, name)


def test_no_pod_reaches_the_plaintext_health_port():
    """The kubelet probes from the node, which NetworkPolicies always admit; no pod gets a rule."""
    manifests = objects(TREE)
    policies = of_kind(manifests, "NetworkPolicy")
    fleet = {w["metadata"]["name"]: w for w in workloads(manifests)}
    pods = {name: Pod(name, NAMESPACE, pod_labels(w)) for name, w in fleet.items()}
    for name, workload in fleet.items():
        health = container_ports(containers(workload)[0])["health"]
        for other in [*pods.values(), PROMETHEUS, NEIGHBOUR]:
            assert not allowed(policies, other, pods[name], health), (other.name, name)


def readme_issuer_patch() -> str:
    """The overlay patch deploy/README.md gives for issuing from the platform's own ClusterIssuer."""
    text = (DEPLOY / "README.md").read_text()
    section = text[text.index("## TLS") :]
    match = re.search(r"```yaml\n(patches:\n.*?)```", section, re.DOTALL)
    assert match, "deploy/README.md's TLS section shows the ClusterIssuer patch as a ```yaml block"
    return yaml.safe_dump(yaml.safe_load(match.group(1))["patches"])


def test_the_documented_patch_moves_every_service_certificate_to_a_cluster_issuer():
    manifests = composed(TREE, patches=readme_issuer_patch())
    by_secret = certificates(manifests)
    for service in FLEET:
        ref = by_secret[f"{service}-tls"]["spec"]["issuerRef"]
        assert ref["kind"] == "ClusterIssuer" and ref["name"] != "relaygr-ca", ref
    # The bootstrap CA is left alone (and unused), so the patch touches only the service certificates.
    assert by_secret["relaygr-ca"]["spec"]["issuerRef"]["name"] == "relaygr-selfsigned"
