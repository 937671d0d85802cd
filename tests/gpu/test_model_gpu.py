"""The model and the runner on a CUDA GPU (`make test-gpu`; skipped without one, see conftest.py).

- `gpu-dlrmv3` in bf16: the cached rank against the full recomputation, within the preset's tolerance.
- fp32 on the GPU: batched cached ranks equal one user at a time, and both equal the CPU.
- The stream hand-off under real asynchrony: a prefix pre-inferred on the low-priority stream and ranked on
  the high-priority rank stream (no host synchronisation between them) equals the CPU's scores.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from torch.testing import assert_close

from services.ranker.model.hstu import CachedRank, HSTURanker
from services.ranker.model.presets import get_preset
from tests.gpu.harness import BF16_SCORE_ATOL, CUDA, cpu_scores, inputs, relayed_on_gpu, request_events


@pytest.mark.parametrize("length", [512, 2048, 8192])
def test_bf16_cached_rank_equals_full_recomputation_within_epsilon(length):
    preset = get_preset("gpu-dlrmv3")
    model = HSTURanker(preset).to(CUDA)
    long, long_actions, short, short_actions, candidates = inputs(preset, length, 32, 256, length, CUDA)
    prefix = model.pre_infer(long, long_actions, chunk_size=512)
    cached = model.score(prefix, short, short_actions, candidates)
    full = torch.sigmoid(model.full_forward(long, long_actions, short, short_actions, candidates)[..., 0])
    assert_close(cached, full, atol=BF16_SCORE_ATOL, rtol=0)


def test_fp32_batched_ranks_on_the_gpu_equal_one_at_a_time_and_the_cpu():
    preset = get_preset("cpu-small")
    cpu_model, gpu_model = HSTURanker(preset), HSTURanker(preset).to(CUDA)
    shapes = [(300, 8, 64), (1200, 0, 16), (77, 31, 128)]
    requests, cpu_scores = [], []
    for seed, (length, num_short, num_candidates) in enumerate(shapes):
        cpu_inputs = inputs(preset, length, num_short, num_candidates, seed, "cpu")
        cpu_prefix = cpu_model.pre_infer(*cpu_inputs[:2], chunk_size=256)
        cpu_scores.append(cpu_model.score(cpu_prefix, *cpu_inputs[2:])[0])
        gpu_inputs = [t.to(CUDA) for t in cpu_inputs]
        prefix = gpu_model.pre_infer(*gpu_inputs[:2], chunk_size=256)
        requests.append(CachedRank(prefix, gpu_inputs[2][0], gpu_inputs[3][0], gpu_inputs[4][0]))
    batched = gpu_model.score_batch(requests)
    for request, scores, on_cpu in zip(requests, batched, cpu_scores, strict=True):
        alone = gpu_model.score(request.prefix, request.short_items[None], request.short_actions[None],
                                request.candidates[None])[0]  # fmt: skip
        assert_close(scores, alone)
        assert_close(scores.cpu(), on_cpu, atol=1e-4, rtol=1e-4)  # TF32 and kernel choices differ by device


def test_a_prefix_handed_across_streams_by_event_ranks_like_the_cpu():
    async def scenario():
        long, short, candidates = request_events(0, 4096)
        (scores,), _ = await relayed_on_gpu(long, short, candidates)
        expected = cpu_scores(get_preset("cpu-small"), long, short, candidates)
        assert_close(torch.tensor(scores), torch.tensor(expected), atol=1e-4, rtol=1e-4)

    asyncio.run(scenario())
