"""SRV discovery against a real DNS server on loopback: what each kind of answer does to the members, and a
router whose member is found by SRV and dialled by the target's name.

The router's lookup is given a resolver pointed at the loopback server (in production the resolver is
configured from /etc/resolv.conf).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator

import dns.rcode
import grpc
import pytest

from relaygr.v1 import ranker_pb2, ranker_pb2_grpc
from services.affinity.discovery import DiscoveryFailed, SrvRecord, srv_lookup
from services.affinity.membership import Membership
from services.router.config import RouterConfig
from tests.affinity.loopback_dns import LoopbackDns
from tests.router.harness import StubRanker, running_router
from tests.support.polling import eventually

SRV_NAME = "_grpc._tcp.ranker-headless.relaygr.svc.cluster.local"


@pytest.fixture
def server() -> Iterator[LoopbackDns]:
    with LoopbackDns() as dns_server:
        yield dns_server


def test_srv_records_become_members_and_each_answer_has_its_meaning(server: LoopbackDns) -> None:
    lookup = functools.partial(srv_lookup, resolver=server.resolver(lifetime_s=0.5))
    server.set(
        SRV_NAME,
        "SRV",
        [
            "0 50 50051 ranker-0.ranker-headless.relaygr.svc.cluster.local.",
            "0 50 50051 ranker-1.ranker-headless.relaygr.svc.cluster.local.",
        ],
    )
    assert sorted(lookup(SRV_NAME), key=lambda r: r.target) == [
        SrvRecord("ranker-0.ranker-headless.relaygr.svc.cluster.local.", 50051),
        SrvRecord("ranker-1.ranker-headless.relaygr.svc.cluster.local.", 50051),
    ]
    # The name is asked as it is, absolute: no search domains multiply the queries.
    assert server.questions == [(SRV_NAME + ".", "SRV")]

    server.set(SRV_NAME, "SRV", [])
    assert lookup(SRV_NAME) == []  # the name exists but lists no ranker
    server.rcode = dns.rcode.NXDOMAIN
    assert lookup(SRV_NAME) == []  # what Kubernetes answers when no ranker is ready
    server.rcode = dns.rcode.SERVFAIL
    with pytest.raises(DiscoveryFailed, match=SRV_NAME):
        lookup(SRV_NAME)
    server.rcode, server.silent = dns.rcode.NOERROR, True
    with pytest.raises(DiscoveryFailed, match="SRV lookup"):
        lookup(SRV_NAME)


def test_membership_keeps_its_members_through_a_dns_outage_and_empties_on_nxdomain(server) -> None:
    async def scenario() -> None:
        server.set(SRV_NAME, "SRV", ["0 0 50051 ranker-0.ranker-headless.relaygr.svc.cluster.local."])
        config = RouterConfig(rankers_srv=SRV_NAME, dns_refresh_s=0.05, health_interval_s=30)
        lookup = functools.partial(srv_lookup, resolver=server.resolver(lifetime_s=0.2))
        membership = Membership.from_config(config, config, lookup=lookup)
        await membership.start()
        try:
            assert {n: m.address for n, m in membership.members.items()} == {
                "ranker-0": "ranker-0.ranker-headless.relaygr.svc.cluster.local:50051"
            }
            server.silent = True  # the DNS server stops answering: the members stay
            asked = len(server.questions)
            await eventually(lambda: len(server.questions) >= asked + 2)
            assert set(membership.members) == {"ranker-0"}
            server.silent, server.rcode = False, dns.rcode.NXDOMAIN  # no ranker is ready
            await eventually(lambda: not membership.members)
        finally:
            await membership.close()

    asyncio.run(scenario())


def test_a_router_routes_to_the_member_an_srv_record_names_dialling_it_by_name(server) -> None:
    """The target `localhost.` resolves to this machine; the stub answers as the member it is named."""

    async def scenario() -> None:
        stub = StubRanker("localhost")
        await stub.start()
        server.set(SRV_NAME, "SRV", [f"0 0 {stub.port} localhost."])
        config = RouterConfig(
            port=0, metrics_port=-1, rankers_srv=SRV_NAME, health_interval_s=0.05, drain_grace_s=0.5
        )
        lookup = functools.partial(srv_lookup, resolver=server.resolver())
        try:
            async with (
                running_router(config, lookup) as router,
                grpc.aio.insecure_channel(router.address) as channel,
            ):
                await asyncio.wait_for(router.wait_serving(), 10)
                assert router.membership.get("localhost").address == f"localhost:{stub.port}"
                client = ranker_pb2_grpc.RankerServiceStub(channel)
                answer = await client.Rank(ranker_pb2.RankRequest(user_id="u", request_id="r"), timeout=5)
                assert answer.instance == "localhost"
                assert len(stub.received_by("Rank")) == 1
        finally:
            await stub.stop()

    asyncio.run(scenario())
