"""The other rankers, as a ranker sees them: the ring the routers use, who owns a user without this ranker,
and when the routable members last changed.

A ranker takes the fleet's membership with the same flags and discovery as the trigger and the router
(`--rankers` or `--rankers-srv`, `services.affinity`), itself included, and checks every member's health
as they do. A user's **next owner** is the first routable member other than this one on the user's walk
of the ring: where the routers send the user while this ranker is away, so where a drain pushes the
user's entries; and, for a user the routers send to this ranker (its own arcs, and those of members
before it that are away), who served the user while it was away or before it joined, so where its miss
reads through. A member that leaves and comes back gets exactly its
arcs back (`AffinityRing`), and arcs depend only on names, so the two directions of a rolling restart, a
scale-out and a scale-in all meet the same peer. A ranker counts itself on the ring even before discovery
lists it (DNS lists a pod once it is Ready, and a ranker reads through from its start).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from services.affinity.membership import Member, Membership
from services.affinity.ring import AffinityRing


class Peers:
    def __init__(self, membership: Membership, instance: str, clock: Callable[[], float] = time.monotonic):
        self.membership = membership
        self.instance = instance
        self.clock = clock
        self.changed_at = clock()  # start-up counts as a change: a new member reads its users through
        self._routable: frozenset[str] = frozenset()
        self._with_self: AffinityRing | None = None

    @property
    def ring(self) -> AffinityRing:
        """The members' ring, with this ranker on it."""
        ring = self.membership.ring
        if self.instance in ring:
            return ring
        members = ring.members | {self.instance}
        if self._with_self is None or self._with_self.members != members:
            self._with_self = AffinityRing(members, virtual_nodes=ring.virtual_nodes)
        return self._with_self

    def next_owner(self, user_id: str) -> Member | None:
        """The first routable member other than this one on `user_id`'s walk of the ring."""
        members = self.membership.members
        for name in self.ring.walk(user_id):
            member = members.get(name)
            if name != self.instance and member is not None and member.routable:
                return member
        return None

    def source(self, user_id: str) -> Member | None:
        """Whom a miss of `user_id` asks: its next owner, when this ranker is where the routers send the user
        (the first member on its walk that is routable, or this one): a user of its own arcs, or of a member
        before it that is away. For a user that a routable member before it serves, nobody: that member
        pushes on its drain."""
        members = self.membership.members
        for name in self.ring.walk(user_id):
            if name == self.instance:
                return self.next_owner(user_id)
            member = members.get(name)
            if member is not None and member.routable:
                return None
        return None

    def since_change_s(self) -> float:
        """Seconds since start-up or the last change of the routable members (as this ranker saw it)."""
        routable = frozenset(m.name for m in self.membership.routable())
        if routable != self._routable:
            self._routable = routable
            self.changed_at = self.clock()
        return self.clock() - self.changed_at
