"""The admission policy and the fleet view it brakes on, driven by a fake clock and real load reports."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from services.trigger.admission import Brake, Prefix, Reason
from services.trigger.fleet_load import FleetLoad
from tests.trigger.policy import LIMITS, MIB, RANKERS, Clock, make, prefix, report, user_on


def test_relay_is_admitted_when_it_pays_and_refused_when_it_does_not():
    policy, _, _ = make()
    assert policy.decide(prefix("long", miss_ms=40.0)).reason is Reason.ADMITTED
    # The prefix's computation costs no more than the round trip (2.0 ms), however long the miss.
    short = dataclasses.replace(prefix("short", length=64), miss_ms=30.0, gain_ms=2.0, pre_infer_ms=2.5)
    assert policy.decide(short).reason is Reason.NO_GAIN
    barely = dataclasses.replace(short, key="barely", gain_ms=2.01, pre_infer_ms=2.51)
    assert policy.decide(barely).reason is Reason.ADMITTED


def test_a_duplicate_gets_the_remembered_instance_until_its_window_ends():
    policy, _, clock = make()
    first = prefix("u1")
    assert policy.decide(first).admitted
    assert policy.decide(first).reason is Reason.DUPLICATE
    assert policy.decide(first).relay_instance == ""  # the PreInfer has not answered yet
    policy.answered(first.key, "ranker-a", held=True)
    again = policy.decide(first)
    assert (again.reason, again.relay_instance) == (Reason.DUPLICATE, "ranker-a")
    clock.now += LIMITS.duplicate_window_s
    assert policy.decide(first).admitted


def test_a_refused_prefix_may_be_tried_again_and_its_reservation_is_released():
    policy, fleet, _ = make()
    target = fleet.target("u1")
    first = prefix("u1")
    assert policy.decide(first).admitted
    assert fleet.pre_infer_backlog_ms(target) == pytest.approx(first.pre_infer_ms)
    assert fleet.leased_bytes(target) == first.nbytes
    policy.answered(first.key, "", held=False)
    assert fleet.pre_infer_backlog_ms(target) == 0.0
    assert fleet.leased_bytes(target) == 0
    assert policy.decide(first).admitted


def test_before_any_report_the_hbm_brake_binds_at_the_profiles_capacity():
    """No PreInfer has answered yet, so no ranker has reported its HBM: the fleet profile's capacity
    (64 MiB, a share of 32) bounds the unanswered admissions (8 MiB each)."""
    policy, fleet, _ = make()
    user = user_on(fleet, "ranker-a")
    reasons = [policy.decide(prefix(user, length=8192, seq=seq)).reason for seq in range(6)]
    assert reasons == [Reason.ADMITTED] * 4 + [Reason.HBM_LIMIT] * 2
    assert fleet.unanswered_bytes("ranker-a") == 4 * 8192 * 1024
    unknown = FleetLoad(waste_window_s=10.0)
    unknown.set_members(RANKERS)
    assert unknown.hbm_capacity_bytes("ranker-a") == 0  # no profile yet: unknown
    fleet.observe(report("ranker-a", hbm_capacity_bytes=16 * MIB))
    assert fleet.hbm_capacity_bytes("ranker-a") == 16 * MIB  # its own report wins


def test_the_hbm_brake_reads_the_bytes_the_ranker_reports_and_lets_them_age_out():
    policy, fleet, clock = make()
    a = "ranker-a"
    # 30 of the 32 MiB this trigger may lease on ranker-a (half of 64 MiB) are held.
    fleet.observe(report(a, leased_bytes=30 * MIB))
    user = user_on(fleet, a)
    decision = policy.decide(prefix(user, length=4096))  # 4 MiB more
    assert decision.reason is Reason.HBM_LIMIT
    assert policy.pressure[Brake.HBM] == pytest.approx(34 / 32)
    # ranker-b has room: the brake is the target's, not the fleet's.
    assert policy.decide(prefix(user_on(fleet, "ranker-b"), length=4096)).admitted
    # Half the lease TTL later at most half of those bytes can still be leased.
    clock.now += 1.5
    assert fleet.leased_bytes(a) == 15 * MIB
    assert policy.decide(prefix(user, length=4096, seq=1)).admitted


def test_the_backlog_brake_drains_at_real_time():
    policy, fleet, clock = make()
    a = "ranker-a"
    fleet.observe(report(a, pre_infer_backlog_ms=400.0))
    user = user_on(fleet, a)
    # 400 ms queued ahead: the prefix would not start before its Rank.
    assert policy.decide(prefix(user, miss_ms=40.0)).reason is Reason.BACKLOG_LIMIT
    clock.now += 0.05  # 50 ms of device time later, 350 are left
    assert fleet.pre_infer_backlog_ms(a) == pytest.approx(350.0)
    # 350 + its own 32 would pass the limit, but it starts in time: it saves its Rank what it finishes.
    assert policy.decide(prefix(user, miss_ms=40.0, seq=1)).admitted
    # Its own cost now counts until the ranker answers with a report that includes it.
    assert fleet.pre_infer_backlog_ms(a) == pytest.approx(350.0 + 32.0)


def test_the_waste_brake_refuses_every_request_once_the_budget_is_spent():
    policy, fleet, clock = make()
    for name in RANKERS:
        fleet.observe(report(name, pre_infer_wasted_ms=0.0))
    clock.now += 2.0
    # Each ranker wasted 300 ms of the last 2 s: 15 % of its device time, over the 10 % budget.
    for name in RANKERS:
        fleet.observe(report(name, pre_infer_wasted_ms=300.0))
    assert fleet.wasted_share() == pytest.approx(0.15)
    urgent = prefix("urgent", length=8192, miss_ms=500.0)  # must relay: its miss alone breaks the SLO
    decision = policy.decide(urgent)
    assert (decision.reason, decision.must_relay) == (Reason.WASTE_LIMIT, True)
    # No more waste for 10 s: the window moves on and the share falls.
    clock.now += 10.0
    for name in RANKERS:
        fleet.observe(report(name, pre_infer_wasted_ms=300.0))
    assert fleet.wasted_share() < LIMITS.waste_budget
    assert policy.decide(urgent).admitted


def test_under_pressure_the_shortest_prefixes_are_shed_first_and_must_relay_ones_never():
    policy, fleet, clock = make()
    a = "ranker-a"
    users = iter(f"u{i}" for i in range(100_000) if fleet.target(f"u{i}") == a)

    def tick(leased_mib: float = 28.0, **fields) -> None:
        clock.now += LIMITS.adjust_s
        fleet.observe(report(a, leased_bytes=int(leased_mib * MIB), **fields))

    fleet.observe(report(a, leased_bytes=28 * MIB))
    first = prefix(next(users))
    assert policy.decide(first).admitted  # pressure (28 + 2) / 32 MiB = 0.94, nothing shed yet
    assert policy.pressure[Brake.HBM] == pytest.approx(30 / 32)
    policy.answered(first.key, a, held=True)
    tick()
    assert policy.decide(prefix(next(users), length=64, miss_ms=10.0)).reason is Reason.SHED_SHORT
    assert policy.threshold_events == 256
    for _ in range(3):  # the pressure stays high: the threshold keeps rising
        tick()
        policy.decide(prefix(next(users), length=64, miss_ms=10.0))
    assert policy.threshold_events == 2048
    fleet.observe(report(a, leased_bytes=26 * MIB))
    assert policy.decide(prefix(next(users), length=1024, miss_ms=20.0)).reason is Reason.SHED_SHORT
    assert policy.decide(prefix(next(users), length=4096, miss_ms=60.0)).admitted
    # A request whose queue wait plus miss exceeds the SLO is exempt from shedding.
    fleet.observe(report(a, leased_bytes=20 * MIB, rank_backlog_ms=90.0))
    urgent = policy.decide(prefix(next(users), length=1024, miss_ms=20.0))
    assert (urgent.reason, urgent.must_relay) == (Reason.ADMITTED, True)
    # The pressure lifts: after one more rise for the interval that was still pressed, the threshold
    # falls back step by step, to nothing.
    thresholds = []
    for _ in range(7):
        tick(leased_mib=0.0)
        policy.decide(prefix(next(users), length=64, miss_ms=10.0))
        thresholds.append(policy.threshold_events)
    assert thresholds == [4096, 2048, 1024, 512, 256, 0, 0]
    assert policy.decide(prefix(next(users), length=300, miss_ms=10.0)).admitted


def test_a_pre_inference_backlog_sheds_nothing_and_refuses_only_beyond_its_limit():
    # A prefix queued behind others is still computed off the critical path, or joined by its Rank: the
    # backlog never raises the shedding threshold, which would only turn those relays into misses.
    policy, fleet, clock = make()
    a = "ranker-a"
    users = iter(f"u{i}" for i in range(100_000) if fleet.target(f"u{i}") == a)
    for _ in range(5):
        clock.now += LIMITS.adjust_s
        fleet.observe(report(a, pre_infer_backlog_ms=360.0))
        decision = policy.decide(prefix(next(users), length=64, miss_ms=10.0))
        assert decision.reason is Reason.ADMITTED
        assert policy.pressure[Brake.BACKLOG] >= LIMITS.high_water  # 360 ms + the admitted 8 ms each
    assert policy.threshold_events == 0
    assert policy.decide(prefix(next(users), miss_ms=60.0)).reason is Reason.BACKLOG_LIMIT  # 360 + 40 ahead


def test_admit_all_skips_the_gain_test_and_every_brake():
    policy, fleet, _ = make(dataclasses.replace(LIMITS, admit_all=True))
    a = "ranker-a"
    fleet.observe(report(a, leased_bytes=64 * MIB, pre_infer_backlog_ms=10_000.0))
    short = dataclasses.replace(prefix(user_on(fleet, a), length=8), miss_ms=1.0, gain_ms=0.01)
    assert policy.decide(short).admitted
    assert policy.decide(short).reason is Reason.DUPLICATE


def test_users_are_placed_on_the_routers_ring_and_leavers_are_forgotten():
    _, fleet, _ = make()
    targets = {fleet.target(f"user-{i}") for i in range(200)}
    assert targets == set(RANKERS)
    fleet.observe(report("ranker-b", pre_infer_backlog_ms=100.0))
    fleet.set_members(["ranker-a"])
    assert {fleet.target(f"user-{i}") for i in range(50)} == {"ranker-a"}
    assert fleet.pre_infer_backlog_ms("ranker-b") == 0.0
    fleet.set_members([])
    assert fleet.target("user-1") == ""


@settings(max_examples=60, deadline=None)
@example([(8192, "ranker-a", 0.0, False)] * 6)  # no report yet: the profile's capacity binds
@example(  # an unanswered admission expires in the decision that admits the next one
    [(1, "ranker-a", 0.0, False)] * 4 + [(1, "ranker-a", 0.5, False)] * 3
    + [(5333, "ranker-a", 0.0, False), (153, "ranker-a", 0.5, True), (4161, "ranker-a", 0.25, False),
       (7972, "ranker-a", 0.25, True), (4892, "ranker-a", 0.5, False)]
)  # fmt: skip
@given(
    st.lists(
        st.tuples(st.integers(1, 8192), st.sampled_from(RANKERS), st.floats(0, 0.5), st.booleans()),
        min_size=1,
        max_size=60,
    )
)
def test_admissions_never_lease_more_than_the_share_of_a_rankers_hbm(steps):
    """Every admission fits in the share with what the ranker holds and what is unanswered, both counted
    here, independently of the trigger: the ranker's holding as its last report stated it, aged as the
    report's contract says (linearly to zero over its lease TTL), and every admission to it whose PreInfer
    has not answered and whose duplicate window is still open, this one included. (Read back from the
    trigger's own `FleetLoad`, an over-lease from forgetting unanswered admissions would pass unseen.)"""
    policy, fleet, clock = make()
    share = LIMITS.hbm_lease_fraction * 64 * MIB
    ttl_s = report("x").lease_ttl_ms / 1000
    reported = {name: (0, clock.now) for name in RANKERS}  # (leased bytes, when) of each last report
    unanswered: dict[str, list[tuple[float, int]]] = {name: [] for name in RANKERS}  # (expires at, bytes)
    for number, (length, member, wait_s, answer) in enumerate(steps):
        clock.now += wait_s
        user = user_on(fleet, member, start=number * 10_000)
        item = prefix(user, length=length, miss_ms=5.0 + length / 100)
        decision = policy.decide(item)
        if not decision.admitted:
            continue
        unanswered[member] = [(until, nbytes) for until, nbytes in unanswered[member] if until > clock.now]
        unanswered[member].append((clock.now + LIMITS.duplicate_window_s, item.nbytes))
        leased, at = reported[member]
        holds = leased * max(0.0, 1.0 - (clock.now - at) / ttl_s)
        waiting = sum(nbytes for _, nbytes in unanswered[member])
        assert holds + waiting <= share + 1  # (the trigger rounds the aged bytes to whole ones)
        if answer:
            # The ranker now holds its leases (aged as reported) and this prefix, and says so.
            unanswered[member].pop()
            reported[member] = (round(holds) + item.nbytes, clock.now)
            policy.answered(item.key, member, held=True)
            fleet.observe(report(member, leased_bytes=reported[member][0]))


WINDOW = dataclasses.replace(LIMITS, relay_window_ms=100.0)


def test_a_prefix_its_owner_cannot_have_ready_in_the_window_goes_to_the_next_member():
    """Placement by the rankers' reported queues: the prefix (32 ms here) stays on its owner while the
    owner's Ranks and pre-inference queued before it leave it ready within the window (100 ms), and goes to
    the next member along the user's walk otherwise, if that one can have it ready; the reservation and
    the brakes follow it there."""
    policy, fleet, _ = make(WINDOW)
    user = user_on(fleet, "ranker-a")
    fleet.observe(report("ranker-a", pre_infer_backlog_ms=60.0, rank_backlog_ms=8.0))  # 100 ms: ready in time
    decision = policy.decide(prefix(user, seq=0))
    assert (decision.reason, decision.target) == (Reason.ADMITTED, "ranker-a")

    fleet.observe(report("ranker-a", pre_infer_backlog_ms=60.0, rank_backlog_ms=10.0))  # 32 reserved: 134
    busy = fleet.pre_infer_backlog_ms("ranker-a")
    decision = policy.decide(prefix(user, seq=1))
    assert (decision.reason, decision.target) == (Reason.ADMITTED, "ranker-b")
    assert fleet.pre_infer_backlog_ms("ranker-b") == pytest.approx(32.0)
    assert fleet.pre_infer_backlog_ms("ranker-a") == pytest.approx(busy)

    # Both too busy: the owner keeps it (spilling would only move the overload).
    fleet.observe(report("ranker-b", pre_infer_backlog_ms=90.0))
    decision = policy.decide(prefix(user, seq=2))
    assert (decision.reason, decision.target) == (Reason.ADMITTED, "ranker-a")

    # The brakes read the member placed on: ranker-b's HBM full refuses the prefix that would go there.
    other = user_on(fleet, "ranker-a", start=int(user[1:]) + 1)
    fleet.observe(report("ranker-b", leased_bytes=32 * MIB))
    assert policy.decide(prefix(other)).reason is Reason.HBM_LIMIT


def test_without_a_window_every_prefix_stays_on_its_owner():
    policy, fleet, _ = make()  # relay_window_ms 0
    user = user_on(fleet, "ranker-a")
    fleet.observe(report("ranker-a", pre_infer_backlog_ms=300.0, rank_backlog_ms=100.0))
    decision = policy.decide(prefix(user))
    assert (decision.reason, decision.target) == (Reason.ADMITTED, "ranker-a")


@settings(max_examples=200, deadline=None)
@given(
    backlog_a=st.floats(0, 400),
    backlog_b=st.floats(0, 400),
    ranks_a=st.floats(0, 100),
    cost=st.floats(1, 150),
)
def test_placement_keeps_the_owner_unless_another_member_is_ready_in_time_and_the_owner_is_not(
    backlog_a, backlog_b, ranks_a, cost
):
    fleet = FleetLoad(waste_window_s=10.0, clock=Clock())
    fleet.set_members(RANKERS)
    user = user_on(fleet, "ranker-a")
    fleet.observe(report("ranker-a", pre_infer_backlog_ms=backlog_a, rank_backlog_ms=ranks_a))
    fleet.observe(report("ranker-b", pre_infer_backlog_ms=backlog_b))
    placed = fleet.place(user, cost, 100.0)
    owner_in_time = ranks_a + backlog_a + cost <= 100.0
    other_in_time = backlog_b + cost <= 100.0
    assert placed == ("ranker-b" if other_in_time and not owner_in_time else "ranker-a")
    assert fleet.place(user, cost, 0.0) == "ranker-a"


def test_an_unknown_curve_relays_by_length_and_does_not_brake_on_its_predictions():
    """A provisional curve's figures may be far too slow: read as unknown, the gain test relays histories of
    at least `unknown_curve_min_events`, the backlog brake does not press, and nothing must relay."""
    policy, fleet, _ = make()
    a = "ranker-a"
    fleet.observe(report(a, pre_infer_backlog_ms=10_000.0))  # reported by the slow curve
    users = iter(f"u{i}" for i in range(100_000) if fleet.target(f"u{i}") == a)

    def unknown(length: int, miss_ms: float) -> Prefix:
        return dataclasses.replace(prefix(next(users), length=length, miss_ms=miss_ms), curve_known=False)

    minimum = LIMITS.unknown_curve_min_events
    assert policy.decide(unknown(8, miss_ms=500.0)).reason is Reason.NO_GAIN  # a slow curve's big "gain"
    assert policy.decide(unknown(minimum - 1, miss_ms=500.0)).reason is Reason.NO_GAIN
    for length in (minimum, 2048, 6000):
        decision = policy.decide(unknown(length, miss_ms=5000.0))  # 4 s of pre-inference, on that curve
        assert (decision.reason, decision.must_relay) == (Reason.ADMITTED, False)
    assert policy.pressure[Brake.BACKLOG] == 0.0
    # The same prefixes on a known curve: the backlog reported stands.
    assert policy.decide(prefix(next(users), length=2048)).reason is Reason.BACKLOG_LIMIT
