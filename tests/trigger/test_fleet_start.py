"""A fleet started as a new user starts it: three cpu-tiny rankers at once on this machine's cores, each
with its default settings (no --torch-threads), a router, and a trigger with `--slo-ms 10`.

Each ranker's torch pool is sized by the CPUs it may use, and the launcher gives each its share; still,
three rankers warming up on two cores hold each other's cores. A warm-up length whose wall time ran far
above its device thread's CPU time is measured again, and a curve still disturbed is served provisional,
which the trigger reads as unknown, not slow, and which the ranker measures again once it is idle. So,
however the warm-ups overlapped: an 8-event history is not worth relaying, the 2048- and 6000-event ones
are admitted (neither the rankers' backlog limit nor the trigger's brake refuses a prefix that could still
save its Rank something), and within a minute of idle time no curve is provisional. The same decisions hold
when every ranker serves its first curve provisional (a disturbed warm-up is served so at once).
"""

from __future__ import annotations

import grpc
import pytest

from relaygr.v1 import common_pb2, ranker_pb2, ranker_pb2_grpc, trigger_pb2, trigger_pb2_grpc
from services.common.cpus import cpu_budget
from services.launcher.fleet import ROUTER, TRIGGER, Fleet, FleetConfig, ranker_share
from tests.support.metrics import scrape, total
from tests.support.polling import wait_for

pytestmark = pytest.mark.slow

RANKERS = 3


def admit_request(user_id: str, length: int) -> trigger_pb2.AdmitRequest:
    return trigger_pb2.AdmitRequest(
        user_id=user_id,
        long_term=common_pb2.BehaviorSequence(
            item_ids=[(7919 + i * 104729) % 1_000_003 for i in range(length)],
            action_types=[i % 5 for i in range(length)],
        ),
        num_candidates=64,
        short_term_length=8,
    )


def provisional_now(address: str) -> bool:
    """Whether the ranker at `address` serves a provisional curve."""
    with grpc.insecure_channel(address) as channel:
        stub = ranker_pb2_grpc.RankerServiceStub(channel)
        return stub.GetProfile(ranker_pb2.GetProfileRequest(), timeout=10).provisional


def test_rankers_started_together_relay_long_histories_and_not_short_ones(tmp_path, monkeypatch):
    monkeypatch.delenv("RELAYGR_PROFILE_DISTURBED_RATIO", raising=False)  # the rankers' own default
    config = FleetConfig(
        rankers=RANKERS,
        model_preset="cpu-tiny",
        base_port=0,
        metrics_base_port=0,
        log_dir=str(tmp_path / "logs"),
        trigger_args="--slo-ms 10",
    )
    with Fleet(config) as fleet:
        with grpc.insecure_channel(fleet.address(ROUTER)) as channel:
            profile = ranker_pb2_grpc.RankerServiceStub(channel).GetProfile(
                ranker_pb2.GetProfileRequest(), timeout=10
            )
        with grpc.insecure_channel(fleet.address(TRIGGER)) as channel:
            trigger = trigger_pb2_grpc.TriggerServiceStub(channel)
            answers = {length: trigger.Admit(admit_request(f"user-{length}", length), timeout=10)
                       for length in (8, 2048, 6000)}  # fmt: skip
        threads = {name: scrape(fleet.children[name].metrics_port) for name in fleet.ranker_names}
        provisional = {name: provisional_now(fleet.address(name)) for name in fleet.ranker_names}
        wait_for(
            lambda: not any(provisional_now(fleet.address(name)) for name in fleet.ranker_names),
            60,
            "every ranker's curve measured again undisturbed",
        )

    curve = [(p.prefix_length, round(p.full_ms, 2)) for p in profile.latency_curve]
    decisions = {length: trigger_pb2.AdmitReason.Name(answer.reason) for length, answer in answers.items()}
    print(f"curve {curve}; provisional at start {provisional}; decisions {decisions}")
    assert profile.latency_curve[0].prefix_length == 16  # the anchor point, whatever the profile lengths
    share = ranker_share(cpu_budget().cpus, RANKERS)
    for name, samples in threads.items():
        assert total(samples, "relaygr_torch_threads", source="flag") == share, name
    assert answers[8].reason == trigger_pb2.ADMIT_REASON_NO_GAIN, decisions
    assert answers[2048].reason == trigger_pb2.ADMIT_REASON_ADMITTED, decisions
    assert answers[6000].reason == trigger_pb2.ADMIT_REASON_ADMITTED, decisions


def test_through_curves_served_provisional_at_once_the_break_even_holds(tmp_path, monkeypatch):
    """Every warm-up judged disturbed (a ratio no pass stays under): each ranker serves its first curve
    provisional at once, and the trigger still relays the long histories and not the 8-event one."""
    monkeypatch.setenv("RELAYGR_PROFILE_DISTURBED_RATIO", "1.0001")
    config = FleetConfig(
        rankers=RANKERS, model_preset="cpu-tiny", base_port=0, metrics_base_port=0,
        log_dir=str(tmp_path / "logs"), trigger_args="--slo-ms 10",
    )  # fmt: skip
    with Fleet(config) as fleet:
        provisional = {name: provisional_now(fleet.address(name)) for name in fleet.ranker_names}
        with grpc.insecure_channel(fleet.address(TRIGGER)) as channel:
            trigger = trigger_pb2_grpc.TriggerServiceStub(channel)
            answers = {length: trigger.Admit(admit_request(f"user-{length}", length), timeout=10)
                       for length in (8, 2048, 6000)}  # fmt: skip
    decisions = {length: trigger_pb2.AdmitReason.Name(answer.reason) for length, answer in answers.items()}
    assert all(provisional.values()), provisional
    assert answers[8].reason == trigger_pb2.ADMIT_REASON_NO_GAIN, decisions
    assert answers[2048].reason == trigger_pb2.ADMIT_REASON_ADMITTED, decisions
    assert answers[6000].reason == trigger_pb2.ADMIT_REASON_ADMITTED, decisions
