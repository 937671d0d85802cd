"""The trigger's admission policy: relay by default, brake by measured cost. Pure logic, no transport.

A pre-inference that a Rank consumes adds no work to the fleet: the ranker computes the same prefix it
would compute for the miss, only earlier, off the ranking's critical path. So the policy admits every
request that relay pays for, and refuses only when the fleet cannot afford it. `AdmissionPolicy.decide`
answers with the first of these that applies:

1. NO_GAIN: the prefix's own computation, which is what relay moves off the critical path (F_full -
   F_cached = F_pre), is predicted to cost no more than relaying it (`relay_overhead_ms`, the PreInfer round
   trip): short histories, where a prefix is cheaper to recompute than to move. The prediction is one
   fitted quantity (the pre-inference path's work on its tokens and pairs, `CostModel.compute_ms`, without
   a call's fixed cost, which every curve measures at its 16-event point rather than extrapolating it),
   so the break-even is one length that a restart measures again alike. It is as right as the curve: a
   curve misread at warm-up (rankers warming up together on contended cores) is made monotone by the
   ranker, served provisional when its warm-up saw the contention (read as unknown: below), measured again
   once the ranker is idle and corrected by it as its jobs run (`Calibration`), and the trigger reads the
   correction at its next profile refresh. Load does not move it: the miss's queueing cost for the Ranks
   behind it grows with load, and so does the round trip's cost on the same contended cores.
2. DUPLICATE: the same prefix key (user and exact long-term sequence) was admitted within the duplicate
   window; its PreInfer is in flight or its prefix is leased. The instance that holds it is returned with
   the refusal, so the caller's Rank can still carry the hint (empty while the first PreInfer is unanswered).
3. WASTE_LIMIT: pre-inference that no Rank consumed (abandoned requests, Ranks that went elsewhere) has
   used the fleet's budget of wasted device time (`waste_budget`, a share of it).
4. HBM_LIMIT: the target ranker's HBM leased to unconsumed prefixes plus this prefix's bytes would exceed
   `hbm_lease_fraction` of its HBM budget (bytes as the ranker reports them, not a charge per admission);
   or, with `replicas` triggers admitting to the same rankers, what this trigger's own admissions may
   hold there plus this prefix would exceed its part of that share, 1/`replicas` (below).
5. BACKLOG_LIMIT: the pre-inference already queued on the target ranker takes `max_backlog_ms` of device
   time: this prefix would not start before its Rank, so it could save that Rank nothing (the default
   equals the rankers' own `--max-pre-infer-backlog-ms`, the same rule, so the trigger spares the round
   trip of what the ranker would refuse). The prefix's own length does not count: one that starts in time
   saves its Rank what it finished, even when the Rank arrives first and joins it.
6. SHED_SHORT: while the brakes press, prefixes shorter than the shedding threshold are shed, unless the
   request must relay (below).
7. ADMITTED.

The shedding threshold adapts: every `adjust_s`, if the highest pressure seen since (the waste and HBM brakes'
usage over their limits, this request included) reached `high_water`, the threshold rises by `step` (from
`floor_events`); if it stayed at or below `low_water`, it falls by `step` (to 0 below the floor). The longest
prefixes carry most of the queueing a miss causes, so they keep their relay longest. The backlog does not
press on the threshold: waste and memory are what pre-inference costs the fleet, while a prefix queued behind
others is still computed off the critical path (or joined by its Rank), so refusing it would only move the
same work onto the critical path as a miss.

Replicas. A ranker's report includes every trigger's admissions, but only as of its last answer to this
trigger: what other triggers admitted since (at the same moment, or while this one admitted nothing) is
not in it, so N triggers each braking on reports alone could together lease N shares. With `replicas`
N > 1 each trigger also keeps what its own admissions may hold on a ranker within 1/N of the share, which
bounds the sum strictly. Its own holding is counted from its admissions, each until its duplicate window
plus `max_backlog_ms` have passed (its lease starts when its production ends and lasts the rankers'
lease TTL, which the window equals), and is never more than the ranker's last report to it plus its
admissions not yet answered (that report includes every own admission answered before it, so leases
consumed since an answer stop counting at the next one).

Placement. An admitted prefix goes to the user's owner on the ring unless the owner's reported queues
say it could not be ready within `relay_window_ms` (when the request's Rank arrives) while another member's
say it could (`FleetLoad.place`): a Rank that arrives before its prefix waits for the owner's whole queue,
which under a burst of long prefixes on one ranker is the fleet's P99, while the other ranker idles. The
brakes and the must-relay test read the member placed on.

An unknown curve. A fleet whose latency curve is provisional (its ranker warmed up disturbed, and has not
measured it again yet) gives predictions that may be far too slow; the policy reads them as unknown, not as
slow (`Prefix.curve_known`): the gain test admits histories of at least `unknown_curve_min_events`, the
backlog brake does not press, and no request must relay on them. The HBM and waste brakes, which count
bytes and measured device time, apply as ever.

A request must relay when the queue wait at its target ranker plus its miss is predicted to exceed the SLO:
it is exempt from shedding (not from the limits: a budget is never exceeded). `admit_all` (an ablation)
admits every request that is not a duplicate, with no gain test and no brakes.

Not thread-safe: the trigger calls it from its event loop only. Time comes from the injected clock
(monotonic seconds), so tests drive it without sleeping.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import time
from collections.abc import Callable, Hashable

from services.trigger.fleet_load import FleetLoad


class Reason(enum.Enum):
    """Why a request was or was not admitted; the names are AdmitReason's without its prefix."""

    ADMITTED = enum.auto()
    NO_GAIN = enum.auto()
    HBM_LIMIT = enum.auto()
    BACKLOG_LIMIT = enum.auto()
    DUPLICATE = enum.auto()
    RANKER_REFUSED = enum.auto()
    WASTE_LIMIT = enum.auto()
    SHED_SHORT = enum.auto()


class Brake(enum.StrEnum):
    """The brakes whose pressure the policy reads: the `brake` label of the trigger's pressure gauge."""

    WASTE = "waste"
    HBM = "hbm"
    BACKLOG = "backlog"


_LIMIT_REASONS = {
    Brake.WASTE: Reason.WASTE_LIMIT,
    Brake.HBM: Reason.HBM_LIMIT,
    Brake.BACKLOG: Reason.BACKLOG_LIMIT,
}


@dataclasses.dataclass(frozen=True)
class Decision:
    reason: Reason
    relay_instance: str = ""
    must_relay: bool = False
    target: str = ""  # admitted: the member the PreInfer goes to (`FleetLoad.place`)

    @property
    def admitted(self) -> bool:
        return self.reason is Reason.ADMITTED


@dataclasses.dataclass(frozen=True)
class Prefix:
    """One request's prefix as the policy sees it: its key, size and predicted costs."""

    key: Hashable
    user_id: str
    length: int
    nbytes: int
    miss_ms: float  # ranking without relay
    gain_ms: float  # the prefix's own computation: what relay moves off the critical path
    pre_infer_ms: float  # computing the prefix in the background (its work and a call's fixed cost)
    curve_known: bool = True  # False: the costs come from a provisional curve (module docstring)


@dataclasses.dataclass(frozen=True)
class Limits:
    slo_ms: float
    relay_overhead_ms: float
    duplicate_window_s: float
    waste_budget: float  # share of the fleet's device time
    hbm_lease_fraction: float  # share of each ranker's HBM budget
    max_backlog_ms: float  # pre-inference device ms queued on one ranker
    high_water: float
    low_water: float
    adjust_s: float
    step: float
    floor_events: int
    max_events: int
    admit_all: bool = False
    relay_window_ms: float = 0.0  # until the Rank arrives: a prefix its owner cannot finish by then moves
    unknown_curve_min_events: int = 256  # the gain test while the curve is unknown (provisional)
    replicas: int = 1  # triggers admitting to the same rankers; each keeps within 1/replicas of a share


@dataclasses.dataclass
class _Admission:
    expires_at: float
    target: str
    pre_infer_ms: float
    nbytes: int
    relay_instance: str = ""
    answered: bool = False
    holds_until: float = 0.0  # counted in this trigger's holding on `target` until then (replicas > 1)
    holding: int = 0  # the bytes counted; 0 once the ranker refused it


class AdmissionPolicy:
    def __init__(self, limits: Limits, fleet: FleetLoad, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.fleet = fleet
        self._clock = clock
        # Insertion order is expiry order: every admission lives for the same window.
        self._admissions: collections.OrderedDict[Hashable, _Admission] = collections.OrderedDict()
        # Admissions that may still hold HBM, oldest first (they all hold for the same span), and their bytes
        # per target: this trigger's own holding, for the replicas' split.
        self._holding: collections.deque[_Admission] = collections.deque()
        self._held_bytes: collections.Counter[str] = collections.Counter()
        self.threshold_events = 0
        self.pressure = {brake: 0.0 for brake in Brake}  # at the last decision
        self._peak = 0.0  # highest pressure since the last adjustment
        self._adjusted_at = clock()

    def decide(self, prefix: Prefix) -> Decision:
        """Admits `prefix` (reserving its cost on the target ranker) or refuses it, with the reason."""
        now = self._clock()
        self._expire(now)
        limits = self.limits
        if not limits.admit_all and not self._gains(prefix):
            return Decision(Reason.NO_GAIN)
        earlier = self._admissions.get(prefix.key)
        if earlier is not None:
            return Decision(Reason.DUPLICATE, earlier.relay_instance)
        pre_infer_ms = prefix.pre_infer_ms if prefix.curve_known else 0.0  # unknown: its owner, as any
        target = self.fleet.place(prefix.user_id, pre_infer_ms, limits.relay_window_ms)
        must_relay = prefix.curve_known and self.fleet.rank_wait_ms(target) + prefix.miss_ms > limits.slo_ms
        if not limits.admit_all:
            refusal = self._brake(prefix, target, must_relay, now)
            if refusal is not None:
                return Decision(refusal, must_relay=must_relay)
        admission = _Admission(now + limits.duplicate_window_s, target, prefix.pre_infer_ms, prefix.nbytes)
        admission.holds_until = admission.expires_at + limits.max_backlog_ms / 1000
        admission.holding = prefix.nbytes
        self._admissions[prefix.key] = admission
        self._holding.append(admission)
        self._held_bytes[target] += prefix.nbytes
        self.fleet.reserve(target, prefix.pre_infer_ms, prefix.nbytes)
        return Decision(Reason.ADMITTED, must_relay=must_relay, target=target)

    def _gains(self, prefix: Prefix) -> bool:
        """Whether relay pays for `prefix`: its own computation costs more than relaying it, or, while the
        curve is unknown, it is at least `unknown_curve_min_events` long."""
        if not prefix.curve_known:
            return prefix.length >= self.limits.unknown_curve_min_events
        return prefix.gain_ms > self.limits.relay_overhead_ms

    def _brake(self, prefix: Prefix, target: str, must_relay: bool, now: float) -> Reason | None:
        limits, fleet = self.limits, self.fleet
        capacity = fleet.hbm_capacity_bytes(target) * limits.hbm_lease_fraction
        hbm = (fleet.leased_bytes(target) + prefix.nbytes) / capacity if capacity else 0.0
        if limits.replicas > 1 and capacity:
            hbm = max(hbm, (self.own_holding(target) + prefix.nbytes) * limits.replicas / capacity)
        self.pressure = {
            Brake.WASTE: fleet.wasted_share() / limits.waste_budget,
            Brake.HBM: hbm,
            # What is queued ahead: at the limit this prefix would not start before its Rank.
            Brake.BACKLOG: fleet.pre_infer_backlog_ms(target) / limits.max_backlog_ms
            if prefix.curve_known
            else 0.0,
        }
        self._adjust(max(self.pressure[Brake.WASTE], self.pressure[Brake.HBM]), now)
        for brake, pressure in self.pressure.items():
            if pressure > 1.0 or (brake is not Brake.HBM and pressure >= 1.0):
                return _LIMIT_REASONS[brake]
        if not must_relay and prefix.length < self.threshold_events:
            return Reason.SHED_SHORT
        return None

    def own_holding(self, target: str) -> int:
        """HBM bytes this trigger's own admissions may still hold on `target` (an upper bound)."""
        reported = self.fleet.reported_leased_bytes(target) + self.fleet.unanswered_bytes(target)
        return min(self._held_bytes[target], reported)

    def _adjust(self, pressure: float, now: float) -> None:
        limits = self.limits
        self._peak = max(self._peak, pressure)
        if now - self._adjusted_at < limits.adjust_s:
            return
        if self._peak >= limits.high_water:
            self.threshold_events = min(
                limits.max_events + 1, max(limits.floor_events, round(self.threshold_events * limits.step))
            )
        elif self._peak <= limits.low_water and self.threshold_events:
            lowered = round(self.threshold_events / limits.step)
            self.threshold_events = lowered if lowered >= limits.floor_events else 0
        self._peak, self._adjusted_at = pressure, now

    def answered(self, key: Hashable, relay_instance: str, held: bool) -> None:
        """The PreInfer of an admitted prefix answered: the target's report now includes it. `held`: the
        ranker holds (or produces) the prefix at `relay_instance`; otherwise it refused, and the duplicate
        record goes so that a later request may try again."""
        admission = self._admissions.get(key)
        if admission is None or admission.answered:
            return
        admission.answered = True
        self.fleet.release(admission.target, admission.pre_infer_ms, admission.nbytes)
        if held:
            admission.relay_instance = relay_instance
        else:
            del self._admissions[key]
            self._held_bytes[admission.target] -= admission.holding
            admission.holding = 0

    def _expire(self, now: float) -> None:
        while self._holding and self._holding[0].holds_until <= now:
            gone = self._holding.popleft()
            self._held_bytes[gone.target] -= gone.holding
            if self._held_bytes[gone.target] <= 0:
                del self._held_bytes[gone.target]
        while self._admissions:
            key, oldest = next(iter(self._admissions.items()))
            if oldest.expires_at > now:
                return
            del self._admissions[key]
            if not oldest.answered:
                self.fleet.release(oldest.target, oldest.pre_infer_ms, oldest.nbytes)
