"""Trigger replicas share each ranker's HBM lease share instead of each taking all of it.

A ranker's load report includes every trigger's admissions, but only as of its last answer to a given
trigger: what another trigger admits at the same moment, or after that answer, is not in it. So triggers
braking on reports alone each admit up to the whole share, and two of them lease two shares (the policy
test below shows it with `replicas=1`). With `--replicas N` each trigger keeps what its own admissions may
hold within 1/N of the share, and the sum stays within one share.

The policy tests drive two policies with a fake clock and real load reports. The fleet test runs two real
trigger servers over loopback in front of one real router and cpu-tiny ranker (built as in
test_service.py), both admitting long prefixes for distinct users at once, and measures on the ranker:
the leased bytes of its own load report and the HBM bytes of its cache gauge, sampled throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import urllib.request
from collections import Counter

import grpc
import pytest

from relaygr.v1 import ranker_pb2, ranker_pb2_grpc, trigger_pb2
from services.launcher.procs import Processes, ServiceProcess
from services.trigger.admission import AdmissionPolicy, Reason
from services.trigger.fleet_load import FleetLoad
from tests.trigger.harness import admit_request, trigger, wait_serving
from tests.trigger.policy import LIMITS, MIB, Clock, prefix, report, user_on

INSTANCE = "ranker-r"
LONG = 512  # events: 256 KiB of cpu-tiny KV (512 bytes a token)
PREFIX_BYTES = LONG * 512
HBM_BUDGET_MB = 3  # twelve such prefixes; an 8192-event one (4 MiB) does not fit
LEASE_FRACTION = 0.375  # a share of 4.5 prefixes: 1.125 MiB
SHARE_BYTES = LEASE_FRACTION * HBM_BUDGET_MB * MIB
LEASE_TTL_MS = 60_000  # no lease ends during a test: the bytes held only grow
BURST = 6  # Admits each trigger gets at once: more than the whole share's worth


def policy(replicas: int, clock: Clock) -> tuple[AdmissionPolicy, FleetLoad]:
    fleet = FleetLoad(waste_window_s=10.0, clock=clock)
    fleet.set_members(("ranker-a", "ranker-b"))
    return AdmissionPolicy(dataclasses.replace(LIMITS, replicas=replicas), fleet, clock), fleet


def fill(admission: AdmissionPolicy, fleet: FleetLoad, users: list[str], leased: int) -> int:
    """Admits `users`' 4 MiB prefixes one by one, each answered with the ranker's report of `leased` plus
    what this policy admitted; returns how many it admitted."""
    admitted = 0
    for user in users:
        item = prefix(user, length=4096)
        if not admission.decide(item).admitted:
            break
        admitted += 1
        fleet.observe(report("ranker-a", leased_bytes=leased + admitted * item.nbytes))
        admission.answered(item.key, "ranker-a", held=True)
    return admitted


@pytest.mark.parametrize(("replicas", "each", "together"), [(1, 8, 16), (2, 4, 8)])
def test_two_triggers_on_stale_reports_lease_one_share_only_when_they_split_it(replicas, each, together):
    """Both triggers last heard from ranker-a when it held nothing; the first then fills what it may, and the
    second, whose report is stale, admits as if the first had leased nothing."""
    clock = Clock()
    first, first_fleet = policy(replicas, clock)
    second, second_fleet = policy(replicas, clock)
    for fleet in (first_fleet, second_fleet):
        fleet.observe(report("ranker-a", leased_bytes=0))  # a 32 MiB share: eight 4 MiB prefixes
    users = [user_on(first_fleet, "ranker-a", start) for start in range(0, 40_000, 1000)]
    by_first = fill(first, first_fleet, users[:20], leased=0)
    by_second = fill(second, second_fleet, users[20:], leased=0)  # its reports never show the first's
    assert (by_first, by_second) == (each, each)
    assert by_first + by_second == together
    share = LIMITS.hbm_lease_fraction * 64 * MIB
    assert ((by_first + by_second) * 4 * MIB <= share) == (replicas == 2)


def no_gain(user: str):
    """A prefix refused before any brake; deciding it only lets the policy expire what is due."""
    return dataclasses.replace(prefix(user, length=64), miss_ms=3.0, gain_ms=1.0)


def test_a_triggers_own_holding_ends_with_its_window_and_with_a_report_of_consumed_leases():
    clock = Clock()
    admission, fleet = policy(2, clock)
    fleet.observe(report("ranker-a", leased_bytes=0))
    users = [user_on(fleet, "ranker-a", start) for start in range(0, 20_000, 1000)]
    assert fill(admission, fleet, users[:6], leased=0) == 4  # its half of the 32 MiB share
    assert admission.own_holding("ranker-a") == 16 * MIB
    assert admission.decide(prefix(users[6], length=4096)).reason is Reason.HBM_LIMIT
    # A report whose leases Ranks consumed bounds what its own admissions can still hold.
    fleet.observe(report("ranker-a", leased_bytes=4 * MIB))
    assert admission.own_holding("ranker-a") == 4 * MIB
    assert admission.decide(prefix(users[7], length=4096)).admitted
    # Without reports, an admission stops counting once its lease must have ended: the duplicate window
    # (the rankers' lease TTL) after the time its production may have waited for the device.
    fleet.observe(report("ranker-a", leased_bytes=64 * MIB))
    assert admission.own_holding("ranker-a") == 20 * MIB
    clock.now += LIMITS.duplicate_window_s + LIMITS.max_backlog_ms / 1000 - 0.01
    assert admission.decide(no_gain(users[8])).reason is Reason.NO_GAIN
    assert admission.own_holding("ranker-a") == 20 * MIB
    clock.now += 0.02
    assert admission.decide(no_gain(users[9])).reason is Reason.NO_GAIN
    assert admission.own_holding("ranker-a") == 0


@dataclasses.dataclass(frozen=True)
class Fleet:
    router: str
    ranker: ServiceProcess


@pytest.fixture
def fleet(tmp_path):
    """A fresh ranker (nothing leased) and the router in front of it, for each test."""
    with Processes(log_dir=tmp_path / "logs") as procs:
        ranker = procs.start(
            INSTANCE,
            "services.ranker",
            "relaygr.v1.RankerService",
            ["--model-preset", "cpu-tiny", "--instance-name", INSTANCE, "--hbm-budget-mb", str(HBM_BUDGET_MB),
             "--lease-ttl-ms", str(LEASE_TTL_MS), "--profile-lengths", "32,128,512,2048",
             "--profile-repeats", "3"],
        )  # fmt: skip
        ranker.wait_healthy(120)
        router = procs.start(
            "router",
            "services.router",
            "relaygr.v1.RankerService",
            ["--rankers", f"{INSTANCE}={ranker.address}"],
        )
        router.wait_healthy(60)
        yield Fleet(router.address, ranker)


def hbm_bytes(ranker: ServiceProcess) -> float:
    """The ranker's HBM tier bytes, from its own metrics."""
    url = f"http://127.0.0.1:{ranker.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=2) as page:
        text = page.read().decode()
    (value,) = re.findall(r'^relaygr_kv_cache_bytes\{tier="hbm"\} (\S+)$', text, re.MULTILINE)
    return float(value)


async def ranker_report(ranker: ServiceProcess, request: trigger_pb2.AdmitRequest) -> ranker_pb2.LoadReport:
    """The ranker's own load report once its productions are done, asked with the PreInfer of a prefix it
    already holds (which renews that lease and leases nothing new)."""
    signal = ranker_pb2.PreInferRequest(user_id=request.user_id, long_term=request.long_term)
    async with grpc.aio.insecure_channel(ranker.address) as channel:
        stub = ranker_pb2_grpc.RankerServiceStub(channel)
        for _ in range(200):
            answer = await stub.PreInfer(signal, timeout=5)
            assert answer.outcome in (
                ranker_pb2.PRE_INFER_OUTCOME_ALREADY_CACHED, ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED,
            )  # fmt: skip
            if answer.load.pre_infer_backlog_ms < 1e-6:  # a sum of float costs: 0 up to rounding
                return answer.load
            await asyncio.sleep(0.05)
    raise TimeoutError("the ranker's pre-inference never finished")


@contextlib.asynccontextmanager
async def sampling(ranker: ServiceProcess):
    """Samples the ranker's HBM bytes every 10 ms while the body runs; yields the samples."""
    samples: list[float] = []
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            samples.append(await asyncio.to_thread(hbm_bytes, ranker))
            await asyncio.sleep(0.01)

    task = asyncio.create_task(sample())
    try:
        yield samples
    finally:
        done.set()
        await task


def burst_requests(tag: str, count: int, seed: int) -> list[trigger_pb2.AdmitRequest]:
    return [admit_request(f"user-{tag}-{i}", LONG, seed=seed + i) for i in range(count)]


async def warm(stub) -> None:
    """A prefix larger than the ranker's HBM share, before any PreInfer has answered: the trigger refuses it
    itself, braking at the HBM budget that the fleet profile stated (no ranker has reported yet)."""
    answer = await stub.Admit(admit_request(f"user-warm-{id(stub)}", 8192, seed=999))
    assert answer.reason == trigger_pb2.ADMIT_REASON_HBM_LIMIT


SETTINGS = {
    "relay_overhead_ms": 0.0,  # every long prefix is worth relaying
    "hbm_lease_fraction": LEASE_FRACTION,
    "lease_window_ms": LEASE_TTL_MS,  # the rankers' lease TTL, as deployed
    "max_backlog_ms": 60_000.0,  # the HBM brake alone decides, however slow this machine's device is
    "shed_high_water": 100.0,  # and no prefix is shed for its length
    "shed_low_water": 50.0,
}


async def admit_at_once(stubs_and_requests) -> list[trigger_pb2.AdmitResponse]:
    return await asyncio.gather(*(stub.Admit(request) for stub, request in stubs_and_requests))


def test_two_triggers_admitting_at_once_lease_no_more_than_one_share(fleet):
    async def scenario():
        async with (
            trigger(fleet.router, serving=False, replicas=2, **SETTINGS) as (_, first, first_health),
            trigger(fleet.router, serving=False, replicas=2, **SETTINGS) as (_, second, second_health),
        ):
            await asyncio.gather(wait_serving(first_health), wait_serving(second_health))
            await asyncio.gather(warm(first), warm(second))
            before = await asyncio.to_thread(hbm_bytes, fleet.ranker)
            sent = [(first, r) for r in burst_requests("a", BURST, 100)]
            sent += [(second, r) for r in burst_requests("b", BURST, 200)]
            async with sampling(fleet.ranker) as samples:
                answers = await admit_at_once(sent)
                admitted = [
                    request for (_, request), answer in zip(sent, answers, strict=True) if answer.admitted
                ]
                load = await ranker_report(fleet.ranker, admitted[0])
            after = await asyncio.to_thread(hbm_bytes, fleet.ranker)
            return answers, admitted, load, [sample - before for sample in samples], after - before

    answers, admitted, load, growth, grown = asyncio.run(scenario())
    # Each keeps within its half of the 4.5-prefix share: two prefixes, the rest braked by HBM.
    for answered in (answers[:BURST], answers[BURST:]):
        assert Counter(a.reason for a in answered) == {
            trigger_pb2.ADMIT_REASON_ADMITTED: 2, trigger_pb2.ADMIT_REASON_HBM_LIMIT: BURST - 2,
        }  # fmt: skip
    # Measured on the ranker: its leased entries hold exactly what was admitted, within one share, and its
    # HBM tier grew by those bytes and never by more than the share while the Admits ran.
    assert load.hbm_capacity_bytes == HBM_BUDGET_MB * MIB
    assert load.leased_bytes == len(admitted) * PREFIX_BYTES == 4 * PREFIX_BYTES <= SHARE_BYTES
    assert grown == load.leased_bytes
    assert growth and max(growth) <= SHARE_BYTES


def test_a_lone_trigger_fills_the_whole_share_and_stops_there(fleet):
    """The split is the replicas': one trigger (`--replicas 1`) admits up to the whole share by itself."""

    async def scenario():
        async with trigger(fleet.router, **SETTINGS) as (server, stub, _):
            await warm(stub)
            requests = burst_requests("c", BURST, 300)
            answers = await admit_at_once([(stub, request) for request in requests])
            admitted = [request for request, answer in zip(requests, answers, strict=True) if answer.admitted]
            return server.config.replicas, answers, await ranker_report(fleet.ranker, admitted[0])

    replicas, answers, load = asyncio.run(scenario())
    assert replicas == 1  # the default
    assert Counter(a.reason for a in answers) == {
        trigger_pb2.ADMIT_REASON_ADMITTED: 4, trigger_pb2.ADMIT_REASON_HBM_LIMIT: BURST - 4,
    }  # fmt: skip
    assert load.leased_bytes == 4 * PREFIX_BYTES <= SHARE_BYTES < 5 * PREFIX_BYTES
