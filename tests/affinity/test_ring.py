"""AffinityRing: stable placement, ~1/N movement, arcs that come back, deterministic bounded-load spill."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.affinity.ring import AffinityRing, Placement, load_bound, stable_hash
from services.launcher.procs import REPO_ROOT

USERS = [f"user-{i}" for i in range(20_000)]


def names(n: int) -> list[str]:
    return [f"ranker-{i}" for i in range(n)]


def owners(ring: AffinityRing, users: list[str] = USERS) -> dict[str, str]:
    return {user: ring.owner(user) for user in users}


def test_stable_hash_is_pinned() -> None:
    # Pinned values: a change here would move every user of every deployed ring.
    assert stable_hash("user-1") == 0x9AAC5A86_21EAE188
    assert stable_hash("ranker-0#0") == 0x17499213_159B885E


def test_placement_is_identical_in_another_process_with_another_hash_seed() -> None:
    script = (
        "import json; from services.affinity.ring import AffinityRing;"
        "ring = AffinityRing(['ranker-2', 'ranker-0', 'ranker-1'], virtual_nodes=160);"
        "print(json.dumps({f'user-{i}': ring.owner(f'user-{i}') for i in range(500)}))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    here = owners(AffinityRing(names(3)), [f"user-{i}" for i in range(500)])
    assert json.loads(out) == here
    assert set(here.values()) == set(names(3))


def test_insertion_order_does_not_matter() -> None:
    assert owners(AffinityRing(names(5))) == owners(AffinityRing(reversed(names(5))))


def test_load_spreads_over_members() -> None:
    counts = {name: 0 for name in names(4)}
    for owner in owners(AffinityRing(names(4))).values():
        counts[owner] += 1
    # 160 virtual nodes keep every share within a modest factor of the fair 1/4.
    assert all(0.7 * len(USERS) / 4 < count < 1.3 * len(USERS) / 4 for count in counts.values()), counts


@pytest.mark.parametrize("n", [3, 5, 8])
def test_adding_one_member_moves_about_one_nth_only_to_it(n: int) -> None:
    ring = AffinityRing(names(n))
    before = owners(ring)
    ring.add(f"ranker-{n}")
    after = owners(ring)
    moved = [user for user in USERS if before[user] != after[user]]
    assert 0.5 / (n + 1) < len(moved) / len(USERS) < 1.6 / (n + 1)
    assert {after[user] for user in moved} == {f"ranker-{n}"}


@pytest.mark.parametrize("n", [3, 5, 8])
def test_removing_one_member_moves_only_its_users(n: int) -> None:
    ring = AffinityRing(names(n))
    before = owners(ring)
    ring.remove("ranker-1")
    after = owners(ring)
    moved = [user for user in USERS if before[user] != after[user]]
    assert 0.5 / n < len(moved) / len(USERS) < 1.6 / n
    assert all(before[user] == "ranker-1" for user in moved)
    assert "ranker-1" not in after.values()


def test_a_removed_member_gets_exactly_its_arc_back() -> None:
    ring = AffinityRing(names(5))
    before = owners(ring)
    ring.remove("ranker-3")
    assert owners(ring) != before
    ring.add("ranker-3")
    assert owners(ring) == before


def test_walk_lists_every_member_once_owner_first() -> None:
    ring = AffinityRing(names(6), virtual_nodes=8)
    for user in USERS[:200]:
        walk = list(ring.walk(user))
        assert sorted(walk) == sorted(names(6))
        assert walk[0] == ring.owner(user)


def test_empty_ring_places_nothing() -> None:
    ring = AffinityRing()
    assert ring.owner("u") is None
    assert ring.place("u", {}) is None
    assert AffinityRing(names(2)).place("u", {"not-a-member": 0}) is None


def test_load_bound_matches_the_paper() -> None:
    assert load_bound(0, 3, 1.25, floor=0) == 1
    assert load_bound(11, 3, 1.25, floor=0) == 5  # ceil(1.25 * 12 / 3)
    assert load_bound(99, 4, 1.0, floor=0) == 25
    # The router's default floor keeps a member from spilling below four requests in flight.
    assert load_bound(0, 3, 1.25) == 4 and load_bound(99, 4, 1.0) == 25


def test_owner_under_the_bound_keeps_the_user() -> None:
    ring = AffinityRing(names(3))
    owner = ring.owner("alice")
    assert ring.place("alice", dict.fromkeys(names(3), 0)) == Placement(owner, spilled=False)


def test_owner_at_the_bound_spills_to_the_next_member_clockwise() -> None:
    ring = AffinityRing(names(3), load_factor=1.25)
    first, second, third = ring.walk("alice")
    loads = {first: 5, second: 0, third: 0}  # bound = ceil(1.25 * 6 / 3) = 3
    assert ring.place("alice", loads) == Placement(second, spilled=True)
    loads = {first: 6, second: 6, third: 0}  # bound = ceil(1.25 * 13 / 3) = 6
    assert ring.place("alice", loads) == Placement(third, spilled=True)


def test_unusable_members_are_skipped_without_counting_as_spill() -> None:
    ring = AffinityRing(names(3))
    first, second, _ = ring.walk("alice")
    usable = {name: 0 for name in names(3) if name != first}
    assert ring.place("alice", usable) == Placement(second, spilled=False)


@settings(max_examples=200, deadline=None)
@given(
    loads=st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=8),
    key=st.text(min_size=1, max_size=20),
    factor=st.floats(min_value=1.0, max_value=3.0),
)
def test_bounded_placement_respects_the_bound_and_is_deterministic(
    loads: list[int], key: str, factor: float
) -> None:
    ring = AffinityRing(names(len(loads)), virtual_nodes=16, load_factor=factor)
    in_flight = dict(zip(names(len(loads)), loads, strict=True))
    placement = ring.place(key, in_flight)
    bound = load_bound(sum(loads), len(loads), factor)
    assert placement is not None
    assert in_flight[placement.member] < bound
    walk = list(ring.walk(key))
    # Every member before the chosen one on the walk was at or above the bound.
    assert all(in_flight[name] >= bound for name in walk[: walk.index(placement.member)])
    assert placement.spilled == (placement.member != walk[0])
    assert (
        AffinityRing(reversed(names(len(loads))), virtual_nodes=16, load_factor=factor).place(key, in_flight)
        == placement
    )


def test_a_burst_of_concurrent_requests_never_exceeds_the_bound() -> None:
    factor = 1.25
    ring = AffinityRing(names(4), load_factor=factor, load_floor=0)  # the pure bound
    in_flight = dict.fromkeys(names(4), 0)
    # One hot user: without the bound every request would land on its owner.
    for total in range(400):
        placement = ring.place("hot-user", in_flight)
        in_flight[placement.member] += 1
        assert max(in_flight.values()) <= math.ceil(factor * (total + 1) / 4)
    assert min(in_flight.values()) > 0
