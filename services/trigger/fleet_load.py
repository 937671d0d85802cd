"""The trigger's view of each ranker's load, from the load reports that come back on PreInfer answers.

Which ranker a user loads is the router's affinity ring over the routable members (GetProfile names them
and the ring's virtual nodes): the trigger places the user on the same ring (`target`). A prefix its owner
cannot have ready before the request's Rank arrives (the relay window), by the owner's reported queues,
goes to the next member along the user's walk that can (`place`); the Rank follows it there by the relay
hint. The ranker then applies its own limits (it keeps the final say).

A report is exact when it arrives and ages until the next one, so a ranker the trigger stopped sending to
(a brake bound) is not held braked by a stale figure:

- backlogs (device ms) drain at real time: the device works through them;
- leased bytes fall linearly to zero over the lease TTL the report states: no lease outlives it;
- on top, what the trigger admitted to the ranker since and has had no answer for (`reserve` /
  `release`), which the next report includes.

The wasted share is the fleet's pre-inference device time no Rank consumed, over about the last
`waste_window_s`: the growth of each ranker's wasted ms from its oldest report in the window until now (at
least a second), averaged over the rankers that reported (each has one device). A ranker that stops
reporting adds nothing more, so its share decays as time passes.

A member with no report yet counts as idle, with the HBM capacity the fleet profile states
(`assume_hbm_capacity`: the rankers of one fleet share a model and a device kind), so the HBM brake binds
from the first admission, before any PreInfer has answered (0 until a profile came: unknown, no brake).
Not thread-safe: the trigger's event loop owns it. Time comes from the injected clock (monotonic seconds).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Iterable

from relaygr.v1 import ranker_pb2
from services.affinity.ring import VIRTUAL_NODES, AffinityRing

MIN_WASTE_SPAN_S = 1.0


@dataclasses.dataclass
class MemberLoad:
    report: ranker_pb2.LoadReport
    received_at: float
    # (time, wasted ms so far) of the reports within the waste window, oldest first.
    waste: collections.deque[tuple[float, float]] = dataclasses.field(default_factory=collections.deque)


class FleetLoad:
    def __init__(self, waste_window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.waste_window_s = waste_window_s
        self._clock = clock
        self._ring = AffinityRing()
        self._members: dict[str, MemberLoad] = {}
        self._unanswered_ms: collections.Counter[str] = collections.Counter()
        self._unanswered_bytes: collections.Counter[str] = collections.Counter()
        self._assumed_capacity = 0

    def set_members(self, names: Iterable[str], virtual_nodes: int = VIRTUAL_NODES) -> None:
        """The ring's members; reports of members that left are forgotten."""
        names = set(names)
        if names != self._ring.members or virtual_nodes != self._ring.virtual_nodes:
            self._ring = AffinityRing(sorted(names), virtual_nodes=virtual_nodes)
        for gone in set(self._members) - names:
            del self._members[gone]

    def target(self, user_id: str) -> str:
        """The member the user's requests reach (its first member on the ring); "" with no members."""
        return self._ring.owner(user_id) or ""

    def finish_ms(self, name: str, pre_infer_ms: float) -> float:
        """When a prefix of `pre_infer_ms` admitted to `name` now is predicted to be ready, in ms from now:
        the Ranks queued there, the pre-inference queued before it, then the prefix itself."""
        return self.rank_wait_ms(name) + self.pre_infer_backlog_ms(name) + pre_infer_ms

    def place(self, user_id: str, pre_infer_ms: float, window_ms: float) -> str:
        """The member that computes the user's prefix: its owner on the ring, unless the owner is predicted
        not to have it ready within `window_ms` (when the request's Rank arrives) and another member is:
        then the first such member along the user's walk (its Rank follows the relay hint there). When no
        member can, the owner keeps it (spilling would only move the overload). `window_ms` 0: the owner.
        "" with no members."""
        walk = self._ring.walk(user_id)
        owner = next(walk, "")
        if window_ms <= 0 or not owner or self.finish_ms(owner, pre_infer_ms) <= window_ms:
            return owner
        return next((name for name in walk if self.finish_ms(name, pre_infer_ms) <= window_ms), owner)

    def observe(self, report: ranker_pb2.LoadReport) -> None:
        """Takes a fresh report (an empty one, from a ranker that sent none, is ignored)."""
        if not report.instance:
            return
        now = self._clock()
        member = self._members.get(report.instance)
        if member is None:
            member = self._members[report.instance] = MemberLoad(report, now)
        member.report, member.received_at = report, now
        member.waste.append((now, report.pre_infer_wasted_ms))
        while len(member.waste) > 2 and now - member.waste[1][0] >= self.waste_window_s:
            member.waste.popleft()

    def reserve(self, name: str, ms: float, nbytes: int) -> None:
        """An admission to `name` whose PreInfer has not answered yet."""
        self._unanswered_ms[name] += ms
        self._unanswered_bytes[name] += nbytes

    def release(self, name: str, ms: float, nbytes: int) -> None:
        """Its answer came (with a report that includes it), or it failed."""
        self._unanswered_ms[name] -= ms
        self._unanswered_bytes[name] -= nbytes
        if self._unanswered_bytes[name] <= 0 and self._unanswered_ms[name] <= 1e-9:
            del self._unanswered_ms[name], self._unanswered_bytes[name]

    def _aged(self, name: str) -> tuple[ranker_pb2.LoadReport | None, float]:
        member = self._members.get(name)
        if member is None:
            return None, 0.0
        return member.report, max(0.0, self._clock() - member.received_at)

    def pre_infer_backlog_ms(self, name: str) -> float:
        report, age_s = self._aged(name)
        reported = 0.0 if report is None else max(0.0, report.pre_infer_backlog_ms - age_s * 1000)
        return reported + self._unanswered_ms[name]

    def rank_wait_ms(self, name: str) -> float:
        """The queue wait a Rank arriving at `name` now would see."""
        report, age_s = self._aged(name)
        return 0.0 if report is None else max(0.0, report.rank_backlog_ms - age_s * 1000)

    def leased_bytes(self, name: str) -> int:
        report, age_s = self._aged(name)
        reported = 0
        if report is not None and report.lease_ttl_ms > 0:
            remaining = max(0.0, 1.0 - age_s * 1000 / report.lease_ttl_ms)
            reported = round(report.leased_bytes * remaining)
        return reported + self._unanswered_bytes[name]

    def reported_leased_bytes(self, name: str) -> int:
        """The member's leased bytes as its last report stated them, not aged; 0 with no report."""
        report, _ = self._aged(name)
        return 0 if report is None else report.leased_bytes

    def unanswered_bytes(self, name: str) -> int:
        """Bytes of this trigger's admissions to `name` whose PreInfer has not answered yet."""
        return self._unanswered_bytes[name]

    def assume_hbm_capacity(self, nbytes: int) -> None:
        """The HBM budget of a member that has not reported yet (the fleet profile's)."""
        self._assumed_capacity = max(0, nbytes)

    def hbm_capacity_bytes(self, name: str) -> int:
        """The member's HBM budget as it last reported it, else the assumed one; 0 when unknown."""
        report, _ = self._aged(name)
        return self._assumed_capacity if report is None else report.hbm_capacity_bytes

    def wasted_share(self) -> float:
        """Share of the fleet's device time spent, over the waste window, on pre-inference never consumed."""
        now = self._clock()
        shares = []
        for member in self._members.values():
            (then, wasted_then), (_, wasted_now) = member.waste[0], member.waste[-1]
            span_s = max(now - then, MIN_WASTE_SPAN_S)
            shares.append(max(0.0, wasted_now - wasted_then) / (span_s * 1000))
        return sum(shares) / len(shares) if shares else 0.0
