"""The retrieval stub's data plane driven without gRPC: a Recommend as `recommend(user_id, top_k)` over a
fake `Upstream` that takes and gives plain values, at a fixed universe time."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import numpy as np
import pytest

from services.common.errors import InvalidArgument, Unavailable
from services.retrieval_stub.config import RetrievalStubConfig
from services.retrieval_stub.dataplane import NOT_ADMITTED, Admitted, Ranked, RecommendPlane, Retrieved
from services.workload.universe import UserUniverse

EPOCH_MS = 1_750_000_000_000
NOW_MS = EPOCH_MS + 61_234
CONFIG = RetrievalStubConfig(
    universe_epoch_ms=EPOCH_MS, history_min=24, history_median=64, history_max=512, num_candidates=32,
    relay_window_ms=0.0,
)  # fmt: skip
ADMITTED = Admitted(admitted=True, reason=1, relay_instance="ranker-1")


class Upstream:
    """Admits as told, scores each candidate by its item id (the best is the largest id) from HBM, and
    records every call."""

    def __init__(self, admit: Admitted = ADMITTED, rank_error: Exception | None = None) -> None:
        self.answer, self.rank_error = admit, rank_error
        self.encoded: list[Retrieved] = []
        self.admits: list[tuple[Retrieved, object]] = []
        self.ranks: list[tuple[Retrieved, object, str]] = []

    def encode(self, retrieved: Retrieved) -> object:
        self.encoded.append(retrieved)
        return ("encoded", retrieved.user_id)

    async def admit(self, retrieved: Retrieved, encoded: object) -> Admitted:
        self.admits.append((retrieved, encoded))
        return self.answer

    async def rank(self, retrieved: Retrieved, encoded: object, relay_instance: str) -> Ranked:
        self.ranks.append((retrieved, encoded, relay_instance))
        if self.rank_error is not None:
            raise self.rank_error
        return Ranked(
            scores=retrieved.candidates.astype(np.float32),
            cache_source=1,
            instance=relay_instance or "ranker-0",
            miss_reason=0,
            lossy=False,
            computed_prefix_events=0,
            prefix_wait_ms=0.25,
        )


def recommend(upstream: Upstream, user_id: str = "user-7", top_k: int = 5, config=CONFIG):
    universe = UserUniverse(config, clock=lambda: NOW_MS)
    return asyncio.run(RecommendPlane(config, universe, upstream).recommend(user_id, top_k)), universe


def test_a_recommend_ranks_what_retrieval_found_with_the_admits_hint_and_answers_the_top_k():
    upstream = Upstream()
    answer, universe = recommend(upstream)
    history, candidates = universe.history("user-7", NOW_MS), universe.candidates("user-7", NOW_MS)
    # One encoding of the retrieved history, sent with both calls.
    [retrieved] = upstream.encoded
    assert (retrieved.user_id, retrieved.now_ms) == ("user-7", NOW_MS)
    assert retrieved.history.long_term.item_ids.tolist() == history.long_term.item_ids.tolist()
    assert retrieved.candidates.tolist() == candidates.tolist()
    assert upstream.admits == [(retrieved, ("encoded", "user-7"))]
    assert upstream.ranks == [(retrieved, ("encoded", "user-7"), "ranker-1")]
    # The five largest ids, best first, each with its score.
    best = sorted(candidates.tolist(), reverse=True)[:5]
    assert answer.item_ids == best and answer.scores == [float(item) for item in best]
    assert (answer.admit, answer.instance, answer.cache_source, answer.abandoned) == (
        ADMITTED,
        "ranker-1",
        1,
        False,
    )
    assert (answer.long_term_length, answer.request_time_ms) == (len(history.long_term), NOW_MS)
    assert answer.prefix_wait_ms == 0.25 and answer.rank_latency_ms > 0


def test_an_admit_that_came_to_nothing_ranks_without_a_hint():
    upstream = Upstream(admit=NOT_ADMITTED)
    answer, _ = recommend(upstream)
    assert upstream.ranks[0][2] == "" and answer.instance == "ranker-0" and not answer.admit.admitted


def test_the_baseline_sends_no_admit():
    upstream = Upstream()
    answer, _ = recommend(upstream, config=dataclasses.replace(CONFIG, relay=False))
    assert upstream.admits == [] and upstream.ranks[0][2] == "" and answer.admit == NOT_ADMITTED
    assert len(answer.item_ids) == 5


@pytest.mark.parametrize(
    "user_id, top_k, field",
    [("", 5, "user_id"), ("u" * 257, 5, "user_id"), ("user-7", 0, "top_k"), ("user-7", 33, "top_k")],
)
def test_a_bad_request_is_refused_naming_its_field_before_any_call(user_id, top_k, field):
    upstream = Upstream()
    with pytest.raises(InvalidArgument) as refused:
        recommend(upstream, user_id, top_k)
    assert refused.value.field == field
    assert (upstream.encoded, upstream.admits, upstream.ranks) == ([], [], [])


def test_a_failed_rank_fails_the_recommend_with_its_own_error():
    with pytest.raises(Unavailable, match="no ranker"):
        recommend(Upstream(rank_error=Unavailable("no ranker")))


def test_pre_processing_takes_the_relay_window_while_the_admit_runs():
    class SlowAdmit(Upstream):
        async def admit(self, retrieved, encoded):
            self.admit_started = time.perf_counter()
            return await super().admit(retrieved, encoded)

    upstream = SlowAdmit()
    started = time.perf_counter()
    recommend(upstream, config=dataclasses.replace(CONFIG, relay_window_ms=80.0))
    elapsed = time.perf_counter() - started
    assert elapsed >= 0.08  # the window is waited out
    assert upstream.admit_started - started < 0.08  # and the Admit was sent within it, not after
