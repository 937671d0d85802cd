"""The prefix cache on its own, without gRPC: pins are owned handles and none leak, leases end once, the
tier's `make_room` is the one eviction loop, and every Rank's scores equal a full recompute."""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest

from relaygr.v1 import common_pb2
from services.ranker.cache.acquired import Source
from services.ranker.cache.index import CacheEntry, PrefixKey
from services.ranker.cache.tiers import Tier
from tests.exact import assert_scores_equal
from tests.ranker.harness import CANDIDATES, SHORT, cache_app, events, held_bytes, rank, settle
from tests.support.requests import history


def test_a_pin_is_an_owned_handle_released_once():
    entry = CacheEntry(PrefixKey("u", "f", "v"), events([1, 2, 3]))
    first, second = entry.pin("rank"), entry.pin("extend of u")
    assert entry.pinned and {p.owner for p in entry.pins} == {"rank", "extend of u"}
    assert first.release() is entry and first.released
    assert first.release() is None  # a second release changes nothing
    assert entry.pins == {second}
    second.release()
    assert not entry.pinned


def test_make_room_evicts_in_policy_order_only_what_it_may():
    tier = Tier("t", budget_bytes=100)
    for key in ("a", "b", "c"):
        tier.reserve(key, 30)
    kept = {"a"}  # in use: its evictor leaves it
    evicted = []

    def evict(key):
        if key not in kept:
            evicted.append(key)
            tier.release(key)

    assert tier.make_room(40, evict)  # 10 free: one eviction is enough, the oldest that may go
    assert evicted == ["b"] and tier.used_bytes == 60
    assert not tier.make_room(101, evict)  # larger than the budget: nothing is evicted for it
    assert evicted == ["b"]
    assert not tier.make_room(80, evict)  # "a" stays, so 80 cannot fit, though "c" went trying
    assert evicted == ["b", "c"] and "a" in tier


def test_a_mixed_workload_leaks_no_pin_no_lease_and_stays_exact():
    """Pre-infers, hits, joins, extensions, stale prefixes, cancelled waiters and tier pressure, straight
    through the cache; when it settles, no pin is held, no lease outlives its TTL, and every score
    equals a full recompute."""

    async def scenario():
        hbm_mb, dram_mb = 200 * 512 / 2**20, 400 * 512 / 2**20
        async with cache_app(hbm_budget_mb=hbm_mb, dram_budget_mb=dram_mb, lease_ttl_ms=50) as app:
            await app.warm_up()
            cache = app.cache
            rng = random.Random(7)
            histories = {f"u{i}": history(i, 20 + 7 * i) for i in range(12)}
            sources = set()

            async def one(step: int) -> None:
                user = f"u{rng.randrange(12)}"
                long = histories[user]
                action = rng.random()
                if action < 0.15:  # the user acted since: extension, or a stale prefix once it was cut
                    histories[user] = long = [*long, step * 31 + 1]
                elif action < 0.2:
                    histories[user] = long = [*long[:-2], step, step + 1]
                if rng.random() < 0.5:
                    await cache.pre_infer(user, events(long))
                if rng.random() < 0.2:  # a Rank that gives up while waiting: its pin must come back
                    waiting = asyncio.ensure_future(rank(app, user, long, "ranker-a"))
                    await asyncio.sleep(0)
                    waiting.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await waiting
                    return
                scores, source = await rank(app, user, long, "ranker-a")
                sources.add(source)
                reference = app.runner.full_sync(events(long), events(SHORT), CANDIDATES)
                assert_scores_equal(scores, reference)

            for wave in range(12):
                await asyncio.gather(*(one(8 * wave + i) for i in range(8)))
                held = held_bytes(cache)
                assert held["hbm"] <= cache.hbm.budget_bytes and held["dram"] <= cache.dram.budget_bytes
            await settle(app)
            assert cache.pins() == []
            await asyncio.sleep(0.1)
            cache.sweep()
            await settle(app)
            assert cache.leased() == 0 and cache.pins() == []
            assert {Source.HBM, Source.MISS} <= sources, sources

    asyncio.run(scenario())


@pytest.mark.parametrize("join", [False, True])
def test_each_waiter_of_a_production_gets_its_own_pin(join: bool):
    async def scenario():
        async with cache_app() as app:
            await app.warm_up()
            cache, long = app.cache, history(3, 64)
            if join:
                await cache.pre_infer("u", events(long))
            acquired = await asyncio.gather(*(cache.acquire("u", events(long), "") for _ in range(3)))
            entry = acquired[0].entry
            assert all(a.entry is entry for a in acquired)
            assert len({id(a.pin) for a in acquired}) == 3 and entry.pins == {a.pin for a in acquired}
            for a in acquired:
                cache.release(a)
            assert cache.pins() == []
            expected = common_pb2.CACHE_SOURCE_HBM if join else common_pb2.CACHE_SOURCE_MISS
            assert acquired[0].source.value == expected

    asyncio.run(scenario())


def test_a_waiter_cancelled_as_its_production_completes_gives_its_pin_back():
    """The narrowest window: the production is done and has pinned the entry for every waiter, and one
    waiter is cancelled before it resumes. Its pin must be released, not leaked."""

    async def scenario():
        async with cache_app() as app:
            await app.warm_up()
            cache, long = app.cache, events(history(4, 64))
            first = asyncio.ensure_future(cache.acquire("u", long, ""))
            await asyncio.sleep(0)
            production = cache.productions[cache.key("u", long)]
            waiter: asyncio.Future | None = None
            # Runs when the production completes, before the waiter's own wake-up (registered later).
            production.task.add_done_callback(lambda _: waiter.cancel())
            waiter = asyncio.ensure_future(cache.acquire("u", long, ""))
            acquired = await first
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
            assert waiter.cancelled()
            assert [p.owner for p in cache.pins()] == ["rank"]  # only the first Rank's
            cache.release(acquired)
            assert cache.pins() == []

    asyncio.run(scenario())
