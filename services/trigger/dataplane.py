"""The trigger's data plane: Admit as a plain call, with no transport in it.

The servicer translates an AdmitRequest into an `AdmitCall` (plain values and arrays, no protobuf) and the
decision back; everything an Admit does happens here, each step once:

    Admit: validate (`AdmitCall`'s fields, against the request limits: the one place)
           -> predict (the fleet profile's cost models) -> decide (`AdmissionPolicy`)
           -> fire the PreInfer signal (admitted only) -> the decision, metrics

The predictions are the fleet profile's cost models', the decision `admission.AdmissionPolicy`'s, the
rankers' load `fleet_load.FleetLoad`'s. An admitted request's PreInfer goes to the ranker the
admission placed it on (routed directly; through the router, by the router's ring) with a short
deadline (`--pre-infer-timeout-ms`); the ranker answers as soon as it accepts or refuses, so Admit never
waits for the computation, and its answer carries its load report, which the fleet view takes. The
answer's `instance` becomes `relay_instance`. A refusal or a failed call (`PreInferFailed`) is
RANKER_REFUSED and the admission's reservation is released. A DUPLICATE answers admitted=false with the
instance remembered from the first admission, so the caller's Rank keeps its hint.

Routing directly, the PreInfers placed on one member within `--pre-infer-batch-window-ms` are coalesced
(`coalescer.Coalescer`) into one PreInferBatch call of at most `--pre-infer-batch-max` (a window that closes
with one PreInfer sends it as a single call): each Admit waits for its own entry's answer, as for a single
call, and the batch's one load report is taken once. A call that fails fails each of its entries as a
failed single call (each admission refunded). A PreInfer goes alone, as a single call at once
(`coalescer.Alone`, counted by why), through a router (no member is known: the router places it), with the
window 0, and when its own predicted pre-inference plus the window exceeds the relay window: waiting for
the window would then make it miss its Rank (its prediction read as 0 while the curve is provisional, as
the placement reads it).

An optimisation, stated: the Admit's bytes are reused as its PreInfer. The protos state that AdmitRequest's
fields 1 (user_id) and 2 (long_term) are PreInferRequest's, so with the Admit-only fields
(the servicer's `ADMIT_ONLY_FIELDS`) cleared an AdmitRequest's encoding is a valid PreInferRequest's
(tests/trigger/test_wire.py fails when a number, name or type drifts apart, or a field is added to either
message without this list following). The servicer serialises it so, once, into `AdmitCall.pre_infer`,
without copying the history into a new message; the plane sends those bytes as the PreInfer and keys
duplicates by their digest, which names the user and the exact long-term sequence. At 8192 events that takes
0.2 ms, against 0.6 ms to copy into a PreInferRequest, serialise it and digest the history apart. The plane
itself reads no request protobuf (it reads the repeated fields it is given as sequences; a test drives it
with arrays and any bytes for the payload); the PreInfer's answer reaches it as the ranker's
PreInferResponse, whose load report the fleet view keeps as it came.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from relaygr.v1 import ranker_pb2
from services.common import tracing, validation
from services.common.errors import InvalidArgument, Unavailable
from services.common.metrics import Children, precreate
from services.trigger.admission import AdmissionPolicy, Brake, Decision, Limits, Prefix, Reason
from services.trigger.coalescer import Alone, Coalescer
from services.trigger.config import TriggerConfig
from services.trigger.fleet_load import FleetLoad
from services.trigger.fleet_profile import FleetProfile
from services.trigger.metrics import (
    TRIGGER_BRAKE_PRESSURE,
    TRIGGER_DECISIONS,
    TRIGGER_MUST_RELAY,
    TRIGGER_PRE_INFER_ALONE,
    TRIGGER_PRE_INFER_BATCH_SIZE,
    TRIGGER_PRE_INFER_FAILURES,
    TRIGGER_PREDICTED_SECONDS,
    TRIGGER_SHED_THRESHOLD,
)

log = logging.getLogger(__name__)

# The action vocabulary is the model's, which the trigger does not know; the ranker checks it.
ANY_ACTION_TYPE = 2**31

# Outcomes after which the prefix is (or will be) in HBM.
_HELD_OUTCOMES = frozenset(
    {
        ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED,
        ranker_pb2.PRE_INFER_OUTCOME_ALREADY_CACHED,
        ranker_pb2.PRE_INFER_OUTCOME_RELOADED,
    }
)

_DECISIONS = Children(TRIGGER_DECISIONS)
_MUST_RELAY = Children(TRIGGER_MUST_RELAY)
_BRAKE_PRESSURE = Children(TRIGGER_BRAKE_PRESSURE)
_ALONE = Children(TRIGGER_PRE_INFER_ALONE)


@dataclasses.dataclass(frozen=True, eq=False)
class AdmitCall:
    """One Admit, as the servicer translated it: the user, the long-term history's parallel fields (a
    BehaviorSequence's repeated fields, or arrays: the plane converts them once their counts are checked),
    the sizes of the Rank to come, and `pre_infer`, this Admit serialised as the PreInferRequest its prefix
    is pre-inferred with (see the module docstring). Not validated yet."""

    user_id: str
    item_ids: Sequence[int]
    action_types: Sequence[int]
    timestamps_ms: Sequence[int]
    short_term_length: int
    num_candidates: int
    pre_infer: bytes


class PreInferFailed(Exception):
    """The PreInfer call failed on the way (its status code's name, e.g. DEADLINE_EXCEEDED, and details)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code} {details}")
        self.code = code
        self.details = details


# Sends a serialised PreInferRequest of a user, with a timeout in seconds, to the member the admission
# placed it on (routed there when it is routable); raises PreInferFailed.
PreInferCall = Callable[[bytes, str, float, str], Awaitable[ranker_pb2.PreInferResponse]]
# One answer of a batch: the entry's answer as a single PreInfer's, without a load report, or its own error.
BatchEntry = ranker_pb2.PreInferResponse | PreInferFailed
# Sends serialised PreInferRequests of these users, all placed on one member, as one PreInferBatch with a
# timeout in seconds: the batch's load report and one entry per request, in order; raises PreInferFailed
# when the call itself fails.
PreInferBatchCall = Callable[
    [Sequence[bytes], Sequence[str], float, str],
    Awaitable[tuple[ranker_pb2.LoadReport, list[BatchEntry]]],
]


def limits(config: TriggerConfig) -> Limits:
    """The admission policy's limits from the trigger's settings (ms settings become seconds)."""
    return Limits(
        slo_ms=config.slo_ms,
        relay_overhead_ms=config.relay_overhead_ms,
        duplicate_window_s=config.lease_window_ms / 1000.0,
        waste_budget=config.waste_budget,
        hbm_lease_fraction=config.hbm_lease_fraction,
        max_backlog_ms=config.max_backlog_ms,
        high_water=config.shed_high_water,
        low_water=config.shed_low_water,
        adjust_s=config.shed_adjust_ms / 1000.0,
        step=config.shed_step,
        floor_events=config.shed_floor_events,
        max_events=config.max_long_term_events,
        admit_all=config.admit_all,
        replicas=config.replicas,
        relay_window_ms=config.placement_window_ms,
        unknown_curve_min_events=config.unknown_curve_min_events,
    )


class TriggerPlane:
    def __init__(
        self,
        config: TriggerConfig,
        pre_infer: PreInferCall,
        members: Callable[[], tuple[str, ...] | None] = lambda: None,
        pre_infer_batch: PreInferBatchCall | None = None,
    ) -> None:
        """`members`: the rankers the PreInfer calls can go to now (routing directly), or None (through a
        router: the profile's members, refreshed with it). `pre_infer_batch`: the PreInferBatch transport,
        which routing directly coalesces with (None: coalescing off)."""
        self.config = config
        self.fleet = FleetLoad(config.waste_window_s)
        self.policy = AdmissionPolicy(limits(config), self.fleet)
        self._pre_infer = pre_infer
        self._pre_infer_batch = pre_infer_batch
        self._coalescer: Coalescer[tuple[bytes, str], ranker_pb2.PreInferResponse] | None = None
        window_ms = config.pre_infer_batch_window_ms
        if pre_infer_batch is not None and config.routes_directly and window_ms > 0:
            self._coalescer = Coalescer(self._send_batch, window_ms / 1000.0, config.pre_infer_batch_max)
        self._members = members
        self._profile: FleetProfile | None = None
        precreate(
            TRIGGER_DECISIONS,
            *[("admit" if reason is Reason.ADMITTED else "reject", reason.name.lower()) for reason in Reason],
        )
        precreate(TRIGGER_MUST_RELAY, ("admit",), ("reject",))
        precreate(TRIGGER_BRAKE_PRESSURE, *[(brake.value,) for brake in Brake])
        precreate(TRIGGER_PRE_INFER_ALONE, *[(why.value,) for why in Alone])

    async def close(self) -> None:
        """Cancels the PreInfers still gathering or in flight in a batch."""
        if self._coalescer is not None:
            await self._coalescer.close()

    def use_profile(self, profile: FleetProfile) -> None:
        """Calibrates predictions from a fresh fleet profile, places users on its members' ring and brakes
        members that have not reported yet at its HBM capacity."""
        self._profile = profile
        self.fleet.set_members(profile.members, profile.virtual_nodes)
        self.fleet.assume_hbm_capacity(profile.hbm_capacity_bytes)

    async def admit(self, call: AdmitCall) -> Decision:
        """The decision on `call`, its PreInfer fired when admitted; InvalidArgument (naming the field) for
        a call over the request limits, Unavailable before the first fleet profile."""
        profile = self._profile
        if profile is None:
            raise Unavailable("no latency profile from the router yet")
        length = self._validate(call)
        live = self._members()
        if live is not None:  # the users' placement follows the ring the PreInfer is routed on, as it is now
            self.fleet.set_members(live, profile.virtual_nodes)
        miss_ms = profile.full.predict_ms(length, call.short_term_length, call.num_candidates)
        TRIGGER_PREDICTED_SECONDS.observe(miss_ms / 1000.0)
        key = hashlib.blake2b(call.pre_infer, digest_size=16).digest()
        prefix = Prefix(
            key=key,
            user_id=call.user_id,
            length=length,
            nbytes=length * profile.kv_bytes_per_token,
            miss_ms=miss_ms,
            gain_ms=profile.pre_infer.compute_ms(length, 0, 0),
            pre_infer_ms=profile.pre_infer.predict_ms(length, 0, 0),
            curve_known=not profile.provisional,
        )
        decision = self.policy.decide(prefix)
        if decision.admitted:
            pre_infer_ms = prefix.pre_infer_ms if prefix.curve_known else 0.0
            decision = await self._fire(key, call.pre_infer, call.user_id, decision, pre_infer_ms)
        self._record(decision)
        span = tracing.current()
        if span.is_recording():
            span.set_attributes(
                {
                    "relaygr.user_hash": tracing.user_hash(call.user_id),
                    "relaygr.long_term_length": length,
                    "relaygr.admitted": decision.admitted,
                    "relaygr.reason": decision.reason.name.lower(),
                    "relaygr.relay_instance": decision.relay_instance,
                    "relaygr.predicted_miss_ms": miss_ms,
                }
            )
        return decision

    def _validate(self, call: AdmitCall) -> int:
        """Every check of an Admit, against the request limits (the ranker's, `RequestLimits`): the
        long-term length."""
        config = self.config
        validation.user_id(call.user_id)
        item_ids, _, _ = validation.event_arrays(
            call.item_ids,
            call.action_types,
            call.timestamps_ms,
            "long_term",
            config.max_long_term_events,
            ANY_ACTION_TYPE,
            allow_empty=False,
        )
        length = len(item_ids)
        validation.positive(call.num_candidates, "num_candidates", config.max_candidates)
        if call.short_term_length < 0:
            raise InvalidArgument("short_term_length", "must not be negative")
        if call.short_term_length > config.max_short_term_events:
            raise InvalidArgument(
                "short_term_length",
                f"is {call.short_term_length}, more than the limit of {config.max_short_term_events}",
            )
        return length

    async def _fire(
        self, key: bytes, payload: bytes, user_id: str, decision: Decision, pre_infer_ms: float
    ) -> Decision:
        try:
            answer = await self._send(payload, user_id, decision.target, pre_infer_ms)
        except PreInferFailed as exc:
            log.warning("PreInfer for user %s failed: %s %s", user_id, exc.code, exc.details)
            TRIGGER_PRE_INFER_FAILURES.labels(exc.code).inc()
            self.policy.answered(key, "", held=False)
            return dataclasses.replace(decision, reason=Reason.RANKER_REFUSED)
        self.fleet.observe(answer.load)  # a batch entry carries none: the batch's was taken once
        held = answer.outcome in _HELD_OUTCOMES
        self.policy.answered(key, answer.instance, held=held)
        if not held:
            return dataclasses.replace(decision, reason=Reason.RANKER_REFUSED)
        return dataclasses.replace(decision, relay_instance=answer.instance)

    async def _send(
        self, payload: bytes, user_id: str, member: str, pre_infer_ms: float
    ) -> ranker_pb2.PreInferResponse:
        """The PreInfer's answer: coalesced with the others bound for `member`, or sent alone (counted by
        why, `_alone`)."""
        timeout_s = self.config.pre_infer_timeout_ms / 1000.0
        alone = self._alone(pre_infer_ms)
        if alone is None:
            return await self._coalescer.submit(member, (payload, user_id), timeout_s)
        _ALONE(alone.value).inc()
        return await self._pre_infer(payload, user_id, timeout_s, member)

    def _alone(self, pre_infer_ms: float) -> Alone | None:
        """Why a PreInfer of `pre_infer_ms` (predicted) goes alone at once; None: it is coalesced."""
        config = self.config
        if not config.routes_directly:
            return Alone.THROUGH_ROUTER
        if self._coalescer is None:
            return Alone.WINDOW_OFF
        if pre_infer_ms + config.pre_infer_batch_window_ms > config.placement_window_ms:
            return Alone.WOULD_MISS_RANK
        return None

    async def _send_batch(
        self, member: str, entries: list[tuple[bytes, str]], timeout_s: float
    ) -> list[BatchEntry]:
        """The coalesced PreInfers (payload, user id) of `member`: one PreInferBatch call, whose load report
        is taken once; a window that closed with one PreInfer sends it as the single call it is."""
        TRIGGER_PRE_INFER_BATCH_SIZE.observe(len(entries))
        if len(entries) == 1:
            ((payload, user_id),) = entries
            return [await self._pre_infer(payload, user_id, timeout_s, member)]
        payloads, users = [payload for payload, _ in entries], [user for _, user in entries]
        load, answers = await self._pre_infer_batch(payloads, users, timeout_s, member)
        self.fleet.observe(load)
        return answers

    def _record(self, decision: Decision) -> None:
        verdict = "admit" if decision.admitted else "reject"
        _DECISIONS(verdict, decision.reason.name.lower()).inc()
        if decision.must_relay:
            _MUST_RELAY(verdict).inc()
        for brake, pressure in self.policy.pressure.items():
            _BRAKE_PRESSURE(brake.value).set(pressure)
        TRIGGER_SHED_THRESHOLD.set(self.policy.threshold_events)
