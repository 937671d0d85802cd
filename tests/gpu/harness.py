"""What the GPU tests share: the device, the bf16 score tolerance, random model inputs, and the CPU's
scores that a GPU path must reproduce."""

from __future__ import annotations

import numpy as np
import torch

from services.ranker.device.accelerator import Accelerator
from services.ranker.device.graphs import RankGraphs
from services.ranker.engine.runner import ModelRunner
from services.ranker.engine.scheduler import Priority, Scheduler
from services.ranker.model.events import Events
from services.ranker.model.hstu import HSTURanker
from services.ranker.model.presets import get_preset

CUDA = torch.device("cuda")
# bf16 keeps 8 bits of mantissa: scores in (0, 1) agree to a few units of 2^-8 between two exact-in-fp32
# orders of summation over thousands of tokens.
BF16_SCORE_ATOL = 2e-2


def inputs(preset, length: int, num_short: int, num_candidates: int, seed: int, device) -> tuple:
    """One user's (long, long actions, short, short actions, candidates) tensors on `device`."""
    generator = torch.Generator().manual_seed(seed)
    tensors = (
        torch.randint(0, 2**40, (1, length), generator=generator),
        torch.randint(0, preset.num_action_types, (1, length), generator=generator),
        torch.randint(0, 2**40, (1, num_short), generator=generator),
        torch.randint(0, preset.num_action_types, (1, num_short), generator=generator),
        torch.randint(0, 2**40, (1, num_candidates), generator=generator),
    )
    return tuple(t.to(device) for t in tensors)


def request_events(seed: int, length: int) -> tuple[Events, Events, list[int]]:
    """A Rank's (long-term events, 16 short-term events, 128 candidates), drawn from `seed`."""
    rng = np.random.default_rng(seed)
    long = Events.of(rng.integers(0, 2**40, length), rng.integers(0, 8, length))
    short = Events.of(rng.integers(0, 2**40, 16), rng.integers(0, 8, 16))
    return long, short, rng.integers(0, 2**40, 128).tolist()


def cpu_scores(preset, long: Events, short: Events, candidates: list[int]) -> list[float]:
    """The cached rank's scores on the CPU, in fp32: what every GPU path must reproduce."""
    cpu_runner = ModelRunner(HSTURanker(preset), Scheduler("cpu"), 256, None, "v")
    try:
        return cpu_runner.rank_sync(cpu_runner.build_sync(long, False), short, candidates)
    finally:
        cpu_runner.worker.close()


async def relayed_on_gpu(
    long: Events, short: Events, candidates: list[int], ranks: int = 1, graph_lengths: tuple[int, ...] = ()
) -> tuple[list[list[float]], RankGraphs | None]:
    """A cpu-small model on the GPU pre-infers `long` on the pre-infer stream (returning at launch), then
    ranks it on the rank stream, which waits for it by event, `ranks` times over; from CUDA graphs of
    `graph_lengths` when any are given (the graphs are returned too). The scores of each rank."""
    scheduler = Scheduler("gpu-test")
    model = HSTURanker(get_preset("cpu-small")).to(CUDA)
    accelerator = Accelerator(CUDA)
    graphs = RankGraphs(model, accelerator, graph_lengths, max_graphs=2) if graph_lengths else None
    runner = ModelRunner(model, scheduler, 256, None, "v", accelerator, graphs=graphs)
    try:
        scores = []
        for _ in range(ranks):
            prefix = await runner.pre_infer(long, Priority.PRE_INFER)
            assert prefix.ready is not None
            scores.append(await runner.rank(prefix, short, candidates, deadline=None))
        return scores, graphs
    finally:
        scheduler.close()
