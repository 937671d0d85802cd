"""Recommend over loopback through a real local fleet (cpu-tiny rankers, router, trigger, retrieval stub)."""

from __future__ import annotations

import dataclasses

import grpc
import numpy as np
import pytest

from relaygr.v1 import (
    common_pb2,
    ranker_pb2,
    ranker_pb2_grpc,
    recommend_pb2,
    recommend_pb2_grpc,
    trigger_pb2,
)
from services.common.contract import RECOMMEND_SERVICE
from services.launcher.fleet import ROUTER, STUB, TRIGGER, Fleet, FleetConfig
from services.launcher.procs import Processes, free_port
from services.workload.universe import UniverseConfig, UserUniverse
from tests.support.metrics import scrape, total

UNIVERSE = UniverseConfig(
    universe_epoch_ms=1_750_000_000_000, history_min=24, history_median=64, history_max=512, num_candidates=32
)
TOP_K = 8


def universe_flags(config: UniverseConfig) -> list[str]:
    """The stub flags that make its universe equal `config`."""
    flags = []
    for field in dataclasses.fields(UniverseConfig):
        value = getattr(config, field.name)
        if value != field.default:
            flags += [f"--{field.name.replace('_', '-')}", str(value)]
    return flags


# Generous deadlines: on a busy test machine a late Admit would hide whether the stub called it, and a
# late Rank would fail the Recommend.
STUB_ARGS = [
    *universe_flags(UNIVERSE), "--admit-timeout-ms", "2000", "--rank-timeout-ms", "20000",
    "--relay-window-ms", "10",
]  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    config = FleetConfig(
        rankers=2,
        model_preset="cpu-tiny",
        base_port=0,
        metrics_base_port=0,
        log_dir=str(tmp_path_factory.mktemp("logs")),
        ranker_args="--profile-lengths 32,128,512 --profile-repeats 1",
        stub_args=" ".join(STUB_ARGS),
    )
    with Fleet(config) as running:
        yield running


def recommend(address: str, user_id: str, top_k: int = TOP_K) -> recommend_pb2.RecommendResponse:
    with grpc.insecure_channel(address) as channel:
        return recommend_pb2_grpc.RecommendServiceStub(channel).Recommend(
            recommend_pb2.RecommendRequest(user_id=user_id, top_k=top_k), timeout=30
        )


def direct_full_ranking(address: str, user_id: str, request_time_ms: int) -> tuple[np.ndarray, np.ndarray]:
    """The candidates and their scores from one ranker, rebuilt from the universe, without any hint."""
    universe = UserUniverse(UNIVERSE)
    history = universe.history(user_id, request_time_ms)
    candidates = universe.candidates(user_id, request_time_ms)
    with grpc.insecure_channel(address) as channel:
        ranked = ranker_pb2_grpc.RankerServiceStub(channel).Rank(
            ranker_pb2.RankRequest(
                user_id=user_id,
                request_id="direct",
                long_term=history.long_term.to_proto(),
                short_term=history.short_term.to_proto(),
                candidate_item_ids=candidates.tolist(),
            ),
            timeout=30,
        )
    assert ranked.cache_source == common_pb2.CACHE_SOURCE_MISS  # a full recomputation
    return candidates, np.asarray(ranked.scores, dtype=np.float32)


def admit_calls(fleet: Fleet) -> float:
    """Admit RPCs the trigger has started."""
    return total(
        scrape(fleet.endpoints()[TRIGGER].metrics_url), "grpc_server_started_total", grpc_method="Admit"
    )


def test_recommend_returns_top_k_by_score_equal_to_a_direct_full_ranking(fleet):
    for user_id in ("user-1", "user-2", "user-3"):
        response = recommend(fleet.address(STUB), user_id)
        universe = UserUniverse(UNIVERSE)
        assert response.long_term_length == len(universe.history(user_id, response.request_time_ms).long_term)
        assert response.instance in fleet.ranker_names
        assert response.admit_reason != trigger_pb2.ADMIT_REASON_UNSPECIFIED  # the trigger was asked

        scores = np.asarray(response.scores)
        assert len(response.item_ids) == len(scores) == TOP_K
        assert np.all(np.diff(scores) <= 0), "best first"

        # Rank on the ranker that did not serve the Recommend, so nothing of this user is cached there.
        other = next(name for name in fleet.ranker_names if name != response.instance)
        candidates, expected = direct_full_ranking(fleet.address(other), user_id, response.request_time_ms)
        expected_by_item = dict(zip(candidates.tolist(), expected.tolist(), strict=True))
        np.testing.assert_allclose(
            scores, [expected_by_item[item] for item in response.item_ids], rtol=1.3e-6, atol=1e-5
        )
        left_out = [score for item, score in expected_by_item.items() if item not in set(response.item_ids)]
        assert max(left_out) <= scores[-1] + 1e-5, "no candidate left out scores above the top k"


@pytest.mark.parametrize(
    ("user_id", "top_k", "field"),
    [("user-1", 0, "top_k"), ("user-1", UNIVERSE.num_candidates + 1, "top_k"), ("", TOP_K, "user_id")],
)
def test_invalid_requests_are_refused_naming_the_field(fleet, user_id, top_k, field):
    with pytest.raises(grpc.RpcError) as caught:
        recommend(fleet.address(STUB), user_id, top_k)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith(f"{field}:")


def test_top_k_may_take_every_candidate(fleet):
    response = recommend(fleet.address(STUB), "user-4", UNIVERSE.num_candidates)
    assert len(set(response.item_ids)) == UNIVERSE.num_candidates


def test_the_baseline_sends_no_admit_and_no_hint(fleet):
    with Processes(log_dir=fleet.log_dir) as processes:
        baseline = processes.start(
            "baseline-stub", "services.retrieval_stub", RECOMMEND_SERVICE,
            ["--router", fleet.address("router"), "--relay", "false", *STUB_ARGS],
        )  # fmt: skip
        baseline.wait_healthy(60)
        admits_before = admit_calls(fleet)
        responses = [recommend(baseline.address, f"baseline-user-{i}") for i in range(5)]
        assert admit_calls(fleet) == admits_before
    for response in responses:
        assert not response.admitted
        assert response.admit_reason == trigger_pb2.ADMIT_REASON_UNSPECIFIED
        assert response.cache_source == common_pb2.CACHE_SOURCE_MISS
        assert response.miss_reason == common_pb2.MISS_REASON_NEVER_PRE_INFERRED
        assert len(response.item_ids) == TOP_K
        # The Rank's own account, passed through: the whole long-term history computed on its path.
        assert response.computed_prefix_events == response.long_term_length
        assert response.prefix_wait_ms > 0


def test_a_failed_admit_only_costs_the_relay_hint(fleet):
    with Processes(log_dir=fleet.log_dir) as processes:
        stub = processes.start(
            "stub-without-trigger", "services.retrieval_stub", RECOMMEND_SERVICE,
            ["--router", fleet.address("router"), "--trigger", f"127.0.0.1:{free_port()}", *STUB_ARGS],
        )  # fmt: skip
        stub.wait_healthy(60)
        response = recommend(stub.address, "user-5")
        failures = total(
            scrape(stub.metrics_port), "relaygr_recommend_admit_failures_total", grpc_code="UNAVAILABLE"
        )
    assert len(response.item_ids) == TOP_K
    assert not response.admitted and response.admit_reason == trigger_pb2.ADMIT_REASON_UNSPECIFIED
    assert failures == 1


def test_an_abandoning_stub_sends_every_admit_and_ranks_only_the_requests_it_keeps(fleet):
    router_metrics = fleet.endpoints()[ROUTER].metrics_url
    with Processes(log_dir=fleet.log_dir) as processes:
        stub = processes.start(
            "abandoning-stub", "services.retrieval_stub", RECOMMEND_SERVICE,
            ["--router", fleet.address(ROUTER), "--trigger", fleet.address(TRIGGER),
             "--abandon-fraction", "0.5", *STUB_ARGS],
        )  # fmt: skip
        stub.wait_healthy(60)
        admits_before = admit_calls(fleet)
        ranks_before = total(scrape(router_metrics), "grpc_server_started_total", grpc_method="Rank")
        responses = [recommend(stub.address, f"abandoned-user-{i}") for i in range(20)]
        ranks = total(scrape(router_metrics), "grpc_server_started_total", grpc_method="Rank") - ranks_before
        counted = total(scrape(stub.metrics_port), "relaygr_recommend_abandoned_total")
        assert admit_calls(fleet) - admits_before == len(responses)
    dropped = [response for response in responses if response.abandoned]
    assert 0 < len(dropped) < len(responses)  # P(all or none of 20 at one half) = 2e-6
    assert ranks == len(responses) - len(dropped) and counted == len(dropped)
    for response in dropped:
        assert not response.item_ids and response.cache_source == common_pb2.CACHE_SOURCE_UNSPECIFIED
        assert response.admit_reason != trigger_pb2.ADMIT_REASON_UNSPECIFIED  # the trigger answered
    assert all(len(response.item_ids) == TOP_K for response in responses if not response.abandoned)
