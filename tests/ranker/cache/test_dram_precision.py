"""The DRAM tier at each `--dram-precision`, at equal bytes: how many users' prefixes it keeps, counted from
the bytes its copies actually hold (the tensors' storages, not the tier's counter), and what a Rank served
from a copy then scores: exactly the full pass at `exact`, within a measured ε at `bf16` and `fp8`, and
labelled lossy there."""

from __future__ import annotations

import asyncio

import pytest
import torch

from services.ranker.cache.acquired import Source
from services.ranker.device.accelerator import Accelerator
from tests.exact import assert_scores_equal
from tests.ranker.harness import (
    CANDIDATES,
    LOSSY_TOLERANCE,
    SHORT,
    cache_app,
    events,
    held_bytes,
    rank,
    settle,
)
from tests.support.requests import history

EVENTS = 40  # a user's prefix
FP32_USER_BYTES = EVENTS * 512  # cpu-tiny's 512 bytes an event in fp32
BUDGET_BYTES = 10 * FP32_USER_BYTES  # the DRAM tier of every ranker here
USERS = 45  # more than the tier holds at any precision


async def fill(precision: str) -> tuple[int, int, float]:
    """Ranks USERS users one after another (each prefix computed, then demoted to DRAM, the oldest evicted
    as DRAM fills) on a ranker at `precision`: the users whose DRAM copies it then holds, the bytes those
    copies hold, and the largest |score - full pass| of a Rank served from the last user's copy."""
    async with cache_app(dram_precision=precision, dram_budget_mb=BUDGET_BYTES / 2**20) as app:
        cache = app.cache
        for user in range(USERS):
            await rank(app, f"u{user}", history(user, EVENTS))
            await settle(app)
        held = held_bytes(cache)
        resident = [entry for entry in cache.entries.values() if entry.dram is not None]
        assert held["hbm"] == 0 and all(entry.hbm is None for entry in resident)
        assert held["dram"] == cache.dram.used_bytes <= BUDGET_BYTES
        # Every resident copy is the same size, and one more would not have fit: the tier is full.
        (user_bytes,) = {entry.dram.nbytes() for entry in resident}
        assert held["dram"] == len(resident) * user_bytes and BUDGET_BYTES - held["dram"] < user_bytes

        last = f"u{USERS - 1}"
        long = history(USERS - 1, EVENTS)
        scores, source = await rank(app, last, long)
        assert source is Source.DRAM
        (entry,) = cache.index.of_user(last)
        assert entry.lossy == (precision != "exact")
        reference = app.runner.full_sync(events(long), events(SHORT), CANDIDATES)
        if precision == "exact":
            assert_scores_equal(scores, reference)
        epsilon = (torch.tensor(scores) - torch.tensor(reference)).abs().max().item()
        return len(resident), held["dram"], epsilon


def test_fp8_keeps_twice_the_users_of_bf16_and_four_times_fp32_in_the_same_dram_bytes():
    async def scenario():
        return {precision: await fill(precision) for precision in ("exact", "bf16", "fp8")}

    found = asyncio.run(scenario())
    users = {precision: count for precision, (count, _, _) in found.items()}
    held = {precision: nbytes for precision, (_, nbytes, _) in found.items()}
    print(f"resident users in {BUDGET_BYTES} DRAM bytes: {users}; bytes held: {held}")
    assert users["exact"] == 10 and held["exact"] == 10 * FP32_USER_BYTES
    # fp8: a quarter of fp32's bytes plus a float32 a layer, keys or values and head (2 x 2 x 2 here).
    assert held["fp8"] == users["fp8"] * (FP32_USER_BYTES // 4 + 2 * 2 * 2 * 4)
    assert users["fp8"] >= 1.9 * users["bf16"] and users["fp8"] >= 3.8 * users["exact"]
    assert users["bf16"] >= 2 * users["exact"]
    for precision in ("bf16", "fp8"):
        _, _, epsilon = found[precision]
        assert 0 < epsilon < LOSSY_TOLERANCE[precision], (precision, epsilon)


@pytest.mark.parametrize("precision", ["exact", "fp8"])
def test_a_copy_through_the_pinned_pool_serves_the_scores_of_one_kept_in_place(precision):
    """The pool path (scales first in the slab, then the bytes) and the in-place path give one DRAM copy
    and one reload, bit for bit."""

    async def scores_from_dram(accelerator) -> tuple[list[float], bytes, bytes]:
        async with cache_app(accelerator, dram_precision=precision) as app:
            long = history(3, 64)
            await rank(app, "u3", long)
            await settle(app)
            (entry,) = app.cache.entries.values()
            dram = entry.dram
            copied = bytes(dram.buffer.view(torch.uint8).numpy())
            scale = b"" if dram.scale is None else bytes(dram.scale.numpy())
            scores, source = await rank(app, "u3", long)
            assert source is Source.DRAM and entry.lossy == (precision == "fp8")
            return scores, copied, scale

    async def scenario():
        in_place = await scores_from_dram(None)
        pooled = await scores_from_dram(Accelerator(torch.device("cpu"), copies=True))
        return in_place, pooled

    in_place, pooled = asyncio.run(scenario())
    assert pooled == in_place
