"""TLS and mutual TLS on every gRPC server and channel, with certificates the tests make.

A ranker alone shows what a TLS server refuses (plaintext, a client that does not trust it, and under
mutual TLS a client without a certificate from the fleet's CA). A whole fleet on mutual TLS — rankers,
router, trigger, retrieval stub, started and health-checked by the launcher's `Fleet` — shows every
channel between them (router to rankers and their health checks, trigger to router, stub to router and
trigger) and the launcher's own health checks and demo traffic working over it, with no key material in
any service's log. Plaintext stays the default: every other test runs the fleet without certificates.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from relaygr.v1 import common_pb2, ranker_pb2, ranker_pb2_grpc, recommend_pb2, recommend_pb2_grpc
from services.common.config import ServiceConfig, load
from services.common.contract import RANKER_SERVICE
from services.launcher.demo import DemoProgress, LauncherConfig, drive_demo
from services.launcher.fleet import ROUTER, STUB, TRIGGER, Fleet
from services.launcher.procs import Processes, ServiceProcess
from services.ranker.config import RankerConfig
from services.retrieval_stub.config import RetrievalStubConfig
from services.router.config import RouterConfig
from services.trigger.config import TriggerConfig
from tests.reliability.harness import RANKER_ARGS, ROUTER_ARGS, STUB_ARGS, TRIGGER_ARGS, fleet_config
from tests.security.certs import Authority, Leaf

TINY_RANKER = ["--model-preset", "cpu-tiny", "--profile-lengths", "32", "--profile-repeats", "1"]
REFUSED = grpc.StatusCode.UNAVAILABLE  # a failed handshake: the call never reaches the service


@dataclasses.dataclass(frozen=True)
class Pki:
    fleet: Leaf  # what the services serve and dial with
    client: Leaf  # a client the fleet's CA signed
    stranger: Leaf  # signed by another CA, trusting that one


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    fleet_ca, other_ca = Authority(folder, "fleet"), Authority(folder, "other")
    return Pki(fleet_ca.issue("relaygr"), fleet_ca.issue("client"), other_ca.issue("stranger"))


def credentials(leaf: Leaf, with_certificate: bool = True) -> grpc.ChannelCredentials:
    cert, key, ca = leaf.read()
    if not with_certificate:
        return grpc.ssl_channel_credentials(root_certificates=ca)
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def status_of(call, address: str, creds: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    """The status of `call(channel)`, over TLS with `creds` or in plaintext without."""
    channel = grpc.secure_channel(address, creds) if creds else grpc.insecure_channel(address)
    with channel:
        try:
            call(channel)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def profile_call(address: str, creds: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    get_profile = lambda channel: ranker_pb2_grpc.RankerServiceStub(channel).GetProfile(  # noqa: E731
        ranker_pb2.GetProfileRequest(), timeout=5
    )
    return status_of(get_profile, address, creds)


def health_call(address: str, creds: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    check = lambda channel: health_pb2_grpc.HealthStub(channel).Check(  # noqa: E731
        health_pb2.HealthCheckRequest(), timeout=5
    )
    return status_of(check, address, creds)


def tls_ranker(procs: Processes, leaf: Leaf, mutual: bool) -> ServiceProcess:
    args = [
        "--instance-name",
        "ranker-tls",
        *TINY_RANKER,
        "--tls-cert",
        str(leaf.cert),
        "--tls-key",
        str(leaf.key),
    ]
    if mutual:
        args += ["--tls-ca", str(leaf.ca)]
    ranker = procs.start("ranker-tls", "services.ranker", RANKER_SERVICE, args)
    ranker.wait_healthy(120)  # checked over TLS: the Processes carry client credentials
    return ranker


def test_plaintext_is_the_default_of_every_service() -> None:
    for config_class in (RankerConfig, RouterConfig, TriggerConfig, RetrievalStubConfig):
        assert not load(config_class, []).tls, config_class.__name__
    assert not ServiceConfig().tls


def test_a_tls_server_refuses_plaintext_and_clients_that_do_not_trust_it(pki: Pki, tmp_path: Path) -> None:
    with Processes(log_dir=tmp_path, credentials=credentials(pki.client)) as procs:
        ranker = tls_ranker(procs, pki.fleet, mutual=False)
        assert profile_call(ranker.address, None) == REFUSED
        assert profile_call(ranker.address, credentials(pki.stranger)) == REFUSED
        # Without --tls-ca a client needs no certificate of its own.
        assert (
            profile_call(ranker.address, credentials(pki.client, with_certificate=False))
            == grpc.StatusCode.OK
        )


def test_mutual_tls_refuses_clients_without_a_certificate_from_the_fleets_ca(
    pki: Pki, tmp_path: Path
) -> None:
    with Processes(log_dir=tmp_path, credentials=credentials(pki.client)) as procs:
        ranker = tls_ranker(procs, pki.fleet, mutual=True)
        assert profile_call(ranker.address, None) == REFUSED
        assert profile_call(ranker.address, credentials(pki.client, with_certificate=False)) == REFUSED
        stranger_cert, stranger_key, _ = pki.stranger.read()
        trusting_but_foreign = grpc.ssl_channel_credentials(
            root_certificates=pki.client.ca.read_bytes(),
            private_key=stranger_key,
            certificate_chain=stranger_cert,
        )
        assert profile_call(ranker.address, trusting_but_foreign) == REFUSED
        assert profile_call(ranker.address, credentials(pki.client)) == grpc.StatusCode.OK


@pytest.fixture(scope="module")
def mtls_fleet(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    debug = " --log-level DEBUG"  # the most a service ever logs
    config = fleet_config(
        tmp_path_factory.mktemp("logs"),
        rankers=2,
        slo_ms=1.0,  # every request must relay: Admit and PreInfer travel too
        ranker_args=RANKER_ARGS + debug,
        router_args=ROUTER_ARGS + debug,
        trigger_args=TRIGGER_ARGS + debug,
        stub_args=STUB_ARGS + debug,
        tls_cert=str(pki.fleet.cert),
        tls_key=str(pki.fleet.key),
        tls_ca=str(pki.fleet.ca),
    )
    with Fleet(config) as fleet:  # each service became healthy, checked over mutual TLS
        yield fleet


def test_a_whole_fleet_serves_end_to_end_over_mutual_tls(mtls_fleet: Fleet, pki: Pki) -> None:
    with grpc.secure_channel(mtls_fleet.address(STUB), credentials(pki.client)) as channel:
        stub = recommend_pb2_grpc.RecommendServiceStub(channel)
        answers = [
            stub.Recommend(recommend_pb2.RecommendRequest(user_id=f"u{i}", top_k=3), timeout=30)
            for i in range(8)
        ]
    assert all(len(a.item_ids) == 3 and a.instance in mtls_fleet.ranker_names for a in answers)
    # Admit reached the trigger, its PreInfer the ranker through the router, and the Rank found the prefix.
    assert any(a.admitted and a.cache_source == common_pb2.CACHE_SOURCE_HBM for a in answers)
    # The router health-checked both rankers over TLS: both are members it routes to.
    with grpc.secure_channel(mtls_fleet.address(ROUTER), credentials(pki.client)) as channel:
        profile = ranker_pb2_grpc.RankerServiceStub(channel).GetProfile(
            ranker_pb2.GetProfileRequest(), timeout=10
        )
    assert profile.fleet_members == 2


@pytest.mark.parametrize("service", ["ranker-0", ROUTER, TRIGGER, STUB])
def test_every_service_of_the_fleet_refuses_plaintext_and_anonymous_clients(mtls_fleet, pki, service) -> None:
    address = mtls_fleet.address(service)
    assert health_call(address, credentials(pki.client)) == grpc.StatusCode.OK
    for creds in (None, credentials(pki.client, with_certificate=False), credentials(pki.stranger)):
        assert health_call(address, creds) == REFUSED


def test_the_launchers_demo_traffic_runs_over_mutual_tls(mtls_fleet: Fleet) -> None:
    config = LauncherConfig(**dataclasses.asdict(mtls_fleet.config), demo_rps=10.0, duration_s=2.0)
    progress = DemoProgress(window_s=10.0)
    asyncio.run(drive_demo(mtls_fleet.address(STUB), config, progress, asyncio.Event()))
    assert progress.total > 5 and not progress.errors


def test_no_key_material_appears_in_any_log(mtls_fleet: Fleet, pki: Pki) -> None:
    mtls_fleet.check()
    key_lines = [line for line in pki.fleet.key.read_text().splitlines() if line and "-----" not in line]
    assert key_lines
    for name in mtls_fleet.children:
        log = (mtls_fleet.log_dir / f"{name}.log").read_text(errors="replace")
        assert "listening" in log  # the log is the service's, and was written to
        assert "PRIVATE KEY" not in log, name
        assert not any(line in log for line in key_lines), name
