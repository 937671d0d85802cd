"""The model and the runner on a CUDA GPU (`make test-gpu`; skipped without one, see conftest.py).

- `gpu-dlrmv3` in bf16: the cached rank against the full recomputation, within the preset's tolerance.
- fp32 on the GPU: batched cached ranks equal one user at a time, and both equal the CPU.
- The stream hand-off under real asynchrony: a prefix pre-inferred on the low-priority stream and ranked on
  the high-priority rank stream (no host synchronisation between them) equals the CPU's scores.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from services.ranker.device.accelerator import Accelerator
from services.ranker.engine.runner import ModelRunner
from services.ranker.engine.scheduler import Priority, Scheduler
from services.ranker.model.events import Events
from services.ranker.model.hstu import CachedRank, HSTURanker
from services.ranker.model.presets import get_preset

CUDA = torch.device("cuda")
# bf16 keeps 8 bits of mantissa: scores in (0, 1) agree to a few units of 2^-8 between two exact-in-fp32
# orders of summation over thousands of tokens.
BF16_SCORE_ATOL = 2e-2


def inputs(preset, length: int, num_short: int, num_candidates: int, seed: int, device) -> tuple:
    generator = torch.Generator().manual_seed(seed)
    tensors = (
        torch.randint(0, 2**40, (1, length), generator=generator),
        torch.randint(0, preset.num_action_types, (1, length), generator=generator),
        torch.randint(0, 2**40, (1, num_short), generator=generator),
        torch.randint(0, preset.num_action_types, (1, num_short), generator=generator),
        torch.randint(0, 2**40, (1, num_candidates), generator=generator),
    )
    return tuple(t.to(device) for t in tensors)


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
        preset = get_preset("cpu-small")
        rng = np.random.default_rng(0)
        long = Events.of(rng.integers(0, 2**40, 4096), rng.integers(0, 8, 4096))
        short = Events.of(rng.integers(0, 2**40, 16), rng.integers(0, 8, 16))
        candidates = rng.integers(0, 2**40, 128).tolist()
        scheduler = Scheduler("gpu-test")
        model = HSTURanker(preset).to(CUDA)
        runner = ModelRunner(model, scheduler, 256, None, "v", Accelerator(CUDA))
        try:
            prefix = await runner.pre_infer(long, Priority.PRE_INFER)  # pre-infer stream, returns at launch
            assert prefix.ready is not None
            scores = await runner.rank(prefix, short, candidates, deadline=None)  # rank stream waits by event
        finally:
            scheduler.close()
        cpu_runner = ModelRunner(HSTURanker(preset), Scheduler("cpu"), 256, None, "v")
        try:
            expected = cpu_runner.rank_sync(cpu_runner.build_sync(long, False), short, candidates)
        finally:
            cpu_runner.worker.close()
        assert_close(torch.tensor(scores), torch.tensor(expected), atol=1e-4, rtol=1e-4)

    asyncio.run(scenario())
