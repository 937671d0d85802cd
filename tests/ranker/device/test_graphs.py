"""CUDA graphs of the cached rank, checked on CPU: the packing into fixed shapes is what a graph replays.

`RankGraphs(capture=False)` fills the same padded inputs a captured graph reads and runs the same body
(`HSTURanker.score_padded`), so exactness against the eager rank (fp32, `assert_close` defaults), the zeroed
prefix tail, the buckets and the LRU bound are all tested here; tests/gpu checks the capture and replay.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from services.ranker.device.accelerator import Accelerator
from services.ranker.device.graphs import Bucket, RankGraphs
from services.ranker.engine.runner import ModelRunner
from services.ranker.engine.scheduler import Scheduler
from services.ranker.model.events import Events
from services.ranker.model.hstu import CachedRank, HSTURanker
from services.ranker.model.presets import get_preset
from tests.ranker.harness import user_request

TINY = get_preset("cpu-tiny")
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model() -> HSTURanker:
    return HSTURanker(TINY)


def graphs_for(model: HSTURanker, buckets=(16, 64, 128), max_graphs: int = 8) -> RankGraphs:
    return RankGraphs(model, Accelerator(CPU), buckets, max_graphs, capture=False)


def eager(model: HSTURanker, request: CachedRank) -> torch.Tensor:
    return model.score(request.prefix, request.short_items[None], request.short_actions[None],
                       request.candidates[None])[0]  # fmt: skip


users = st.lists(
    st.tuples(st.integers(1, 128), st.integers(0, 12), st.integers(1, 40)), min_size=1, max_size=5
)


@settings(max_examples=15, deadline=None)
@given(shapes=users, seed=st.integers(0, 2**16))
def test_a_graphed_rank_equals_the_eager_rank_of_each_user(model, shapes, seed):
    graphs = graphs_for(model)
    requests = [user_request(model, seed + i, *shape) for i, shape in enumerate(shapes)]
    scores = graphs.scores(requests)
    assert scores is not None and graphs.replays == 1
    for request, graphed in zip(requests, scores, strict=True):
        assert graphed.dtype == torch.float32 and graphed.shape == request.candidates.shape
        assert_close(graphed, eager(model, request))


def test_a_shorter_prefix_after_a_longer_one_in_the_same_bucket_sees_none_of_it(model):
    graphs = graphs_for(model)
    long_user, short_user = user_request(model, 1, 60, 4, 9), user_request(model, 2, 20, 4, 9)
    assert graphs.bucket([long_user]) == graphs.bucket([short_user]) == Bucket(1, 64, 8, 16)
    graphs.scores([long_user])
    graph = graphs._graphs[Bucket(1, 64, 8, 16)]
    assert graph.kv[:, :, 0, :, 20:60].abs().sum() > 0  # the long user's keys are in the row
    assert_close(graphs.scores([short_user])[0], eager(model, short_user))
    assert torch.count_nonzero(graph.kv[:, :, 0, :, 20:]) == 0  # and gone once the short one is ranked
    assert graphs.captures == 1 and graphs.replays == 2


def test_buckets_round_lengths_up_and_a_prefix_past_the_last_is_not_graphed(model):
    graphs = graphs_for(model, buckets=(16, 64))
    user = user_request(model, 3, 17, 0, 20)
    assert graphs.bucket([user]) == Bucket(users=1, length=64, short=0, candidates=32)
    two = [user, user_request(model, 4, 5, 9, 3)]
    assert graphs.bucket(two) == Bucket(users=2, length=64, short=16, candidates=32)
    too_long = user_request(model, 5, 65, 2, 4)
    assert graphs.bucket([too_long]) is None and graphs.scores([too_long]) is None
    assert graphs.captures == 0


def test_past_max_graphs_the_least_recently_used_bucket_is_dropped(model):
    graphs = graphs_for(model, buckets=(16, 64, 128), max_graphs=2)
    a, b, c = (user_request(model, seed, length, 2, 4) for seed, length in ((6, 10), (7, 50), (8, 100)))
    graphs.scores([a])
    graphs.scores([b])
    graphs.scores([a])  # a is now the most recently used
    graphs.scores([c])
    assert list(graphs._graphs) == [graphs.bucket([a]), graphs.bucket([c])]
    assert_close(graphs.scores([b])[0], eager(model, b))  # b is captured again, exactly
    assert graphs.captures == 4


def test_a_bad_request_is_refused_naming_the_positions(model):
    graphs = graphs_for(model, buckets=(TINY.max_positions,))
    user = user_request(model, 9, 10, 0, 2)
    past_the_table = CachedRank(
        user.prefix.to(CPU), torch.zeros(TINY.max_positions, dtype=torch.int64),
        torch.zeros(TINY.max_positions, dtype=torch.int64), user.candidates,
    )  # fmt: skip
    with pytest.raises(ValueError, match="positions"):
        graphs.scores([past_the_table])


def test_capture_is_refused_off_cuda(model):
    with pytest.raises(ValueError, match="CUDA device"):
        RankGraphs(model, Accelerator(CPU), (64,), 4, capture=True)


def test_the_runner_ranks_through_graphs_exactly_and_falls_back_past_the_buckets(model):
    rng = np.random.default_rng(0)
    scheduler = Scheduler("graphs-test")
    graphs = graphs_for(model, buckets=(64,))
    graphed = ModelRunner(model, scheduler, 16, None, "v", graphs=graphs)
    plain = ModelRunner(model, scheduler, 16, None, "v")
    try:
        items = []
        for length in (30, 64, 90):  # 90 is past the only bucket: eager
            long = Events.of(rng.integers(0, 2**40, length), rng.integers(0, 8, length))
            short = Events.of(rng.integers(0, 2**40, 5), rng.integers(0, 8, 5))
            items.append((plain.build_sync(long, False), short, rng.integers(0, 2**40, 12).tolist()))
        for item in items:
            assert_close(torch.tensor(graphed.rank_sync(*item)), torch.tensor(plain.rank_sync(*item)))
        assert graphs.replays == 2
        batched = graphed.rank_batch_sync(items[:2])
        for got, item in zip(batched, items[:2], strict=True):
            assert_close(torch.tensor(got), torch.tensor(plain.rank_sync(*item)))
        assert graphs.replays == 3 and graphs.captures == 2  # one user, then two, in the 64 bucket
        with pytest.raises(ValueError, match="microbatch"):
            ModelRunner(model, scheduler, 16, 4, "v", graphs=graphs)
    finally:
        scheduler.close()
