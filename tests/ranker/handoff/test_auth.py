"""Only another ranker may call CacheHandoffService, on a real server: under mutual TLS, by the name its
certificate carries (the rankers' name as the deploy issues it); without, from loopback, or with the
fleet's secret. A refused Push stores nothing and a refused Fetch sends nothing."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from pathlib import Path

import grpc
import pytest
import yaml

from relaygr.v1 import handoff_pb2, handoff_pb2_grpc
from services.common.config import listed
from services.ranker.cache import kv_wire
from services.ranker.cache.acquired import Source
from services.ranker.handoff.auth import call_metadata, is_loopback
from services.ranker.handoff.settings import HandoffSettings
from tests.ranker.handoff.support import cached, fleet, history, made_up, ranked, run
from tests.ranker.harness import cache_app, events, held_bytes
from tests.security.certs import Authority

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
CERTIFICATES = DEPLOY / "components" / "tls" / "certificates.yaml"


@contextlib.asynccontextmanager
async def serving(**overrides):
    """A ranker whose gRPC server serves (no warm-up: the handoff service does not wait for it)."""
    async with cache_app(**overrides) as app:
        await app.grpc.start()
        try:
            yield app
        finally:
            await app.grpc.server.stop(None)


async def push(channel: grpc.aio.Channel, app, user: int, metadata=()) -> grpc.StatusCode:
    async def requests():
        for chunk in made_up(app, user):
            yield handoff_pb2.PushRequest(chunk=chunk)

    try:
        receipt = await handoff_pb2_grpc.CacheHandoffServiceStub(channel).Push(
            requests(), timeout=10, metadata=metadata
        )
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    assert receipt.admitted == 1
    return grpc.StatusCode.OK


async def fetch(channel: grpc.aio.Channel, app, user: int, metadata=()) -> tuple[grpc.StatusCode, int]:
    """The status of a Fetch of `user`'s prefix, and the bytes it brought."""
    request = handoff_pb2.FetchRequest(
        user_id=f"user-{user}", model_version=app.runner.model_version, layout=app.admission.layout,
        long_term=kv_wire.sequence(events(history(user))),
    )  # fmt: skip
    stub = handoff_pb2_grpc.CacheHandoffServiceStub(channel)
    try:
        answers = [a async for a in stub.Fetch(request, timeout=10, metadata=metadata)]
    except grpc.aio.AioRpcError as exc:
        return exc.code(), 0
    return grpc.StatusCode.OK, sum(len(a.chunk.data) for a in answers)


def own_address() -> str | None:
    """An address of this host outside loopback, if it has one."""
    candidates = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe, contextlib.suppress(OSError):
        probe.connect(("192.0.2.1", 9))  # a route's source address; no packet is sent
        candidates.append(probe.getsockname()[0])
    with contextlib.suppress(OSError):
        candidates += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    return next((a for a in candidates if not ipaddress.ip_address(a).is_loopback), None)


@run
async def test_without_tls_or_a_secret_only_callers_on_loopback_are_served() -> None:
    address = own_address()
    if address is None:
        pytest.skip("this host has no address outside loopback to call from")
    async with serving(instance_name="b", host="0.0.0.0") as app:
        async with grpc.aio.insecure_channel(f"{address}:{app.grpc.port}") as channel:
            assert await push(channel, app, 1) == grpc.StatusCode.PERMISSION_DENIED
            assert await fetch(channel, app, 1) == (grpc.StatusCode.PERMISSION_DENIED, 0)
        assert not app.cache.index.entries and held_bytes(app.cache)["dram"] == 0
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
            assert await push(channel, app, 1) == grpc.StatusCode.OK
            status, nbytes = await fetch(channel, app, 1)
            assert status == grpc.StatusCode.OK and nbytes == held_bytes(app.cache)["dram"] > 0
        async with grpc.aio.insecure_channel(f"{address}:{app.grpc.port}") as channel:
            assert await fetch(channel, app, 1) == (grpc.StatusCode.PERMISSION_DENIED, 0)


@run
async def test_a_push_that_stalls_within_an_entry_or_oversizes_a_chunk_is_ended_and_stores_nothing(
    monkeypatch,
) -> None:
    """On a real server: a Push whose sender stops within an entry ends with DEADLINE_EXCEEDED once
    --handoff-chunk-timeout-s passes, one with a chunk over the limit with INVALID_ARGUMENT naming the
    field; neither leaves a reservation or a byte behind, and a well-formed Push is admitted after them."""
    monkeypatch.setattr(kv_wire, "CHUNK_BYTES", 4096)
    async with serving(instance_name="b", handoff_chunk_timeout_s=0.2) as app:
        first, second, *_ = made_up(app, 1)

        async def stalled():
            yield handoff_pb2.PushRequest(chunk=first)
            await asyncio.sleep(30)

        async def oversized():
            yield handoff_pb2.PushRequest(chunk=first)
            yield handoff_pb2.PushRequest(chunk=handoff_pb2.HandoffChunk(data=second.data * 2))

        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
            stub = handoff_pb2_grpc.CacheHandoffServiceStub(channel)
            for requests, code, message in (
                (stalled, grpc.StatusCode.DEADLINE_EXCEEDED, "chunk: none for 0.2 s within entry 'user-1'"),
                (oversized, grpc.StatusCode.INVALID_ARGUMENT, "chunk.data: 8192 bytes"),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.Push(requests(), timeout=10)
                assert caught.value.code() == code and message in caught.value.details()
                assert app.cache.dram.used_bytes == app.admission.staging.used_bytes == 0
                assert not app.cache.index.entries and held_bytes(app.cache)["dram"] == 0
            assert await push(channel, app, 1) == grpc.StatusCode.OK


@run
async def test_with_a_fleet_secret_every_caller_must_present_it() -> None:
    async with (
        serving(instance_name="b", handoff_secret="fleet-secret") as app,
        grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel,
    ):
        for metadata in ((), (("relaygr-handoff-secret", "guess"),)):
            assert await push(channel, app, 1, metadata) == grpc.StatusCode.UNAUTHENTICATED
            assert await fetch(channel, app, 1, metadata) == (grpc.StatusCode.UNAUTHENTICATED, 0)
        assert not app.cache.index.entries and held_bytes(app.cache)["dram"] == 0
        assert await push(channel, app, 1, call_metadata(app.config)) == grpc.StatusCode.OK
        status, nbytes = await fetch(channel, app, 1, call_metadata(app.config))
        assert status == grpc.StatusCode.OK and nbytes == held_bytes(app.cache)["dram"] > 0
    assert call_metadata(HandoffSettings()) == ()
    assert "fleet-secret" not in repr(app.config)  # no log or traceback shows it


@run
async def test_under_mutual_tls_only_a_certificate_with_a_rankers_name_is_served(tmp_path) -> None:
    authority = Authority(tmp_path, "fleet")
    ranker, router = authority.issue("ranker-peer"), authority.issue("router")
    tls = dict(tls_cert=str(ranker.cert), tls_key=str(ranker.key), tls_ca=str(ranker.ca))
    async with serving(instance_name="b", handoff_peer_names="ranker-peer", **tls) as app:

        def channel(leaf) -> grpc.aio.Channel:
            cert, key, ca = leaf.read()
            credentials = grpc.ssl_channel_credentials(ca, private_key=key, certificate_chain=cert)
            return grpc.aio.secure_channel(f"127.0.0.1:{app.grpc.port}", credentials)

        async with channel(router) as other_service:
            assert await push(other_service, app, 1) == grpc.StatusCode.PERMISSION_DENIED
            assert await fetch(other_service, app, 1) == (grpc.StatusCode.PERMISSION_DENIED, 0)
        assert not app.cache.index.entries and held_bytes(app.cache)["dram"] == 0
        async with channel(ranker) as peer:
            assert await push(peer, app, 1) == grpc.StatusCode.OK
            status, nbytes = await fetch(peer, app, 1)
            assert status == grpc.StatusCode.OK and nbytes == held_bytes(app.cache)["dram"] > 0


def test_the_default_peer_name_is_on_every_rankers_certificate_of_the_deploy_and_no_other() -> None:
    names = set(listed(HandoffSettings(), "handoff_peer_names"))
    certificates = {
        doc["metadata"]["name"]: set(doc["spec"]["dnsNames"])
        for doc in yaml.safe_load_all(CERTIFICATES.read_text())
        if doc and doc["kind"] == "Certificate" and "dnsNames" in doc["spec"]
    }
    assert names & certificates.pop("ranker-tls")
    assert certificates and all(not names & dns for dns in certificates.values())


def test_the_deploys_rankers_read_the_fleet_secret_from_an_optional_secret() -> None:
    """Without TLS the rankers of the deploy need the secret; with it they do not, and the Secret is made in
    the cluster, never in a manifest (deploy/README.md, "The cache handoff's secret")."""
    documents = yaml.safe_load_all((DEPLOY / "base" / "ranker.yaml").read_text())
    (ranker,) = [doc for doc in documents if doc and doc["kind"] == "StatefulSet"]
    (container,) = ranker["spec"]["template"]["spec"]["containers"]
    assert {"secretRef": {"name": "ranker-handoff", "optional": True}} in container["envFrom"]


@pytest.mark.parametrize(
    ("peer", "loopback"),
    [
        ("ipv4:127.0.0.1:5000", True),
        ("ipv4:127.3.4.5:5000", True),
        ("ipv6:[::1]:5000", True),
        ("ipv6:[::ffff:127.0.0.1]:5000", True),
        ("unix:/tmp/ranker.sock", True),
        ("ipv4:10.1.2.3:5000", False),
        ("ipv6:[fd00::2]:5000", False),
        ("ipv6:[::ffff:10.0.0.1]:5000", False),
        ("dns:localhost:5000", False),
        ("", False),
    ],
)
def test_loopback_is_told_from_a_peer_string(peer: str, loopback: bool) -> None:
    assert is_loopback(peer) is loopback


@run
async def test_rankers_that_share_the_fleet_secret_fetch_and_push_to_each_other() -> None:
    """The secret required of every caller is the one a ranker's own Fetch and Push present."""
    async with fleet(["a", "b"], handoff_secret="fleet-secret", read_through_timeout_ms=10_000) as rankers:
        b = await rankers.start("b")
        ring = b.peers.membership.ring
        ours = next(u for u in range(200) if ring.owner(f"user-{u}") == "a")
        theirs = next(u for u in range(200) if ring.owner(f"user-{u}") == "b")
        await cached(b, [ours])
        a = await rankers.start("a")
        await rankers.routable()
        await a.cache.pre_infer(f"user-{ours}", events(history(ours)))
        for _ in range(200):  # the prefetch answered
            if not a.read_through._tasks:
                break
            await asyncio.sleep(0.01)
        _, source = await ranked(a, ours)
        assert source is Source.PEER  # fetched from b, reloaded, leased
        (entry,) = await cached(a, [theirs])
        await rankers.stop("a")
        assert (a.handed_off.failed, sum(r.admitted for r in a.handed_off.receipts)) == (0, 1)
        assert b.cache.index.get(entry.key) is not None
