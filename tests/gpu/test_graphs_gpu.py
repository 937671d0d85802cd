"""CUDA graphs of the cached rank on a real GPU (`make test-gpu`; skipped without one, see conftest.py).

- fp32: ranks replayed from captured graphs equal the eager rank, one user and a batch, for users other than
  those present at capture, and a shorter prefix after a longer one in the same bucket sees none of it.
- bf16 `gpu-dlrmv3`: a graphed rank equals the full recomputation within the preset's tolerance.
- Through the runner: a prefix pre-inferred on the pre-infer stream, ranked from a graph on the rank stream
  with no host wait between them, equals the CPU's scores.
"""

from __future__ import annotations

import asyncio

import torch
from torch.testing import assert_close

from services.ranker.device.accelerator import Accelerator
from services.ranker.device.graphs import Bucket, RankGraphs
from services.ranker.model.hstu import CachedRank, HSTURanker
from services.ranker.model.presets import get_preset
from tests.gpu.harness import BF16_SCORE_ATOL, CUDA, cpu_scores, inputs, relayed_on_gpu, request_events


def cached(model: HSTURanker, seed: int, length: int, num_short: int, num_candidates: int) -> CachedRank:
    long, long_actions, short, short_actions, candidates = inputs(
        model.preset, length, num_short, num_candidates, seed, CUDA
    )
    prefix = model.pre_infer(long, long_actions, chunk_size=256)
    return CachedRank(prefix, short[0].cpu(), short_actions[0].cpu(), candidates[0].cpu())


def eager(model: HSTURanker, request: CachedRank) -> torch.Tensor:
    on_gpu = [t.to(CUDA)[None] for t in (request.short_items, request.short_actions, request.candidates)]
    return model.score(request.prefix, *on_gpu)[0].cpu()


def test_fp32_replays_equal_the_eager_rank_for_new_users_and_leave_no_stale_prefix():
    model = HSTURanker(get_preset("cpu-small")).to(CUDA)
    graphs = RankGraphs(model, Accelerator(CUDA), (512, 2048), max_graphs=8)
    assert graphs.capture
    first = cached(model, 0, 1500, 8, 100)
    graphs.scores([first])  # captures the (1, 2048, 8, 128) bucket with this user
    for seed, length in ((1, 2000), (2, 700), (3, 1999)):  # new users, the same bucket; 700 after 2000
        user = cached(model, seed, length, 8, 100)
        assert graphs.bucket([user]) == Bucket(1, 2048, 8, 128)
        assert_close(graphs.scores([user])[0], eager(model, user))
    batch = [cached(model, 10 + i, length, s, c) for i, (length, s, c) in enumerate(
        ((300, 0, 20), (511, 5, 64), (100, 16, 1)))]  # fmt: skip
    for _ in range(2):  # capture, then a replay
        for user, scores in zip(batch, graphs.scores(batch), strict=True):
            assert_close(scores, eager(model, user))
    assert graphs.captures == 2 and graphs.replays == 6


def test_a_bf16_graphed_rank_equals_the_full_recomputation_within_epsilon():
    preset = get_preset("gpu-dlrmv3")
    model = HSTURanker(preset).to(CUDA)
    graphs = RankGraphs(model, Accelerator(CUDA), (4096,), max_graphs=2)
    long, long_actions, short, short_actions, candidates = inputs(preset, 3000, 32, 256, 7, CUDA)
    request = CachedRank(model.pre_infer(long, long_actions, 512), short[0].cpu(), short_actions[0].cpu(),
                         candidates[0].cpu())  # fmt: skip
    full = torch.sigmoid(model.full_forward(long, long_actions, short, short_actions, candidates)[0, :, 0])
    for _ in range(2):
        assert_close(graphs.scores([request])[0], full.float().cpu(), atol=BF16_SCORE_ATOL, rtol=0)


def test_a_pre_inferred_prefix_ranked_from_a_graph_across_streams_ranks_like_the_cpu():
    async def scenario():
        long, short, candidates = request_events(1, 3000)
        # The first rank captures, the second replays.
        scores, graphs = await relayed_on_gpu(long, short, candidates, ranks=2, graph_lengths=(4096,))
        assert graphs.captures == 1 and graphs.replays == 2
        expected = cpu_scores(get_preset("cpu-small"), long, short, candidates)
        for got in scores:
            assert_close(torch.tensor(got), torch.tensor(expected), atol=1e-4, rtol=1e-4)

    asyncio.run(scenario())
