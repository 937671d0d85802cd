"""The local fleet launcher: everything starts healthy, a dead child is named, and nothing outlives it."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2

from relaygr.v1 import ranker_pb2, ranker_pb2_grpc, recommend_pb2, recommend_pb2_grpc
from services.common.config import load
from services.common.contract import RANKER_SERVICE
from services.common.cpus import cpu_budget
from services.launcher.demo import LauncherConfig
from services.launcher.fleet import ROUTER, STUB, TRIGGER, Fleet, FleetConfig, ServiceExited, ranker_share
from services.launcher.procs import REPO_ROOT, health_status
from services.ranker.config import RankerConfig

TINY_RANKERS = "--profile-lengths 32,128 --profile-repeats 1"
SMALL_UNIVERSE = "--history-max 256 --num-candidates 16 --rank-timeout-ms 20000"


def gone(pid: int) -> bool:
    """True when no process of the group `pid` led is left (each child leads its own group)."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def fleet_config(tmp_path, **overrides) -> FleetConfig:
    return FleetConfig(
        **{
            "rankers": 2, "model_preset": "cpu-tiny", "base_port": 0, "metrics_base_port": 0,
            "log_dir": str(tmp_path / "logs"), "ranker_args": TINY_RANKERS, "stub_args": SMALL_UNIVERSE,
            **overrides,
        }
    )  # fmt: skip


def test_the_fleet_passes_only_the_flags_it_sets(tmp_path):
    # Unset budgets and SLO are not passed: the ranker's and the trigger's own defaults apply.
    fleet = Fleet(fleet_config(tmp_path, ranker_args="--torch-threads 3"))
    fleet.ranker_route_args = lambda: ["--rankers", "ranker-0=127.0.0.1:1"]
    assert fleet._ranker_args("ranker-0") == [
        "--instance-name", "ranker-0", "--model-preset", "cpu-tiny", "--rankers", fleet.members(),
        "--torch-threads", "3",
    ]  # fmt: skip
    assert fleet._trigger_args() == ["--rankers", "ranker-0=127.0.0.1:1", "--reuse-port", "true"]
    fleet = Fleet(fleet_config(tmp_path, hbm_budget_mb=64.0, dram_budget_mb=-1.0, slo_ms=80.0))
    fleet.ranker_route_args = lambda: ["--router", "127.0.0.1:1"]
    assert fleet._ranker_args("ranker-1")[4:8] == ["--hbm-budget-mb", "64.0", "--dram-budget-mb", "-1.0"]
    assert fleet._trigger_args()[2:4] == ["--slo-ms", "80.0"]
    fleet = Fleet(fleet_config(tmp_path, relay_window_ms=45.0, stub_args=""))
    fleet.ranker_route_args = lambda: ["--router", "127.0.0.1:1"]
    fleet.address = lambda name: "127.0.0.1:2"
    # One relay window, given to both services that read it.
    assert fleet._trigger_args()[2:4] == ["--relay-window-ms", "45.0"]
    assert fleet._stub_args()[6:] == ["--relay-window-ms", "45.0"]
    launcher = load(LauncherConfig, ["--hbm-budget-mb", "32"], {"RELAYGR_SLO_MS": "90"})
    assert (launcher.hbm_budget_mb, launcher.dram_budget_mb, launcher.slo_ms) == (32.0, None, 90.0)


def test_each_local_ranker_gets_its_share_of_the_cpus(tmp_path):
    """Rankers started together, each sizing torch's pool by the whole host, would oversubscribe its cores:
    without --torch-threads in the ranker flags, each gets an equal share of the launcher's CPUs."""
    assert [ranker_share(2, rankers) for rankers in (1, 2, 3)] == [2, 1, 1]
    assert ranker_share(16, 3) == 5
    fleet = Fleet(fleet_config(tmp_path, rankers=2, ranker_args=""))
    share = str(ranker_share(cpu_budget().cpus, 2))
    for name in fleet.ranker_names:
        assert fleet._ranker_args(name)[-2:] == ["--torch-threads", share]


def test_every_ranker_is_given_every_member_spares_included_on_ports_picked_before_any_starts(tmp_path):
    """A ranker hands its prefixes off to, and reads misses through from, the members its --rankers lists:
    each must know them all when it starts, so their ports are picked before any ranker starts."""
    fleet = Fleet(fleet_config(tmp_path, rankers=2, spare_rankers=1))
    assert (fleet.ranker_names, fleet.member_names) == (
        ["ranker-0", "ranker-1"],
        ["ranker-0", "ranker-1", "ranker-2"],
    )
    members = dict(entry.split("=") for entry in fleet.members().split(","))
    assert list(members) == fleet.member_names
    ports = [int(address.removeprefix("127.0.0.1:")) for address in members.values()]
    assert all(ports) and len(set(ports)) == 3
    for name in fleet.member_names:
        args = fleet._ranker_args(name)
        assert args[args.index("--rankers") + 1] == fleet.members()
        assert load(RankerConfig, args, {}).static_members() == members
    fixed = Fleet(fleet_config(tmp_path, base_port=40000, metrics_base_port=41000, spare_rankers=1))
    assert fixed.members() == "ranker-0=127.0.0.1:40010,ranker-1=127.0.0.1:40011,ranker-2=127.0.0.1:40012"
    assert fixed._member_ports["ranker-2"] == (40012, 41012)
    with pytest.raises(ValueError, match="--spare-rankers has no device"):
        Fleet(fleet_config(tmp_path, devices="cuda:0,cuda:1", rankers=2, spare_rankers=1))
    fleet_config(tmp_path, base_port=65523).validate()  # the spares' ports must fit too
    with pytest.raises(ValueError, match="--base-port leaves no room"):
        Fleet(fleet_config(tmp_path, base_port=65523, spare_rankers=1))


def test_k_rankers_per_device_each_get_their_device_and_share_it(tmp_path):
    config = fleet_config(tmp_path, rankers=4, rankers_per_device=2, devices="cuda:0, cuda:1", ranker_args="")
    fleet = Fleet(config)
    args = {name: fleet._ranker_args(name) for name in fleet.ranker_names}
    assert [a[4:8] for a in args.values()] == [
        ["--device", device, "--device-sharers", "2"] for device in ("cuda:0", "cuda:0", "cuda:1", "cuda:1")
    ]
    ranker = load(RankerConfig, args["ranker-3"], {})
    assert (ranker.device, ranker.device_sharers, ranker.instance_name) == ("cuda:1", 2, "ranker-3")
    one_device = fleet_config(tmp_path, rankers=3, rankers_per_device=4, ranker_args="")
    assert Fleet(one_device)._ranker_args("ranker-2")[4:6] == ["--device-sharers", "4"]
    assert "--device" not in Fleet(fleet_config(tmp_path))._ranker_args("ranker-0")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"rankers": 3, "rankers_per_device": 2, "devices": "cuda:0,cuda:1"},
            r"--rankers must be .* = 4\), got 3",
        ),
        ({"rankers": 2, "devices": "cuda:0,,cuda:1"}, "--devices lists an empty device name"),
        ({"rankers": 5, "rankers_per_device": 4}, r"--rankers \(5\) share one device without --devices"),
    ],
)
def test_a_device_layout_that_does_not_add_up_is_refused_naming_the_flags(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        Fleet(fleet_config(tmp_path, **overrides))


def test_two_rankers_sharing_the_cpu_serve_as_ring_members_with_half_the_budgets_each(tmp_path):
    fleet = Fleet(fleet_config(tmp_path, rankers_per_device=2, devices="cpu"))
    endpoints = fleet.start()
    try:
        for name in fleet.ranker_names:
            text = urllib.request.urlopen(endpoints[name].metrics_url, timeout=10).read().decode()
            capacity = {
                tier: float(value)
                for tier, value in re.findall(r'relaygr_kv_cache_capacity_bytes\{tier="(\w+)"\} (\S+)', text)
            }
            assert capacity == {"hbm": 128 * 2**20, "dram": 512 * 2**20}  # cpu-tiny's 256 and 1024 MiB, /2
        with grpc.insecure_channel(fleet.address(ROUTER)) as channel:
            profile = ranker_pb2_grpc.RankerServiceStub(channel).GetProfile(
                ranker_pb2.GetProfileRequest(), timeout=30
            )
        assert list(profile.members) == fleet.ranker_names  # each its own member of the ring
        with grpc.insecure_channel(fleet.address(STUB)) as channel:
            stub = recommend_pb2_grpc.RecommendServiceStub(channel)
            answers = [
                stub.Recommend(recommend_pb2.RecommendRequest(user_id=f"user-{k}", top_k=3), timeout=30)
                for k in range(4)
            ]
        assert all(len(a.item_ids) == 3 and a.instance in fleet.ranker_names for a in answers)
    finally:
        fleet.stop()


def test_fleet_starts_healthy_restarts_a_ranker_detects_a_crash_and_stops_everything(tmp_path):
    fleet = Fleet(fleet_config(tmp_path))
    endpoints = fleet.start()
    try:
        assert list(endpoints) == ["ranker-0", "ranker-1", "router", "trigger", "retrieval-stub"]
        ports = {int(e.address.rsplit(":", 1)[1]) for e in endpoints.values()}
        assert len(ports | {e.metrics_port for e in endpoints.values()}) == 10
        assert all((tmp_path / "logs" / f"{name}.log").exists() for name in endpoints)
        with grpc.insecure_channel(fleet.address(STUB)) as channel:
            answer = recommend_pb2_grpc.RecommendServiceStub(channel).Recommend(
                recommend_pb2.RecommendRequest(user_id="user-1", top_k=3), timeout=30
            )
        assert len(answer.item_ids) == 3 and answer.instance in fleet.ranker_names

        fleet.kill_ranker("ranker-1")
        fleet.check()  # a ranker stopped on purpose is no crash
        restarted = fleet.restart_ranker("ranker-1")
        before = endpoints["ranker-1"]
        assert restarted.address == before.address and restarted.pid != before.pid
        assert health_status(restarted.address, RANKER_SERVICE) == health_pb2.HealthCheckResponse.SERVING
        fleet.check()

        os.kill(endpoints[TRIGGER].pid, signal.SIGKILL)
        fleet.children[TRIGGER].popen.wait(10)
        with pytest.raises(ServiceExited) as crashed:
            fleet.check()
        assert crashed.value.name == TRIGGER and crashed.value.returncode == -signal.SIGKILL
        assert "log tail" in str(crashed.value)
    finally:
        fleet.stop()
    assert all(gone(pid) for pid in [restarted.pid, *(e.pid for e in endpoints.values())])


def routable_members(fleet: Fleet) -> list[str]:
    """The members the router routes to now (its GetProfile's)."""
    with grpc.insecure_channel(fleet.address(ROUTER)) as channel:
        stub = ranker_pb2_grpc.RankerServiceStub(channel)
        return list(stub.GetProfile(ranker_pb2.GetProfileRequest(), timeout=30).members)


def test_a_spare_is_on_the_ring_unroutable_until_started_on_its_declared_address(tmp_path):
    """With a static member list a declared ranker that is down is on every ring but unroutable, so its
    users are with their next member; once started (a scale-out) it is routable at the address each
    member list gave it."""
    fleet = Fleet(fleet_config(tmp_path, rankers=1, spare_rankers=1))
    endpoints = fleet.start()
    try:
        assert list(endpoints) == ["ranker-0", "router", "trigger", "retrieval-stub"]
        assert routable_members(fleet) == ["ranker-0"]
        with grpc.insecure_channel(fleet.address(STUB)) as channel:
            stub = recommend_pb2_grpc.RecommendServiceStub(channel)
            request = recommend_pb2.RecommendRequest
            assert {
                stub.Recommend(request(user_id=f"u{k}", top_k=1), timeout=30).instance for k in range(8)
            } == {"ranker-0"}
            with pytest.raises(ValueError, match="not a spare"):
                fleet.start_ranker("ranker-0")
            spare = fleet.start_ranker("ranker-1")
            assert f"ranker-1={spare.address}" in fleet.members().split(",")
            deadline = time.monotonic() + 30  # the routing processes health-check members every second
            while routable_members(fleet) != fleet.member_names and time.monotonic() < deadline:
                time.sleep(0.2)
            assert routable_members(fleet) == ["ranker-0", "ranker-1"]
            instances = {
                stub.Recommend(request(user_id=f"u{k}", top_k=1), timeout=30).instance for k in range(40)
            }
            assert instances == {"ranker-0", "ranker-1"}
        fleet.check()
    finally:
        fleet.stop()
    assert all(gone(pid) for pid in [spare.pid, *(e.pid for e in endpoints.values())])


def test_a_ranker_that_lost_its_port_gets_new_ones_in_every_member_list(tmp_path):
    """A free port is picked before the ranker binds it; another process may take it meanwhile (here: a
    listening socket). The rankers then start again together with new ports for that one, so every
    member list names the same addresses."""
    fleet = Fleet(fleet_config(tmp_path, rankers=2))
    taken = int(fleet.members().split(",")[0].rsplit(":", 1)[1])
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        endpoints = fleet.start()
    try:
        assert endpoints["ranker-0"].address != f"127.0.0.1:{taken}"
        members = fleet.members().split(",")
        assert members == [f"{name}={endpoints[name].address}" for name in fleet.ranker_names]
        for name in fleet.ranker_names:  # what each ranker was started with
            args = fleet._launches[name].args
            assert args[args.index("--rankers") + 1] == ",".join(members)
        assert routable_members(fleet) == fleet.ranker_names
    finally:
        fleet.stop()


def launch(tmp_path, *flags: str) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "services.launcher", "--rankers", "1", "--model-preset", "cpu-tiny",
        "--base-port", "0", "--metrics-base-port", "0", "--log-dir", str(tmp_path / "logs"),
        "--ranker-args", TINY_RANKERS, "--stub-args", SMALL_UNIVERSE, "--demo-rps", "10", *flags,
    ]  # fmt: skip
    return subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_progress(launcher: subprocess.Popen, timeout_s: float = 120) -> dict[str, int]:
    """Reads the launcher's output until its first progress line; returns the table's pids by service."""
    pids: dict[str, int] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = launcher.stdout.readline()
        if not line:
            raise AssertionError(f"launcher ended early: {launcher.stderr.read()}")
        row = re.match(r"(\S+)\s+127\.0\.0\.1:\d+\s+http://127\.0\.0\.1:\d+/metrics\s+(\d+)$", line.strip())
        if row:
            pids[row.group(1)] = int(row.group(2))
        if "req/s" in line:
            return pids
    raise AssertionError("no progress line")


def test_sigterm_to_the_launcher_stops_every_child(tmp_path):
    launcher = launch(tmp_path)
    try:
        pids = wait_for_progress(launcher)
        assert set(pids) == {"ranker-0", "router", "trigger", "retrieval-stub"}
        launcher.send_signal(signal.SIGTERM)
        output, _ = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert launcher.returncode == 0
    assert "fleet stopped." in output
    assert all(gone(pid) for pid in pids.values())


def test_a_crashed_child_is_named_and_the_others_are_stopped(tmp_path):
    launcher = launch(tmp_path)
    try:
        pids = wait_for_progress(launcher)
        os.kill(pids["ranker-0"], signal.SIGKILL)
        _, errors = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert launcher.returncode == 1
    assert "ranker-0 exited with code -9" in errors and "log tail" in errors
    assert all(gone(pid) for pid in pids.values())


def test_the_launcher_ends_by_itself_after_its_duration(tmp_path):
    launcher = launch(tmp_path, "--duration-s", "2")
    output, errors = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, errors
    assert "req/s" in output and "fleet stopped." in output
    # The progress line counts every cache source, then the closing sentence says what the relay saved,
    # in figures that add up to what was ranked.
    (progress,) = re.findall(r"hbm (\d+) dram (\d+) extended (\d+) miss (\d+)(?: \(([^)]*)\))?", output)[-1:]
    hits, misses = sum(int(n) for n in progress[:3]), int(progress[3])
    if misses:  # each miss says why: the reasons' counts add up to the misses
        assert sum(int(n) for n in re.findall(r"(\d+)", progress[4])) == misses, progress
    summary = re.search(
        r"^relay: (\d+) of (\d+) Ranks \(\d+%\) reused a cached prefix, [\d,]+ of [\d,]+ long-term"
        r" events \(\d+%\) not recomputed on the critical path",
        output,
        re.M,
    )
    assert summary, output
    assert (int(summary.group(1)), int(summary.group(2))) == (hits, hits + misses)
    # With the rankers' curve (GetProfile through the router), each cached Rank is set against its own
    # history ranked without the cache, and the time saved is said.
    if hits:
        saved = re.search(
            r"without the cache would have added ([\d.]+) ms .* relay took ([\d,.]+) s off", output
        )
        assert saved and float(saved.group(1)) >= 0, output
