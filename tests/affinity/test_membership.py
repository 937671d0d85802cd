"""Membership: static and DNS SRV members (names from records), refresh, health watching, circuit breaking."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from relaygr.v1 import ranker_pb2
from services.affinity.discovery import DiscoveryFailed, SrvRecord, members_from_srv, srv_discovery
from services.affinity.membership import CircuitBreaker, Membership
from services.affinity.metrics import ROUTER_FAILURES, ROUTER_MEMBER_HEALTHY
from services.affinity.ring import AffinityRing
from services.common.config import load
from services.common.contract import RANKER_SERVICE
from services.router.config import RouterConfig
from tests.router.harness import stub_rankers
from tests.support.polling import eventually

SRV_NAME = "_grpc._tcp.ranker-headless.relaygr.svc.cluster.local"


def gauge(metric, *labels: str) -> float:
    return metric.labels(*labels)._value.get()


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FixedDns:
    """An injected DNS: the SRV records of the headless service, changed by the test between refreshes."""

    def __init__(self, records: list[SrvRecord]) -> None:
        self.records = records
        self.failure: OSError | None = None
        self.lookups = 0

    def __call__(self, name: str) -> list[SrvRecord]:
        assert name == SRV_NAME
        self.lookups += 1
        if self.failure is not None:
            raise self.failure
        return list(self.records)


def pod(name: str, port: int = 50051, subdomain: str = "ranker-headless") -> SrvRecord:
    """The SRV record Kubernetes publishes for a ready StatefulSet pod behind its headless Service."""
    return SrvRecord(f"{name}.{subdomain}.relaygr.svc.cluster.local.", port)


def dialled(name: str, port: int = 50051) -> str:
    return f"{name}.ranker-headless.relaygr.svc.cluster.local:{port}"


def test_defaults_make_a_local_fleet_work_without_flags() -> None:
    config = load(RouterConfig, [], environ={})
    assert (config.port, config.metrics_port) == (50050, 9100)
    assert config.static_members() == {"ranker-0": "127.0.0.1:50051"}
    assert (config.virtual_nodes, config.load_factor, config.circuit_failures) == (160, 1.25, 3)
    assert (config.deadline_margin_ms, config.default_timeout_ms) == (2, 5000)


def test_static_members_parse_and_reject_malformed_lists() -> None:
    config = RouterConfig(rankers="ranker-0=10.0.0.1:50051, ranker-1=[::1]:50052")
    assert config.static_members() == {"ranker-0": "10.0.0.1:50051", "ranker-1": "[::1]:50052"}
    for bad in ("ranker-0", "ranker-0=host", "=h:1", "a=h:1,a=h:2", "a=h:99999", " , "):
        with pytest.raises(ValueError, match="--rankers"):
            RouterConfig(rankers=bad).static_members()
    with pytest.raises(SystemExit):
        load(RouterConfig, ["--load-factor", "0.9"], environ={})


def test_the_srv_name_is_checked_and_errors_name_the_flag(capsys) -> None:
    config = load(RouterConfig, [], environ={"RELAYGR_RANKERS_SRV": SRV_NAME + "."})
    assert config.srv_name() == SRV_NAME
    for bad in ("ranker-headless:50051", "_grpc._tcp..svc", "bad name.svc", "-lead.svc", "x" * 64 + ".svc"):
        with pytest.raises(SystemExit):
            load(RouterConfig, [f"--rankers-srv={bad}"], environ={})
        assert "error: --rankers-srv: " in capsys.readouterr().err.strip().splitlines()[-1], bad
    # With neither source there are no members to route to.
    with pytest.raises(SystemExit):
        load(RouterConfig, ["--rankers", ""], environ={})
    assert "give --rankers or --rankers-srv" in capsys.readouterr().err


def test_members_are_named_by_the_srv_targets_first_label_and_dialled_by_the_target_name() -> None:
    records = [pod("ranker-1"), pod("ranker-0", port=50061), pod("ranker-2", subdomain="other")]
    assert members_from_srv(records) == {
        "ranker-0": dialled("ranker-0", 50061),
        "ranker-1": dialled("ranker-1"),
        "ranker-2": "ranker-2.other.relaygr.svc.cluster.local:50051",
    }
    # Two targets claiming one name: the same one wins whatever the record order.
    twice = [pod("ranker-0", subdomain="b"), pod("ranker-0", subdomain="a")]
    expected = {"ranker-0": "ranker-0.a.relaygr.svc.cluster.local:50051"}
    assert members_from_srv(twice) == members_from_srv(twice[::-1]) == expected
    # The root target says "no service here" (RFC 2782): no member.
    assert members_from_srv([SrvRecord(".", 50051)]) == {}


def test_srv_discovery_adds_removes_keeps_and_clears_members() -> None:
    async def scenario() -> None:
        dns = FixedDns([pod("ranker-0"), pod("ranker-1")])
        config = RouterConfig(rankers_srv=SRV_NAME, dns_refresh_s=0.05, health_interval_s=30)
        membership = Membership.from_config(config, config, lookup=dns)
        await membership.start()
        try:
            assert {n: m.address for n, m in membership.members.items()} == {
                "ranker-0": dialled("ranker-0"),
                "ranker-1": dialled("ranker-1"),
            }
            assert membership.ring.members == {"ranker-0", "ranker-1"}
            first = membership.get("ranker-0")

            # The periodic refresh picks up a scale-up and a scale-down (or an unready pod, whose record
            # Kubernetes withdraws); a restarted pod keeps its name and so its channel, which redials it.
            dns.records = [pod("ranker-0"), pod("ranker-2")]
            await eventually(lambda: set(membership.members) == {"ranker-0", "ranker-2"})
            assert membership.get("ranker-0") is first
            assert membership.get("ranker-2").address == dialled("ranker-2")
            assert membership.ring.members == {"ranker-0", "ranker-2"}
            # A member answering on another port is redialled.
            dns.records = [pod("ranker-0", port=50052), pod("ranker-2")]
            await eventually(lambda: membership.get("ranker-0").address == dialled("ranker-0", 50052))
            assert membership.get("ranker-0") is not first

            # A failed lookup keeps the members it had.
            dns.failure = DiscoveryFailed("SERVFAIL")
            lookups = dns.lookups
            await eventually(lambda: dns.lookups > lookups + 1)
            assert set(membership.members) == {"ranker-0", "ranker-2"}

            # An empty answer (NXDOMAIN: no ready ranker) leaves no member.
            dns.failure, dns.records = None, []
            await eventually(lambda: not membership.members)
            assert not membership.ring.members
        finally:
            await membership.close()
        assert not membership.members and not membership.ring.members

    asyncio.run(scenario())


class LingeringChannel:
    """A channel whose health probes never answer and, once cancelled, take `linger_s` to end: the window
    in which a refresh removing its member is still waiting for the member's health watcher."""

    def __init__(self, linger_s: float) -> None:
        self.linger_s = linger_s
        self.probe_cancelled = asyncio.Event()
        self.closed = False

    def unary_unary(self, method: str, **_options):
        async def probe(request, timeout: float):
            try:
                await asyncio.sleep(timeout)
            except asyncio.CancelledError:
                self.probe_cancelled.set()
                await asyncio.sleep(self.linger_s)
                raise

        return probe

    def unary_stream(self, method: str, **_options):
        return None  # the health stub's Watch, which membership does not call

    async def close(self, grace: float | None = None) -> None:
        self.closed = True


def test_closing_while_a_refresh_removes_a_member_stops_the_refresh() -> None:
    """A router shut down while DNS had just withdrawn a member: the close cancels the refresh loop in the
    middle of its wait for the member's health watcher. The loop must stop there, not carry on refreshing
    with the cancellation swallowed (which hung `close()` for good)."""

    async def scenario() -> None:
        dns = FixedDns([pod("ranker-0")])
        channel = LingeringChannel(linger_s=0.2)
        membership = Membership(
            discover=srv_discovery(SRV_NAME, dns),
            connect=lambda address: channel,
            ring=AffinityRing(),
            health_interval_s=30,
            circuit_failures=3,
            circuit_open_s=1,
            refresh_s=0.01,
        )
        await membership.start()
        assert set(membership.members) == {"ranker-0"}
        dns.records = []
        await asyncio.wait_for(channel.probe_cancelled.wait(), 5)  # the refresh waits for the watcher
        # Not wait_for: cancelling a hung close() would end it (that cancellation is swallowed as well).
        closing = asyncio.create_task(membership.close())
        done, _ = await asyncio.wait({closing}, timeout=5)
        if not done:
            closing.cancel()
            await asyncio.wait({closing})
        assert done == {closing}, "close() hung: the refresh loop carried on after it was cancelled"
        lookups = dns.lookups
        await asyncio.sleep(0.1)
        assert dns.lookups == lookups  # no refresh after the close
        assert channel.closed and not membership.members and not membership.ring.members

    asyncio.run(scenario())


def test_closing_while_a_refresh_removes_two_members_retires_both() -> None:
    """DNS withdraws two members in one refresh and the router closes during the first one's retirement:
    every leaving member's retirement started before any was awaited, so both channels close and both
    health watchers stop."""

    async def scenario() -> None:
        dns = FixedDns([pod("ranker-0"), pod("ranker-1")])
        channels = {dialled("ranker-0"): LingeringChannel(0.2), dialled("ranker-1"): LingeringChannel(0.2)}
        membership = Membership(
            discover=srv_discovery(SRV_NAME, dns),
            connect=channels.__getitem__,
            ring=AffinityRing(),
            health_interval_s=30,
            circuit_failures=3,
            circuit_open_s=1,
            refresh_s=0.01,
        )
        await membership.start()
        assert set(membership.members) == {"ranker-0", "ranker-1"}
        dns.records = []
        first = next(iter(channels.values()))
        await asyncio.wait_for(first.probe_cancelled.wait(), 5)  # the refresh is retiring the members
        await asyncio.wait_for(membership.close(), 10)
        assert all(channel.closed for channel in channels.values())
        assert all(channel.probe_cancelled.is_set() for channel in channels.values())  # watchers stopped
        assert not membership.members and not membership.ring.members

    asyncio.run(scenario())


def test_unhealthy_members_are_not_routable_and_come_back() -> None:
    async def scenario() -> None:
        async with stub_rankers(2) as (zero, one):
            rankers = f"ranker-0={zero.address},ranker-1={one.address}"
            config = RouterConfig(rankers=rankers, health_interval_s=0.05)
            membership = Membership.from_config(config, config)
            await membership.start()
            try:
                await asyncio.wait_for(membership.wait_until_any_healthy(), 5)
                await eventually(lambda: len(membership.routable()) == 2)
                assert gauge(ROUTER_MEMBER_HEALTHY, "ranker-1") == 1

                await one.set_serving(False)
                await eventually(lambda: [m.name for m in membership.routable()] == ["ranker-0"])
                assert gauge(ROUTER_MEMBER_HEALTHY, "ranker-1") == 0
                assert "ranker-1" in membership.ring  # keeps its arc while away

                await one.set_serving(True)
                await eventually(lambda: len(membership.routable()) == 2)
                assert gauge(ROUTER_MEMBER_HEALTHY, "ranker-1") == 1
            finally:
                await membership.close()

    asyncio.run(scenario())


def test_a_member_slow_to_answer_its_health_check_stays_until_several_checks_time_out() -> None:
    """Overload slows every ranker's answers at once: one late probe must not empty the ring."""

    async def scenario() -> None:
        async with stub_rankers(1) as (zero,):
            config = RouterConfig(
                rankers=f"ranker-0={zero.address}", health_interval_s=0.1, health_timeouts=3
            )
            membership = Membership.from_config(config, config)
            await membership.start()
            try:
                await asyncio.wait_for(membership.wait_until_any_healthy(), 5)
                zero.health.delay_s = 0.15  # every probe now times out (its timeout is the interval)
                late_while_routable = 0
                while membership.routable():
                    late_while_routable = zero.health.late
                    await asyncio.sleep(0.005)
                # It stayed routable through the first timed-out probes and left on the third.
                assert late_while_routable >= 2 and zero.health.late >= 3
                zero.health.delay_s = 0.0
                await eventually(lambda: len(membership.routable()) == 1)
                await zero.set_serving(False)  # an answered NOT_SERVING counts at once
                await eventually(lambda: not membership.routable(), timeout_s=0.5)
            finally:
                await membership.close()

    asyncio.run(scenario())


def test_circuit_opens_after_consecutive_failures_and_closes_after_the_open_time() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failures=3, open_s=5.0, clock=clock)
    assert not breaker.record_failure() and not breaker.record_failure()
    breaker.record_success()  # consecutive, not total, failures count
    assert not breaker.record_failure() and not breaker.record_failure()
    assert breaker.closed
    assert breaker.record_failure()
    assert not breaker.closed
    clock.now += 4.9
    assert not breaker.closed
    clock.now += 0.2
    assert breaker.closed
    # Half-open: one more failure re-opens at once; a success would have reset the count.
    assert breaker.record_failure()
    assert not breaker.closed
    clock.now += 5.1
    breaker.record_success()
    assert not breaker.record_failure() and breaker.closed


def test_member_faults_open_the_circuit_but_client_errors_do_not() -> None:
    async def scenario() -> None:
        async with stub_rankers(1) as (stub,):
            config = RouterConfig(
                rankers=f"ranker-0={stub.address}",
                health_interval_s=0.05,
                circuit_failures=3,
                circuit_open_s=0.3,
            )
            membership = Membership.from_config(config, config)
            await membership.start()
            try:
                member = membership.get("ranker-0")
                await eventually(lambda: member.routable)
                before = ROUTER_FAILURES.labels("ranker-0", "INVALID_ARGUMENT")._value.get()
                for _ in range(5):
                    member.record_failure(grpc.StatusCode.INVALID_ARGUMENT)
                assert member.routable
                assert ROUTER_FAILURES.labels("ranker-0", "INVALID_ARGUMENT")._value.get() == before + 5

                for _ in range(3):
                    member.record_failure(grpc.StatusCode.UNAVAILABLE)
                assert not member.routable and membership.routable() == []
                assert gauge(ROUTER_MEMBER_HEALTHY, "ranker-0") == 0
                await eventually(lambda: member.routable, timeout_s=2)  # open for 0.3 s, still healthy
                await eventually(lambda: gauge(ROUTER_MEMBER_HEALTHY, "ranker-0") == 1)
            finally:
                await membership.close()

    asyncio.run(scenario())


def test_a_leaving_member_is_off_the_ring_at_once_and_finishes_its_forwards() -> None:
    async def scenario() -> None:
        async with stub_rankers(1) as (stub,):
            stub.delay_s = 0.3
            config = RouterConfig(rankers=f"ranker-0={stub.address}", health_interval_s=0.05, drain_grace_s=5)
            membership = Membership.from_config(config, config)
            await membership.start()
            member = membership.get("ranker-0")
            await eventually(lambda: member.routable)
            forward = asyncio.ensure_future(member.method(f"/{RANKER_SERVICE}/Rank")(b"", timeout=5))
            await eventually(lambda: bool(stub.received))
            leaving = asyncio.create_task(membership.apply({}))
            await asyncio.sleep(0)
            assert "ranker-0" not in membership.ring and membership.get("ranker-0") is None
            await leaving
            assert ranker_pb2.RankResponse.FromString(await forward).instance == "ranker-0"
            await membership.close()

    asyncio.run(scenario())
