"""Tier copies through the pinned host pool, forced on CPU (`Accelerator(cpu, copies=True)`) so the path an
accelerator takes runs here: a DRAM copy is one slab view of the entry's bytes, a reload hands layers over
one marker at a time and the model waits for each just before that layer, a slab is never reused while a
reload reads it, and a real prefix cache demotes, reloads and ranks exactly as from HBM, with every slab
given back exactly once."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest
import torch

from services.ranker.app import RankerApp
from services.ranker.cache.acquired import Source
from services.ranker.device.accelerator import Accelerator
from services.ranker.device.copier import PoolExhausted, TierCopier
from services.ranker.device.host_pool import HostPool
from services.ranker.model.hstu import HSTURanker
from services.ranker.model.kv_precision import FP8, dequantize, quantize
from services.ranker.model.prefix_kv import PrefixKV
from services.ranker.model.presets import get_preset
from tests.exact import assert_scores_equal
from tests.ranker.harness import CANDIDATES, LOSSY_TOLERANCE, SHORT, cache_app, events, rank, settle
from tests.support.metrics import metric
from tests.support.requests import history

CPU = torch.device("cpu")
TINY = get_preset("cpu-tiny")


class Marker:
    """An event of a device that runs behind the host: pending until the host waits for it."""

    def __init__(self, device: LaggingCopies, index: int) -> None:
        self.device, self.index, self.done = device, index, False

    def record(self, stream=None) -> None:
        self.device.log.append(("record", self.index))

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.device.log.append(("synchronize", self.index))
        self.done = True

    def wait(self, stream=None) -> None:
        self.device.log.append(("wait", self.index))


class LaggingCopies(Accelerator):
    """The CPU copy path with events that stay pending until waited for, logging what the copier asks."""

    def __init__(self) -> None:
        super().__init__(CPU, copies=True)
        self.log: list[tuple[str, int]] = []
        self.events: list[Marker] = []

    def event(self) -> Marker:
        marker = Marker(self, len(self.events))
        self.events.append(marker)
        return marker


def aligned(nbytes: int, alignment: int = 512) -> int:
    return -(-nbytes // alignment) * alignment


def entry(layers: int = 3, length: int = 7, seed: int = 0) -> PrefixKV:
    generator = torch.Generator().manual_seed(seed)
    return PrefixKV(torch.randn((layers, 2, 1, 2, length, 4), generator=generator))


def test_a_dram_copy_is_one_slab_view_of_the_entrys_bytes():
    pool = HostPool(1 << 16)
    copier = TierCopier(Accelerator(CPU, copies=True), torch.float32, torch.float32, pool)
    kv = entry()
    dram = copier.to_dram(kv)
    (slab,) = pool.slabs()
    assert dram.buffer.data_ptr() == pool.arena.data_ptr() + slab.offset  # in the arena, not a new tensor
    assert dram.buffer.is_contiguous() and dram.buffer.shape == kv.buffer.shape
    assert pool.used_bytes == slab.nbytes == aligned(kv.nbytes())
    torch.testing.assert_close(dram.buffer, kv.buffer)
    assert copier.held() == 1
    back = copier.to_hbm(dram).wait()
    assert back.buffer.data_ptr() != dram.buffer.data_ptr()
    torch.testing.assert_close(back.buffer, kv.buffer)


def test_a_lossy_copy_is_bf16_in_half_the_bytes_and_widens_on_reload():
    pool = HostPool(1 << 16)
    copier = TierCopier(Accelerator(CPU, copies=True), torch.float32, torch.bfloat16, pool)
    kv = entry(length=9)
    dram = copier.to_dram(kv)
    assert dram.dtype == torch.bfloat16 and pool.used_bytes == aligned(kv.nbytes() // 2)
    assert torch.equal(dram.buffer, kv.buffer.to(torch.bfloat16))
    back = copier.to_hbm(dram).wait()
    assert back.dtype == torch.float32
    assert torch.equal(back.buffer, kv.buffer.to(torch.bfloat16).to(torch.float32))


def test_an_fp8_copy_is_its_scales_then_its_bytes_in_one_slab_and_reloads_as_in_place():
    pool = HostPool(1 << 16)
    copier = TierCopier(Accelerator(CPU, copies=True), torch.float32, FP8, pool)
    kv = entry(length=9)
    dram = copier.to_dram(kv)
    (slab,) = pool.slabs()
    scale_bytes = 3 * 2 * 1 * 2 * 4  # a float32 a layer, keys or values, user and head
    assert dram.dtype == FP8 and dram.scale.data_ptr() == pool.arena.data_ptr() + slab.offset
    assert dram.buffer.data_ptr() == dram.scale.data_ptr() + scale_bytes
    assert dram.nbytes() == copier.dram_nbytes(kv.buffer.shape) == kv.nbytes() // 4 + scale_bytes
    assert pool.used_bytes == aligned(dram.nbytes())
    in_place = TierCopier(Accelerator(CPU), torch.float32, FP8, None)
    expected = in_place.to_dram(kv)
    quantized, scale = quantize(kv.buffer)
    assert torch.equal(dram.buffer.view(torch.uint8), quantized.view(torch.uint8))
    assert torch.equal(expected.buffer.view(torch.uint8), quantized.view(torch.uint8))
    assert torch.equal(dram.scale, scale) and torch.equal(expected.scale, scale)
    back = copier.to_hbm(dram).wait()
    assert back.dtype == torch.float32 and back.scale is None
    assert torch.equal(back.buffer, in_place.to_hbm(expected).buffer)
    assert torch.equal(back.buffer, dequantize(quantized, scale, torch.float32))
    assert torch.equal(copier.to_host(kv).buffer.view(torch.uint8), quantized.view(torch.uint8))
    copier.release(dram)
    assert pool.used_bytes == 0 and copier.held() == 0
    arrived = copier.new_dram(tuple(kv.buffer.shape))  # a peer's entry: a slab of the same layout
    assert arrived.scale.data_ptr() == pool.arena.data_ptr() + pool.slabs()[0].offset
    assert arrived.nbytes() == dram.nbytes() and pool.used_bytes == aligned(dram.nbytes())


def test_without_copies_the_tiers_share_memory():
    copier = TierCopier(Accelerator(CPU), torch.float32, torch.float32, None)
    kv = entry()
    assert copier.to_dram(kv) is kv and copier.to_hbm(kv) is kv and not copier.copies
    lossy = TierCopier(Accelerator(CPU), torch.float32, torch.bfloat16, None).to_dram(kv)
    assert torch.equal(lossy.buffer, kv.buffer.to(torch.bfloat16))
    with pytest.raises(ValueError, match="needs a HostPool"):
        TierCopier(Accelerator(CPU, copies=True), torch.float32, torch.float32, None)


def test_a_copy_out_waits_for_the_producers_markers_then_for_its_own_event_only():
    device = LaggingCopies()
    copier = TierCopier(device, torch.float32, torch.float32, HostPool(1 << 16))
    produced = [device.event() for _ in range(3)]
    kv = PrefixKV(entry().buffer, ready=produced)
    copier.to_dram(kv)
    # The copy stream waited for each layer's producer, then the host for the copy's own event.
    assert device.log == [("wait", 0), ("wait", 1), ("wait", 2), ("record", 3), ("synchronize", 3)]


def test_a_reload_returns_at_once_and_the_model_waits_for_each_layer_just_before_it():
    preset = dataclasses.replace(TINY, num_layers=4)
    model = HSTURanker(preset).eval()
    items = torch.arange(1, 25).reshape(1, -1)
    actions = torch.zeros_like(items)
    kv = model.pre_infer(items, actions)
    device = LaggingCopies()
    copier = TierCopier(device, torch.float32, torch.float32, HostPool(1 << 20))
    dram = copier.to_dram(kv)
    device.log.clear()
    reloaded = copier.to_hbm(dram)
    # One copy and one marker per layer, none waited for by the host: the reload has only been queued.
    assert [kind for kind, _ in device.log] == ["record"] * 4
    assert len(reloaded.ready) == 4 and not any(marker.query() for marker in reloaded.ready)
    device.log.clear()
    for index, layer in enumerate(model.layers):  # log when each layer starts computing
        layer.project = _logged(layer.project, device.log, index)
    short, short_actions = torch.tensor([SHORT]), torch.zeros(1, 3, dtype=torch.int64)
    scores = model.score(reloaded, short, short_actions, torch.as_tensor(CANDIDATES).reshape(1, -1))
    first_marker = reloaded.ready[0].index
    waits = [(kind, index - first_marker if kind == "wait" else index) for kind, index in device.log]
    # Layer l's keys are waited for after layer l - 1 ran, only when layer l needs them: in the pass over the
    # short-term events (which overlaps the reload), then again (complete by then) in the candidates' pass.
    assert waits == [(kind, layer) for layer in range(4) for kind in ("compute", "wait")] * 2
    for layer in model.layers:
        del layer.project
    assert_scores_equal(
        scores[0], model.score(kv, short, short_actions, torch.as_tensor(CANDIDATES).reshape(1, -1))[0]
    )


def _logged(project, log, index):
    def logged(x):
        log.append(("compute", index))
        return project(x)

    return logged


def test_a_slab_is_not_reused_while_a_reload_reads_it():
    device = LaggingCopies()
    kv = entry()
    size = aligned(kv.nbytes())
    pool = HostPool(2 * size)
    copier = TierCopier(device, torch.float32, torch.float32, pool)
    dram = copier.to_dram(kv)
    (read,) = pool.slabs()
    device.log.clear()
    reload = copier.to_hbm(dram)
    copier.release(dram)  # the DRAM copy is dropped while its reload is still in flight
    assert pool.pending_frees() == 1 and read in pool.slabs()
    other = copier.reserve(size)
    assert other is not None and other.offset != read.offset
    assert not any(kind == "synchronize" for kind, _ in device.log)
    # The pool is full: the next slab waits for the reload's last copy, then reuses its slab.
    again = copier.reserve(size)
    assert again.offset == read.offset and ("synchronize", reload.ready[-1].index) in device.log
    with pytest.raises(ValueError, match="released twice"):
        copier.release(dram)


def test_an_entry_larger_than_the_pool_is_refused_and_holds_nothing():
    pool = HostPool(1024)
    copier = TierCopier(Accelerator(CPU, copies=True), torch.float32, torch.float32, pool)
    with pytest.raises(PoolExhausted):
        copier.to_dram(entry())
    small = copier.reserve(512)
    with pytest.raises(PoolExhausted, match="its slab has 512"):
        copier.to_dram(entry(), small)
    assert pool.used_bytes == 0 and copier.held() == 0


def copying_app(**overrides):
    return cache_app(Accelerator(CPU, copies=True), **overrides)


def first_byte(dram: PrefixKV) -> int:
    """Where a DRAM copy's slab starts: at its scales (FP8), else at its buffer."""
    return (dram.buffer if dram.scale is None else dram.scale).data_ptr()


def pool_matches_the_entries(app: RankerApp) -> None:
    """The slabs out of the pool are exactly those of the DRAM copies entries hold: none leaked, none
    given back while held."""
    pool, copier = app.cache.copier.pool, app.cache.copier
    held = {first_byte(e.dram) for e in app.cache.entries.values() if e.dram is not None}
    assert pool.pending_frees() == 0  # CPU copies are complete when queued
    assert {pool.arena.data_ptr() + slab.offset for slab in pool.slabs()} == held
    assert copier.held() == len(held)
    assert pool.used_bytes <= app.cache.dram.budget_bytes and app.cache.dram.used_bytes <= pool.used_bytes


def test_demote_and_reload_through_the_pool_rank_exactly_as_from_hbm():
    async def scenario():
        hbm_mb, dram_mb = 200 * 512 / 2**20, 400 * 512 / 2**20
        async with copying_app(hbm_budget_mb=hbm_mb, dram_budget_mb=dram_mb) as app:
            await app.warm_up()
            cache = app.cache
            assert cache.copier.copies and cache.copier.pool.capacity_bytes == cache.dram.budget_bytes
            long = history(1, 40)
            await cache.pre_infer("u1", events(long))
            await settle(app)
            from_hbm, source = await rank(app, "u1", long)  # consumes the lease, then demotes
            assert source is Source.HBM
            await settle(app)
            (demoted,) = cache.entries.values()
            assert demoted.hbm is None and demoted.dram is not None
            pool_matches_the_entries(app)
            from_dram, source = await rank(app, "u1", long)
            assert source is Source.DRAM
            assert_scores_equal(from_dram, from_hbm)
            assert_scores_equal(from_dram, app.runner.full_sync(events(long), events(SHORT), CANDIDATES))
            await settle(app)
            pool_matches_the_entries(app)

            # Pressure: DRAM holds about five of these histories, so copies are evicted and their slabs
            # reused; every rank stays exact and the pool always matches what the entries hold.
            sources = set()
            evicted = metric("relaygr_kv_cache_evictions_total", tier="dram", reason="capacity")
            rng = random.Random(3)
            for _ in range(40):
                number = rng.randrange(9)
                user, long = f"u{number}", history(number, 30 + 9 * number)
                scores, source = await rank(app, user, long)
                sources.add(source)
                assert_scores_equal(scores, app.runner.full_sync(events(long), events(SHORT), CANDIDATES))
                await settle(app)
                pool_matches_the_entries(app)
            assert {Source.DRAM, Source.MISS} <= sources
            assert metric("relaygr_kv_cache_evictions_total", tier="dram", reason="capacity") > evicted
            # TTL: idle DRAM copies go, and their slabs with them.
            cache.dram_ttl_s = 0.0
            cache.sweep()
            pool_matches_the_entries(app)
            assert app.cache.copier.pool.used_bytes == 0

    asyncio.run(scenario())


def test_fp8_copies_under_pressure_keep_the_pool_the_tier_and_the_copies_in_step():
    async def scenario():
        # cpu-tiny in fp8: 128 bytes an event and 32 of scales; DRAM holds four or five of these histories.
        async with copying_app(dram_budget_mb=40_000 / 2**20, dram_precision="fp8") as app:
            await app.warm_up()
            cache, sources = app.cache, set()
            rng = random.Random(5)
            for _ in range(30):
                number = rng.randrange(9)
                user, long = f"u{number}", history(number, 30 + 9 * number)
                scores, source = await rank(app, user, long)
                sources.add(source)
                reference = app.runner.full_sync(events(long), events(SHORT), CANDIDATES)
                error = (torch.tensor(scores) - torch.tensor(reference)).abs().max().item()
                assert error < LOSSY_TOLERANCE["fp8"]
                await settle(app)
                pool_matches_the_entries(app)
                for held in (e for e in cache.entries.values() if e.dram is not None):
                    assert held.dram.nbytes() == cache.dram.size(held.key) == 128 * held.length + 32
            assert {Source.DRAM, Source.MISS} <= sources

    asyncio.run(scenario())


def test_a_fragmented_pool_evicts_until_one_slab_fits():
    """DRAM's bytes suffice but not in one piece: the demotion evicts the copy that splits the free ranges,
    then takes the one slab that is whole again; the budget holds throughout."""

    async def scenario():
        async with copying_app(hbm_budget_mb=100 * 512 / 2**20, dram_budget_mb=30 * 512 / 2**20) as app:
            await app.warm_up()
            cache, pool = app.cache, app.cache.copier.pool
            for number in range(3):  # three 10-token copies fill DRAM, in this order in the arena
                await rank(app, f"u{number}", history(number, 10))
                await settle(app)
            users = {entry.key.user_id: entry for entry in cache.entries.values()}
            offsets = [users[f"u{n}"].dram.buffer.data_ptr() - pool.arena.data_ptr() for n in range(3)]
            assert offsets == [0, 10 * 512, 20 * 512]
            cache.moves.remove(users["u0"], "superseded")
            cache.moves.remove(users["u2"], "superseded")
            assert cache.dram.free_bytes() == 20 * 512 and pool.largest_free() == 10 * 512
            long = history(3, 15)
            scores, _ = await rank(app, "u3", long)  # 15 tokens fit the tier's bytes, not one free range
            await settle(app)
            (kept,) = cache.entries.values()
            assert kept.key.user_id == "u3" and kept.dram is not None and kept.hbm is None
            pool_matches_the_entries(app)
            assert cache.dram.used_bytes == 15 * 512 and pool.used_bytes == 15 * 512
            from_dram, source = await rank(app, "u3", long)
            assert source is Source.DRAM
            assert_scores_equal(from_dram, scores)

    asyncio.run(scenario())
