"""Ring arithmetic of the handoff, against the routers' own placement: a drained member's users go to the
member the routers now send them to (the owner in the ring without it), and a returning member reads back
exactly its arcs, from that same member."""

from __future__ import annotations

import types

from hypothesis import given, settings
from hypothesis import strategies as st

from services.affinity.ring import AffinityRing
from services.ranker.handoff.peers import Peers

NAMES = ["ranker-0", "ranker-1", "ranker-2", "ranker-3"]


def membership(routable: set[str]) -> types.SimpleNamespace:
    """A fleet's membership as `Peers` reads it: every name on the ring, `routable` the healthy ones."""
    members = {name: types.SimpleNamespace(name=name, routable=name in routable) for name in NAMES}
    return types.SimpleNamespace(
        ring=AffinityRing(NAMES),
        members=members,
        routable=lambda: [m for m in members.values() if m.routable],
    )


users = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=50)


@settings(max_examples=50, deadline=None)
@given(users=users, away=st.sampled_from(NAMES))
def test_a_drained_member_pushes_each_user_where_the_routers_now_send_it(users, away):
    others = set(NAMES) - {away}
    peers = Peers(membership(others), instance=away)  # draining: no longer routable
    without = AffinityRing(others)
    router = AffinityRing(NAMES)  # the routers keep every member on the ring, skipping the unroutable
    for user in users:
        target = peers.next_owner(user).name
        assert target == without.owner(user) == router.place(user, dict.fromkeys(others, 0)).member


@settings(max_examples=50, deadline=None)
@given(users=users, returning=st.sampled_from(NAMES))
def test_a_returning_member_reads_back_its_own_arcs_from_who_served_them(users, returning):
    peers = Peers(membership(set(NAMES)), instance=returning)
    ring, without = AffinityRing(NAMES), AffinityRing(set(NAMES) - {returning})
    for user in users:
        source = peers.source(user)
        if ring.owner(user) == returning:  # its arcs are back: read from the owner without it
            assert source.name == without.owner(user)
        else:  # another member's user: it never left that member, nothing to read
            assert source is None and without.owner(user) == ring.owner(user)


@settings(max_examples=20, deadline=None)
@given(users=users)
def test_a_ranker_not_yet_listed_by_discovery_counts_itself_on_the_ring(users):
    """DNS lists a pod once it is Ready: a ranker reads its arcs through from its start all the same."""
    listed = membership(set(NAMES) - {"ranker-3"})
    listed.ring = AffinityRing(set(NAMES) - {"ranker-3"})
    listed.members.pop("ranker-3")
    peers, full = Peers(listed, instance="ranker-3"), Peers(membership(set(NAMES)), instance="ranker-3")
    for user in users:
        assert name(peers.source(user)) == name(full.source(user))
    assert any(peers.source(f"user-{i}") is not None for i in range(100))  # it has arcs of its own


def name(member) -> str | None:
    return None if member is None else member.name


@settings(max_examples=50, deadline=None)
@given(users=users, returning=st.sampled_from(NAMES), away=st.sampled_from(NAMES))
def test_a_returning_member_reads_back_the_users_of_a_member_before_it_that_is_away(users, returning, away):
    """A declared member that is down (a spare not started, a ranker restarting) leaves its users with the
    next routable member: a ranker coming back reads those through too, from where the routers sent them."""
    if away == returning:
        return
    up = set(NAMES) - {away}
    peers = Peers(membership(up), instance=returning)
    router = AffinityRing(NAMES)
    for user in users:
        routed = router.place(user, dict.fromkeys(up, 0)).member  # where the routers send it now
        meanwhile = router.place(user, dict.fromkeys(up - {returning}, 0)).member  # while it was away
        source = peers.source(user)
        assert name(source) == (meanwhile if routed == returning else None)


def test_with_no_other_member_routable_there_is_no_owner():
    peers = Peers(membership({"ranker-0"}), instance="ranker-0")
    assert peers.next_owner("anyone") is None


def test_a_change_of_the_routable_members_restarts_the_grace_window():
    now = [100.0]
    fleet = membership(set(NAMES))
    peers = Peers(fleet, instance="ranker-0", clock=lambda: now[0])
    assert peers.since_change_s() == 0.0
    now[0] = 130.0
    assert peers.since_change_s() == 30.0
    fleet.members["ranker-2"].routable = False
    assert peers.since_change_s() == 0.0
    now[0] = 135.0
    assert peers.since_change_s() == 5.0
