"""Which member serves a request, and why: the routing policy (the router's, and a directly routing
trigger's or stub's), free of transport.

Order of preference for a request of user `u` carrying relay hint `h` (the `instance` its PreInfer named):
1. `hint`: the member named `h`, while it is routable — the prefix cache lives there, whatever the ring
   or the loads say now.
2. The ring among routable members with bounded load (see `ring`): `affinity` when the user's first
   routable member takes it, `spill` when bounded load moved it clockwise. A hint naming an unknown or
   unroutable member records `hint_unavailable` instead.
3. `failover`: after UNAVAILABLE, the first routable member clockwise on the user's walk other than the one
   that failed, regardless of load (ranking is idempotent: the new member recomputes).

A PreInfer that the trigger placed itself (on another member than the owner when the owner's queues could
not have the prefix ready in time, `services/trigger/fleet_load.py`) goes to that member while it is
routable (`place`: `affinity` or `spill`); the Rank then follows it by its hint.

With `--routing-policy random` (an ablation: relay without affinity) steps 1 and 2 are replaced by a
uniform draw among the routable members (`random`), which ignores both the hint and the ring.

Each branch is a `RoutingDecision`, whose value is the `decision` label of ROUTER_DECISIONS.
"""

from __future__ import annotations

import dataclasses
import enum
import random

from services.affinity.membership import Member, Membership
from services.affinity.settings import ROUTING_POLICIES
from services.common.errors import Unavailable


class RoutingDecision(enum.StrEnum):
    AFFINITY = "affinity"
    HINT = "hint"
    SPILL = "spill"
    FAILOVER = "failover"
    HINT_UNAVAILABLE = "hint_unavailable"
    RANDOM = "random"


@dataclasses.dataclass(frozen=True)
class Route:
    member: Member
    decision: RoutingDecision


class RoutingPolicy:
    """Chooses members from the live membership; reads the in-flight counts that the client keeps."""

    def __init__(
        self, membership: Membership, policy: str = "affinity", rng: random.Random | None = None
    ) -> None:
        if policy not in ROUTING_POLICIES:
            raise ValueError(f"routing policy must be one of {', '.join(ROUTING_POLICIES)}")
        self.membership = membership
        self.random = policy == "random"
        self._rng = rng or random.Random()

    def choose(self, user_id: str, hint: str = "") -> Route:
        """The member for a request; raises Unavailable when no member is routable."""
        if self.random:
            routable = self.membership.routable()
            if not routable:
                raise Unavailable(f"no healthy ranker among {len(self.membership.members)} members")
            return Route(self._rng.choice(routable), RoutingDecision.RANDOM)
        if hint:
            hinted = self.membership.get(hint)
            if hinted is not None and hinted.routable:
                return Route(hinted, RoutingDecision.HINT)
        loads = {member.name: member.in_flight for member in self.membership.routable()}
        placement = self.membership.ring.place(user_id, loads)
        if placement is None:
            raise Unavailable(f"no healthy ranker among {len(self.membership.members)} members")
        if hint:
            decision = RoutingDecision.HINT_UNAVAILABLE
        else:
            decision = RoutingDecision.SPILL if placement.spilled else RoutingDecision.AFFINITY
        return Route(self.membership.members[placement.member], decision)

    def place(self, user_id: str, member: str) -> Route:
        """A call its caller placed on `member` (the trigger's PreInfer, placed by the rankers' queues):
        `affinity` when that is the user's first routable member, `spill` otherwise; when `member` is not
        routable (or under `random`), the policy chooses as for any request."""
        chosen = self.membership.get(member)
        if self.random or chosen is None or not chosen.routable:
            return self.choose(user_id)
        first = next((name for name in self.membership.ring.walk(user_id) if self._routable(name)), None)
        return Route(chosen, RoutingDecision.AFFINITY if first == member else RoutingDecision.SPILL)

    def _routable(self, name: str) -> bool:
        member = self.membership.get(name)
        return member is not None and member.routable

    def failover(self, user_id: str, failed: str) -> Route | None:
        """The first routable member on the user's walk other than `failed`; None when there is none."""
        for name in self.membership.ring.walk(user_id):
            member = self.membership.get(name)
            if name != failed and member is not None and member.routable:
                return Route(member, RoutingDecision.FAILOVER)
        return None

    def least_loaded(self) -> Member:
        """The routable member with the fewest requests in flight (ties by name), for unkeyed calls."""
        routable = self.membership.routable()
        if not routable:
            raise Unavailable(f"no healthy ranker among {len(self.membership.members)} members")
        return min(routable, key=lambda member: (member.in_flight, member.name))
