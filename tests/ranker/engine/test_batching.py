"""Cross-request batching of cached ranks: exact against one user at a time, and through the service.

The model's `rank_batch` packs several users' short-term and candidate tokens into one pass, each attending
to its own prefix; a Rank served in a batch through the real gRPC service equals the full recomputation.
How the scheduler groups queued jobs into a batch is in test_scheduler.py.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from relaygr.v1 import common_pb2
from services.ranker.engine.scheduler import Priority
from services.ranker.model.hstu import CachedRank, HSTURanker
from services.ranker.model.presets import get_preset
from tests.exact import assert_scores_equal
from tests.ranker.harness import blocked, running_ranker, user_request
from tests.support.metrics import metric
from tests.support.requests import history, pre_infer_request, rank_request

TINY = get_preset("cpu-tiny")


@pytest.fixture(scope="module")
def model() -> HSTURanker:
    return HSTURanker(TINY)


users = st.lists(
    st.tuples(st.integers(1, 80), st.integers(0, 12), st.integers(1, 20)), min_size=1, max_size=6
)


@settings(max_examples=12, deadline=None)
@given(shapes=users, seed=st.integers(0, 2**16))
def test_a_batch_ranks_every_user_as_if_alone(model, shapes, seed):
    requests = [user_request(model, seed + i, *shape) for i, shape in enumerate(shapes)]
    batched = model.rank_batch(requests)
    assert [logits.shape for logits in batched] == [(c, TINY.num_tasks) for _, _, c in shapes]
    for request, logits in zip(requests, batched, strict=True):
        alone = model.rank(request.prefix, request.short_items[None], request.short_actions[None],
                           request.candidates[None])[0]  # fmt: skip
        assert logits.dtype == torch.float32
        assert_close(logits, alone)


def test_a_batch_equals_the_full_recomputation_of_each_user(model):
    generator = torch.Generator().manual_seed(3)
    requests, references = [], []
    for length, num_short, num_candidates in ((40, 3, 5), (7, 0, 9), (64, 12, 1)):
        long = torch.randint(0, 2**40, (1, length), generator=generator)
        long_actions = torch.randint(0, TINY.num_action_types, (1, length), generator=generator)
        short = torch.randint(0, 2**40, (num_short,), generator=generator)
        short_actions = torch.randint(0, TINY.num_action_types, (num_short,), generator=generator)
        candidates = torch.randint(0, 2**40, (num_candidates,), generator=generator)
        requests.append(CachedRank(model.pre_infer(long, long_actions, 16), short, short_actions, candidates))
        full = model.full_forward(long, long_actions, short[None], short_actions[None], candidates[None])
        references.append(torch.sigmoid(full[0, :, 0]))
    for scores, reference in zip(model.score_batch(requests), references, strict=True):
        assert_close(scores, reference)


def test_a_user_cannot_see_another_in_the_batch(model):
    """Changing one user's prefix changes that user's scores and nobody else's."""
    first, second = user_request(model, 1, 30, 4, 6), user_request(model, 2, 30, 4, 6)
    other = user_request(model, 9, 30, 4, 6)
    before = model.rank_batch([first, second])
    after = model.rank_batch([first, second._replace(prefix=other.prefix)])
    assert_close(after[0], before[0])
    assert (after[1] - before[1]).abs().max() > 1e-4


def test_bad_input_in_a_batch_names_the_problem(model):
    request = user_request(model, 4, 10, 2, 3)
    with pytest.raises(ValueError, match="at least one candidate"):
        model.rank_batch([request, request._replace(candidates=torch.zeros(0, dtype=torch.long))])


# ---- through the service ----


def test_ranks_queued_together_are_served_in_one_pass_and_stay_exact():
    async def scenario():
        async with running_ranker(rank_batch_max=8) as r:
            users = {f"u{i}": history(i, 20 + 7 * i) for i in range(5)}
            for user, long in users.items():
                await r.stub.PreInfer(pre_infer_request(user, long))
            await r.settle()
            short, candidates = [11, 12], [5, 99, 1234, 7]
            batches = metric("relaygr_device_batch_size_count", op="rank")
            batched_ranks = metric("relaygr_device_batch_size_sum", op="rank")
            ranks_before = metric("relaygr_model_seconds_count", op="rank")
            gate = blocked(r.app.worker)
            calls = [
                asyncio.ensure_future(r.stub.Rank(rank_request(user, long, short, candidates, "ranker-a")))
                for user, long in users.items()
            ]
            # Every Rank is queued behind the held device thread before it is let go.
            for _ in range(500):
                if r.app.worker.queued(Priority.RANK) == len(users):
                    break
                await asyncio.sleep(0.01)
            assert r.app.worker.queued(Priority.RANK) == len(users)
            gate.set()
            answers = await asyncio.gather(*calls)
            assert metric("relaygr_device_batch_size_count", op="rank") - batches == 1
            assert metric("relaygr_device_batch_size_sum", op="rank") - batched_ranks == len(users)
            # Each Rank is counted as a job of its own, with its share of the pass's time.
            assert metric("relaygr_model_seconds_count", op="rank") - ranks_before == len(users)
            for long, answer in zip(users.values(), answers, strict=True):
                assert answer.cache_source == common_pb2.CACHE_SOURCE_HBM
                assert_scores_equal(list(answer.scores), r.reference(long, short, candidates))

    asyncio.run(scenario())
