"""The trigger's data plane driven without gRPC: an `AdmitCall` in, a decision out, the PreInfer it fires
recorded by a fake transport. The servicer's translation (`admit_call`) is checked on its own."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from relaygr.v1 import common_pb2, ranker_pb2, trigger_pb2
from services.common.config import load
from services.common.errors import InvalidArgument, Unavailable
from services.trigger.admission import Reason
from services.trigger.config import TriggerConfig
from services.trigger.dataplane import AdmitCall, PreInferFailed, TriggerPlane
from services.trigger.fleet_profile import FleetProfile
from services.trigger.servicer import admit_call

KV_BYTES_PER_TOKEN = 512
MEMBERS = ("ranker-a", "ranker-b")


def profile() -> FleetProfile:
    """A fleet whose miss and pre-inference grow with the prefix (fixed + per token), on two rankers."""
    return FleetProfile.from_response(
        ranker_pb2.GetProfileResponse(
            kv_bytes_per_token=KV_BYTES_PER_TOKEN,
            profile_short_term_length=16,
            profile_num_candidates=64,
            members=MEMBERS,
            latency_curve=[
                ranker_pb2.LatencyPoint(
                    prefix_length=n, full_ms=1 + n * 0.01, pre_infer_ms=0.5 + n * 0.008, rank_ms=1.0
                )
                for n in (128, 512, 2048, 8192)
            ],
        )
    )


class Rankers:
    """The PreInfer transport: records each call and answers as it is told."""

    def __init__(self, outcome: int = ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED, fail: str = "") -> None:
        self.calls: list[tuple[bytes, str, float, str]] = []
        self.outcome, self.fail = outcome, fail

    async def __call__(self, payload: bytes, user_id: str, timeout_s: float, member: str):
        self.calls.append((payload, user_id, timeout_s, member))
        if self.fail:
            raise PreInferFailed(self.fail, "on the way")
        return ranker_pb2.PreInferResponse(
            outcome=self.outcome, instance=member, load=ranker_pb2.LoadReport(instance=member)
        )


def plane(rankers: Rankers, *flags: str) -> TriggerPlane:
    # Direct routing to the two members, every request admitted: what is checked is the flow, not the policy.
    config = load(TriggerConfig, ["--rankers", "ranker-a=127.0.0.1:1,ranker-b=127.0.0.1:2", *flags], {})
    built = TriggerPlane(config, rankers, lambda: MEMBERS)
    built.use_profile(profile())
    return built


def call(
    user_id: str = "user-1", length: int = 300, payload: bytes = b"pre-infer of user-1", **sizes
) -> AdmitCall:
    return AdmitCall(
        user_id=user_id,
        item_ids=np.arange(length, dtype=np.int64),
        action_types=np.zeros(length, dtype=np.int64),
        timestamps_ms=np.arange(length, dtype=np.int64) * 1000,
        short_term_length=sizes.get("short_term_length", 16),
        num_candidates=sizes.get("num_candidates", 64),
        pre_infer=payload,
    )


def test_an_admitted_call_fires_its_payload_as_the_pre_infer_and_answers_with_the_instance():
    rankers = Rankers()
    trigger = plane(rankers, "--admit-all", "true", "--pre-infer-timeout-ms", "40")
    decision = asyncio.run(trigger.admit(call()))
    assert decision.reason is Reason.ADMITTED and decision.admitted
    [(payload, user_id, timeout_s, member)] = rankers.calls
    assert (payload, user_id, timeout_s) == (b"pre-infer of user-1", "user-1", 0.04)
    assert member in MEMBERS and decision.relay_instance == member == decision.target
    # The same bytes again are the same prefix: a duplicate that keeps the first admission's instance.
    again = asyncio.run(trigger.admit(call()))
    assert (again.reason, again.relay_instance, len(rankers.calls)) == (Reason.DUPLICATE, member, 1)
    # Other bytes (another history) are another prefix.
    assert asyncio.run(trigger.admit(call(payload=b"other"))).admitted and len(rankers.calls) == 2


@pytest.mark.parametrize(
    "rankers",
    [Rankers(fail="DEADLINE_EXCEEDED"), Rankers(outcome=ranker_pb2.PRE_INFER_OUTCOME_REJECTED_OVERLOAD)],
    ids=["failed", "refused"],
)
def test_a_pre_infer_that_fails_or_is_refused_is_ranker_refused_and_releases_its_reservation(rankers):
    trigger = plane(rankers, "--admit-all", "true")
    decision = asyncio.run(trigger.admit(call()))
    assert (decision.reason, decision.relay_instance, decision.admitted) == (Reason.RANKER_REFUSED, "", False)
    assert all(trigger.fleet.pre_infer_backlog_ms(member) == 0.0 for member in MEMBERS)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"user_id": ""}, "user_id"),
        ({"length": 0}, "long_term.item_ids"),
        ({"length": 8193}, "long_term.item_ids"),
        ({"num_candidates": 0}, "num_candidates"),
        ({"num_candidates": 1025}, "num_candidates"),
        ({"short_term_length": -1}, "short_term_length"),
        ({"short_term_length": 513}, "short_term_length"),
    ],
)
def test_a_call_outside_the_request_limits_is_refused_naming_its_field_before_any_pre_infer(change, field):
    rankers = Rankers()
    with pytest.raises(InvalidArgument) as refused:
        asyncio.run(plane(rankers, "--admit-all", "true").admit(call(**change)))
    assert refused.value.field == field and rankers.calls == []


def test_mismatched_arrays_are_refused_naming_the_array():
    good = call()
    bad = dataclasses.replace(good, action_types=good.action_types[:-1])
    with pytest.raises(InvalidArgument) as refused:
        asyncio.run(plane(Rankers(), "--admit-all", "true").admit(bad))
    assert refused.value.field == "long_term.action_types"


def test_the_limits_are_the_configured_ones():
    with pytest.raises(InvalidArgument, match="more than the limit of 100"):
        asyncio.run(plane(Rankers(), "--max-long-term-events", "100").admit(call(length=101)))


def test_before_the_first_profile_an_admit_is_unavailable():
    config = load(TriggerConfig, [], {})
    with pytest.raises(Unavailable, match="no latency profile"):
        asyncio.run(TriggerPlane(config, Rankers()).admit(call()))


def test_the_servicer_translates_an_admit_request_into_a_call_whose_payload_is_a_pre_infer_request():
    seq = common_pb2.BehaviorSequence(item_ids=[5, 6, 7], action_types=[1, 0, 1], timestamps_ms=[10, 20, 30])
    request = trigger_pb2.AdmitRequest(user_id="u", long_term=seq, num_candidates=64, short_term_length=8)
    translated = admit_call(request)
    assert (translated.user_id, translated.num_candidates, translated.short_term_length) == ("u", 64, 8)
    assert list(translated.item_ids) == [5, 6, 7] and list(translated.action_types) == [1, 0, 1]
    assert list(translated.timestamps_ms) == [10, 20, 30]
    pre_infer = ranker_pb2.PreInferRequest.FromString(translated.pre_infer)
    assert pre_infer == ranker_pb2.PreInferRequest(user_id="u", long_term=seq)
    assert translated.pre_infer == pre_infer.SerializeToString()


def test_the_profile_brakes_members_that_have_not_reported_at_its_hbm_capacity():
    built = plane(Rankers())
    assert built.fleet.hbm_capacity_bytes("ranker-a") == 0  # this profile states none: unknown
    built.use_profile(dataclasses.replace(profile(), hbm_capacity_bytes=1 << 30))
    assert [built.fleet.hbm_capacity_bytes(name) for name in MEMBERS] == [1 << 30, 1 << 30]
