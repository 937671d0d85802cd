"""Abandonment: the share of requests filtered after retrieval, the same ones in every mode, each with its
Admit and without a Rank (the servicer, its data plane and its gRPC upstream over fake trigger and ranker
stubs, at a fixed universe time)."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from relaygr.v1 import common_pb2, ranker_pb2, recommend_pb2, trigger_pb2
from services.common.config import load
from services.retrieval_stub.config import RetrievalStubConfig
from services.retrieval_stub.dataplane import RecommendPlane, abandoned
from services.retrieval_stub.servicer import GrpcUpstream, RecommendService
from services.workload.universe import UserUniverse

EPOCH_MS = 1_750_000_000_000
NOW_MS = EPOCH_MS + 61_234
CONFIG = RetrievalStubConfig(
    universe_epoch_ms=EPOCH_MS, history_min=24, history_median=64, history_max=512, num_candidates=32,
    relay_window_ms=0.0, abandon_fraction=0.3,
)  # fmt: skip


class FakeTrigger:
    """Admits everything to ranker-0 and remembers who asked."""

    def __init__(self) -> None:
        self.users: list[str] = []

    async def Admit(
        self, request: trigger_pb2.AdmitRequest, timeout: float, metadata: object = None
    ) -> trigger_pb2.AdmitResponse:
        assert metadata is None  # tracing is off: no trace context travels
        self.users.append(request.user_id)
        return trigger_pb2.AdmitResponse(
            admitted=True, reason=trigger_pb2.ADMIT_REASON_ADMITTED, relay_instance="ranker-0"
        )


class FakeRanker:
    """The rankers as the stub calls them (`RankerCalls.rank`): scores candidates by their position, from
    HBM, and remembers who was ranked."""

    def __init__(self) -> None:
        self.users: list[str] = []

    async def rank(self, request: bytes, user_id: str, hint: str, timeout: float) -> bytes:
        rank = ranker_pb2.RankRequest.FromString(request)
        assert (rank.user_id, rank.relay_instance) == (user_id, hint)
        self.users.append(user_id)
        return ranker_pb2.RankResponse(
            scores=[float(i) for i in range(len(rank.candidate_item_ids))],
            cache_source=common_pb2.CACHE_SOURCE_HBM,
            instance=hint or "ranker-1",
        ).SerializeToString()


def serve(config: RetrievalStubConfig, users: list[str]) -> tuple[list, FakeTrigger, FakeRanker]:
    """Recommend for each user at NOW_MS through a servicer over fakes: the responses and the fakes."""
    trigger, ranker = FakeTrigger(), FakeRanker()
    upstream = GrpcUpstream(config, ranker, trigger if config.relay else None)
    service = RecommendService(RecommendPlane(config, UserUniverse(config, clock=lambda: NOW_MS), upstream))

    async def all_of_them() -> list[recommend_pb2.RecommendResponse]:
        requests = [recommend_pb2.RecommendRequest(user_id=user, top_k=4) for user in users]
        return [await service.Recommend(request, None) for request in requests]

    return asyncio.run(all_of_them()), trigger, ranker


def abandoned_count() -> float:
    return REGISTRY.get_sample_value("relaygr_recommend_abandoned_total") or 0.0


@settings(max_examples=25, deadline=None)
@given(
    fraction=st.floats(0.01, 0.99), seed=st.integers(0, 2**31), time_ms=st.integers(EPOCH_MS, 2 * EPOCH_MS)
)
def test_the_abandoned_share_is_the_fraction_within_a_binomial_bound(fraction, seed, time_ms):
    users = 4000
    count = sum(abandoned(seed, f"user-{i}", time_ms, fraction) for i in range(users))
    sd = math.sqrt(users * fraction * (1 - fraction))
    assert abs(count - users * fraction) <= 5 * sd + 1  # fails by chance with probability < 1e-6


def test_abandonment_depends_on_seed_user_and_time_and_nothing_else():
    draws = [abandoned(0, f"user-{i}", NOW_MS, 0.5) for i in range(200)]
    assert draws == [abandoned(0, f"user-{i}", NOW_MS, 0.5) for i in range(200)]
    assert draws != [abandoned(1, f"user-{i}", NOW_MS, 0.5) for i in range(200)]
    assert draws != [abandoned(0, f"user-{i}", NOW_MS + 1, 0.5) for i in range(200)]
    # Nested in the fraction: raising it only adds abandoned requests.
    for i in range(200):
        assert abandoned(0, f"user-{i}", NOW_MS, 0.2) <= abandoned(0, f"user-{i}", NOW_MS, 0.5)
    assert not any(abandoned(0, f"user-{i}", NOW_MS, 0.0) for i in range(200))


def test_an_abandoned_request_sends_its_admit_but_no_rank_and_answers_ok_without_items():
    users = [f"user-{i}" for i in range(60)]
    before = abandoned_count()
    responses, trigger, ranker = serve(CONFIG, users)
    dropped = {user for user, response in zip(users, responses, strict=True) if response.abandoned}
    assert dropped == {user for user in users if abandoned(0, user, NOW_MS, CONFIG.abandon_fraction)}
    assert 0 < len(dropped) < len(users)
    assert trigger.users == users  # every request's Admit, the abandoned ones' included
    assert ranker.users == [user for user in users if user not in dropped]
    assert abandoned_count() - before == len(dropped)
    for user, response in zip(users, responses, strict=True):
        if user in dropped:
            assert list(response.item_ids) == [] and list(response.scores) == []
            assert response.cache_source == common_pb2.CACHE_SOURCE_UNSPECIFIED
            assert response.rank_latency_ms == 0.0 and response.instance == ""
            assert response.admitted and response.admit_reason == trigger_pb2.ADMIT_REASON_ADMITTED
            assert response.request_time_ms == NOW_MS and response.long_term_length > 0
        else:
            assert len(response.item_ids) == 4 and response.cache_source == common_pb2.CACHE_SOURCE_HBM


def test_the_same_requests_are_abandoned_with_the_relay_on_and_off():
    users = [f"user-{i}" for i in range(60)]
    relay, trigger, _ = serve(CONFIG, users)
    baseline, _, ranker = serve(dataclasses.replace(CONFIG, relay=False), users)
    assert [r.abandoned for r in relay] == [r.abandoned for r in baseline]
    assert trigger.users == users  # the relay asked the trigger about every request
    assert ranker.users == [user for user, r in zip(users, baseline, strict=True) if not r.abandoned]
    assert not any(r.admitted for r in baseline)


def test_without_abandonment_every_request_is_ranked():
    users = [f"user-{i}" for i in range(30)]
    responses, _, ranker = serve(dataclasses.replace(CONFIG, abandon_fraction=0.0), users)
    assert not any(r.abandoned for r in responses) and ranker.users == users


@pytest.mark.parametrize(
    ("value", "message"),
    [("1", "--abandon-fraction must be in [0, 1)"), ("-0.1", "--abandon-fraction must not be negative"),
     ("nan", "--abandon-fraction must not be negative")],
)  # fmt: skip
def test_an_abandon_fraction_outside_0_to_1_is_refused_naming_the_flag(value, message, capsys):
    with pytest.raises(SystemExit):
        load(RetrievalStubConfig, ["--abandon-fraction", value], environ={})
    assert message in capsys.readouterr().err
    assert load(RetrievalStubConfig, ["--abandon-fraction", "0.99"], environ={}).abandon_fraction == 0.99
