"""The full cache lifecycle over loopback gRPC: DRAM tier, single-flight, extension, miss reasons."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from relaygr.v1 import common_pb2, ranker_pb2
from services.ranker.cache import PrefixLifecycle
from services.ranker.engine.scheduler import Priority
from tests.exact import assert_scores_equal
from tests.ranker.harness import LOSSY_TOLERANCE, held_bytes, running_ranker
from tests.support.metrics import metric
from tests.support.requests import history, pre_infer_request, rank_request

SHORT = [11, 12, 13]
CANDIDATES = [5, 99, 1234, 7, 42, 8]
KV_BYTES_PER_TOKEN = 512  # cpu-tiny


def run(coro):
    return asyncio.run(coro)


def test_consumed_entry_is_demoted_to_dram_and_hits_there_with_identical_scores():
    async def scenario():
        async with running_ranker() as r:
            long = history(1, 64)
            await r.stub.PreInfer(pre_infer_request("u1", long))
            first = await r.stub.Rank(rank_request("u1", long, SHORT, CANDIDATES))
            assert first.cache_source == common_pb2.CACHE_SOURCE_HBM
            await r.settle()
            assert len(r.cache.hbm) == 0
            assert len(r.cache.dram) == 1
            assert r.cache.dram.used_bytes == 64 * KV_BYTES_PER_TOKEN

            second = await r.stub.Rank(rank_request("u1", long, SHORT, CANDIDATES))
            assert second.cache_source == common_pb2.CACHE_SOURCE_DRAM and not second.lossy
            assert list(second.scores) == list(first.scores)
            await r.settle()
            # Reloaded and unchanged: demoting it again copies nothing and keeps one DRAM copy.
            assert len(r.cache.hbm) == 0
            assert len(r.cache.dram) == 1

    run(scenario())


def test_expired_lease_is_released_once_counted_and_demoted():
    async def scenario():
        async with running_ranker(lease_ttl_ms=100) as r:
            long = history(2, 48)
            expired = metric("relaygr_lease_expirations_total")
            await r.stub.PreInfer(pre_infer_request("u2", long))
            await r.settle()
            assert r.cache.leased() == 1
            await asyncio.sleep(0.4)
            await r.settle()
            assert r.cache.leased() == 0
            assert metric("relaygr_lease_expirations_total") == expired + 1
            assert len(r.cache.dram) == 1 and len(r.cache.hbm) == 0
            ranked = await r.stub.Rank(rank_request("u2", long, SHORT, CANDIDATES))
            assert ranked.cache_source == common_pb2.CACHE_SOURCE_DRAM
            assert_scores_equal(list(ranked.scores), r.reference(long, SHORT, CANDIDATES))
            await asyncio.sleep(0.3)
            assert metric("relaygr_lease_expirations_total") == expired + 1

    run(scenario())


def test_pre_infer_of_a_dram_resident_prefix_reloads_instead_of_recomputing():
    async def scenario():
        async with running_ranker() as r:
            long = history(3, 40)
            await r.stub.PreInfer(pre_infer_request("u3", long))
            await r.stub.Rank(rank_request("u3", long, SHORT, CANDIDATES))
            await r.settle()
            computes = metric("relaygr_productions_total", kind="compute")
            reloads = metric("relaygr_productions_total", kind="reload")
            answer = await r.stub.PreInfer(pre_infer_request("u3", long))
            assert answer.outcome == ranker_pb2.PRE_INFER_OUTCOME_RELOADED
            await r.settle()
            ranked = await r.stub.Rank(rank_request("u3", long, SHORT, CANDIDATES))
            assert ranked.cache_source == common_pb2.CACHE_SOURCE_HBM
            assert metric("relaygr_productions_total", kind="compute") == computes
            assert metric("relaygr_productions_total", kind="reload") == reloads + 1
            assert_scores_equal(list(ranked.scores), r.reference(long, SHORT, CANDIDATES))

    run(scenario())


def test_twenty_concurrent_ranks_of_a_cold_user_cause_one_production():
    async def scenario():
        async with running_ranker() as r:
            long = history(4, 200)
            productions = sum(
                metric("relaygr_productions_total", kind=k) for k in ("compute", "reload", "extend")
            )
            joins = metric("relaygr_production_joins_total")
            # Hold the device thread until all 20 have arrived, so none can come after the production.
            gate = threading.Event()
            r.app.worker.submit(gate.wait, Priority.RANK, "gate")
            ranks = [
                asyncio.ensure_future(r.stub.Rank(rank_request("u4", long, SHORT, CANDIDATES)))
                for _ in range(20)
            ]
            while sum(p.waiters for p in r.cache.productions.values()) < 20:
                await asyncio.sleep(0.005)
            gate.set()
            answers = await asyncio.gather(*ranks)
            after = sum(metric("relaygr_productions_total", kind=k) for k in ("compute", "reload", "extend"))
            assert after == productions + 1
            assert metric("relaygr_production_joins_total") == joins + 19
            reference = r.reference(long, SHORT, CANDIDATES)
            for answer in answers:
                assert answer.cache_source == common_pb2.CACHE_SOURCE_MISS
                assert answer.miss_reason == common_pb2.MISS_REASON_NEVER_PRE_INFERRED
                assert_scores_equal(list(answer.scores), reference)

    run(scenario())


def test_a_cancelled_waiter_never_cancels_the_shared_production():
    async def scenario():
        async with running_ranker(pre_infer_chunk_tokens=8) as r:
            long = history(5, 400)
            await r.stub.PreInfer(pre_infer_request("u5", long))
            waiter = asyncio.ensure_future(r.stub.Rank(rank_request("u5", long, SHORT, CANDIDATES)))
            await asyncio.sleep(0.005)
            waiter.cancel()
            survivor = await r.stub.Rank(rank_request("u5", long, SHORT, CANDIDATES))
            assert survivor.cache_source == common_pb2.CACHE_SOURCE_HBM
            assert_scores_equal(list(survivor.scores), r.reference(long, SHORT, CANDIDATES))

    run(scenario())


def test_extension_computes_only_the_appended_events_and_equals_full_recompute():
    async def scenario():
        async with running_ranker() as r:
            grown = history(6, 70)
            old = grown[:60]
            await r.stub.PreInfer(pre_infer_request("u6", old))
            await r.settle()
            extends = metric("relaygr_productions_total", kind="extend")
            ranked = await r.stub.Rank(rank_request("u6", grown, SHORT, CANDIDATES))
            assert ranked.cache_source == common_pb2.CACHE_SOURCE_EXTENDED
            assert metric("relaygr_productions_total", kind="extend") == extends + 1
            assert_scores_equal(list(ranked.scores), r.reference(grown, SHORT, CANDIDATES))
            # Extension from a DRAM-resident prefix too.
            await r.settle()
            longer = history(6, 75)
            again = await r.stub.Rank(rank_request("u6", longer, SHORT, CANDIDATES))
            assert again.cache_source == common_pb2.CACHE_SOURCE_EXTENDED
            assert_scores_equal(list(again.scores), r.reference(longer, SHORT, CANDIDATES))

    run(scenario())


def test_both_budgets_hold_under_a_storm_of_distinct_users():
    async def scenario():
        hbm_mb, dram_mb = 256 * 1024 / 2**20, 512 * 1024 / 2**20  # room for ~512 and ~1024 tokens
        async with running_ranker(hbm_budget_mb=hbm_mb, dram_budget_mb=dram_mb, lease_ttl_ms=50) as r:
            peak = {"hbm": 0, "dram": 0}
            # The tensors actually held, read from their storages: the tiers' counters cannot exceed the
            # budgets by construction, so the budget is checked against what the entries really keep.
            held_peak = {"hbm": 0, "dram": 0}
            stop = asyncio.Event()

            async def sample():
                while not stop.is_set():
                    peak["hbm"] = max(peak["hbm"], r.cache.hbm.used_bytes)
                    peak["dram"] = max(peak["dram"], r.cache.dram.used_bytes)
                    for tier, nbytes in held_bytes(r.cache).items():
                        held_peak[tier] = max(held_peak[tier], nbytes)
                    await asyncio.sleep(0)

            async def user(i: int):
                long = history(100 + i, 40 + (i * 37) % 200)
                await r.stub.PreInfer(pre_infer_request(f"storm-{i}", long))
                if i % 2:
                    answer = await r.stub.Rank(rank_request(f"storm-{i}", long, SHORT, CANDIDATES))
                    assert len(answer.scores) == len(CANDIDATES)

            sampler = asyncio.ensure_future(sample())
            for wave in range(15):  # waves of 8 concurrent users, so entries cycle through both tiers
                await asyncio.gather(*(user(8 * wave + i) for i in range(8)))
            await r.settle()
            stop.set()
            await sampler
            assert 0 < peak["hbm"] <= r.cache.hbm.budget_bytes
            assert 0 < peak["dram"] <= r.cache.dram.budget_bytes
            assert 0 < held_peak["hbm"] <= r.cache.hbm.budget_bytes, held_peak
            assert 0 < held_peak["dram"] <= r.cache.dram.budget_bytes, held_peak
            # Settled, every held byte is accounted for, exactly.
            assert held_bytes(r.cache) == {"hbm": r.cache.hbm.used_bytes, "dram": r.cache.dram.used_bytes}
            assert metric("relaygr_kv_cache_evictions_total", tier="dram", reason="capacity") > 0

    run(scenario())


def test_every_miss_reason_is_produced():
    async def scenario():
        seen = {}
        async with running_ranker(instance_name="ranker-a", dram_budget_mb=0, lease_ttl_ms=100) as r:
            long = history(7, 30)

            async def rank(user, seq=long, hint=""):
                answer = await r.stub.Rank(rank_request(user, seq, SHORT, CANDIDATES, relay_instance=hint))
                assert answer.cache_source == common_pb2.CACHE_SOURCE_MISS
                assert_scores_equal(list(answer.scores), r.reference(seq, SHORT, CANDIDATES))
                seen[answer.miss_reason] = user

            await rank("never")
            await rank("cold", hint="ranker-a")
            await rank("elsewhere", hint="ranker-b")
            # Without DRAM, a consumed entry leaves HBM for good.
            await r.stub.PreInfer(pre_infer_request("consumed", long))
            await r.stub.Rank(rank_request("consumed", long, SHORT, CANDIDATES))
            await rank("consumed")
            await r.stub.PreInfer(pre_infer_request("expired", long))
            await asyncio.sleep(0.35)
            await rank("expired")
            await r.stub.PreInfer(pre_infer_request("stale", long))
            await r.settle()
            changed = list(long)
            changed[0] += 1
            await rank("stale", changed)

        async with running_ranker(hbm_budget_mb=8 / 1024, dram_budget_mb=8 / 1024, dram_ttl_s=0.05) as r:
            small = history(8, 10)  # 5 KiB: fits each tier once
            refused = await r.stub.PreInfer(pre_infer_request("refused", history(9, 30)))
            assert refused.outcome == ranker_pb2.PRE_INFER_OUTCOME_REJECTED_CAPACITY
            await rank_in(r, "refused", history(9, 30), seen)
            await r.stub.PreInfer(pre_infer_request("dram", small))
            await r.stub.Rank(rank_request("dram", small, SHORT, CANDIDATES))
            await r.settle()
            assert len(r.cache.dram) == 1
            await asyncio.sleep(0.3)  # past the DRAM TTL
            await rank_in(r, "dram", small, seen)

        assert set(seen) == {
            common_pb2.MISS_REASON_NEVER_PRE_INFERRED,
            common_pb2.MISS_REASON_COLD,
            common_pb2.MISS_REASON_ROUTED_ELSEWHERE,
            common_pb2.MISS_REASON_EVICTED_HBM,
            common_pb2.MISS_REASON_LEASE_EXPIRED,
            common_pb2.MISS_REASON_STALE_PREFIX,
            common_pb2.MISS_REASON_REJECTED_CAPACITY,
            common_pb2.MISS_REASON_EVICTED_DRAM,
        }, {common_pb2.MissReason.Name(k): v for k, v in seen.items()}

    run(scenario())


async def rank_in(r, user, seq, seen):
    answer = await r.stub.Rank(rank_request(user, seq, SHORT, CANDIDATES))
    assert answer.cache_source == common_pb2.CACHE_SOURCE_MISS
    seen[answer.miss_reason] = user


# cpu-tiny's scales: 2 layers x keys and values x 2 heads, a float32 each.
FP8_SCALE_BYTES = 2 * 2 * 2 * 4


@pytest.mark.parametrize(
    ("precision", "dram_bytes"),
    [("bf16", 128 * KV_BYTES_PER_TOKEN // 2), ("fp8", 128 * KV_BYTES_PER_TOKEN // 4 + FP8_SCALE_BYTES)],
)
def test_lossy_dram_copies_move_scores_by_a_small_measured_epsilon_and_say_so(precision, dram_bytes):
    async def scenario():
        async with running_ranker(dram_precision=precision) as r:
            long = history(10, 128)
            reference = torch.tensor(r.reference(long, SHORT, CANDIDATES))
            lossy_before = metric("relaygr_rank_lossy_total", cache_source="dram")
            await r.stub.PreInfer(pre_infer_request("u10", long))
            exact = await r.stub.Rank(rank_request("u10", long, SHORT, CANDIDATES))
            assert exact.cache_source == common_pb2.CACHE_SOURCE_HBM and not exact.lossy
            assert_scores_equal(exact.scores, reference)
            await r.settle()
            assert r.cache.dram.used_bytes == dram_bytes == held_bytes(r.cache)["dram"]

            # A Rank that reloads the narrow copy: labelled lossy, close to the reference but not equal.
            lossy = await r.stub.Rank(rank_request("u10", long, SHORT, CANDIDATES))
            assert lossy.cache_source == common_pb2.CACHE_SOURCE_DRAM and lossy.lossy
            assert metric("relaygr_rank_lossy_total", cache_source="dram") == lossy_before + 1
            epsilon = (torch.tensor(lossy.scores) - reference).abs().max().item()
            print(f"{precision} DRAM score deviation epsilon = {epsilon:.2e}")
            assert 0 < epsilon < LOSSY_TOLERANCE[precision]
            with pytest.raises(AssertionError):
                assert_scores_equal(lossy.scores, reference)
            await r.settle()

            # A PreInfer that reloads it, then a Rank that hits HBM: still the lossy copy, still labelled.
            hbm_before = metric("relaygr_rank_lossy_total", cache_source="hbm")
            answer = await r.stub.PreInfer(pre_infer_request("u10", long))
            assert answer.outcome == ranker_pb2.PRE_INFER_OUTCOME_RELOADED
            await r.settle()
            hit = await r.stub.Rank(rank_request("u10", long, SHORT, CANDIDATES))
            assert hit.cache_source == common_pb2.CACHE_SOURCE_HBM and hit.lossy
            assert list(hit.scores) == list(lossy.scores)
            assert metric("relaygr_rank_lossy_total", cache_source="hbm") == hbm_before + 1
            await r.settle()

            # An extension of the lossy prefix inherits its loss.
            grown = history(10, 140)
            extended = await r.stub.Rank(rank_request("u10", grown, SHORT, CANDIDATES))
            assert extended.cache_source == common_pb2.CACHE_SOURCE_EXTENDED and extended.lossy

            # A user whose prefix never went through DRAM is exact, and not labelled.
            other = history(11, 64)
            await r.stub.PreInfer(pre_infer_request("u11", other))
            fresh = await r.stub.Rank(rank_request("u11", other, SHORT, CANDIDATES))
            assert fresh.cache_source == common_pb2.CACHE_SOURCE_HBM and not fresh.lossy
            assert_scores_equal(fresh.scores, r.reference(other, SHORT, CANDIDATES))

    run(scenario())


def test_a_prefix_larger_than_its_reservation_is_refused_not_squeezed_past_the_budget():
    """`Tier.resize` refuses growth past the budget; the cache must then drop the KV, not keep it."""

    async def scenario():
        budget_tokens = 100
        async with running_ranker(hbm_budget_mb=budget_tokens * KV_BYTES_PER_TOKEN / 2**20) as r:
            long = history(7, 80)
            # The cache reserves half of what the model produces (as a wrong per-token size would), so an
            # 80-event prefix reserves 40 tokens' bytes and comes out at 80: more than the 100-token budget
            # can take on top of the other user's held prefix.
            await r.stub.PreInfer(pre_infer_request("other", history(8, 40)))
            await r.settle()
            r.cache.bytes_per_token = KV_BYTES_PER_TOKEN // 2
            refused = await r.stub.PreInfer(pre_infer_request("u7", long))
            assert refused.outcome == ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED  # refused only once produced
            await r.settle()
            assert r.cache.hbm.used_bytes == 40 * KV_BYTES_PER_TOKEN
            assert held_bytes(r.cache)["hbm"] == 40 * KV_BYTES_PER_TOKEN
            ranked = await r.stub.Rank(rank_request("u7", long, SHORT, CANDIDATES))
            assert ranked.cache_source == common_pb2.CACHE_SOURCE_MISS
            assert ranked.miss_reason == common_pb2.MISS_REASON_REJECTED_CAPACITY
            assert_scores_equal(ranked.scores, r.reference(long, SHORT, CANDIDATES))
            await r.settle()
            assert r.cache.hbm.used_bytes <= r.cache.hbm.budget_bytes
            assert held_bytes(r.cache)["hbm"] <= r.cache.hbm.budget_bytes

    run(scenario())


def test_the_cache_is_the_lifecycle_the_data_plane_drives_and_reports_its_budgets_and_leases():
    async def scenario():
        async with running_ranker() as r:
            assert isinstance(r.cache, PrefixLifecycle) and r.app.plane.cache is r.cache
            assert r.cache.budgets() == (r.cache.hbm.budget_bytes, r.cache.dram.budget_bytes)
            long = history(2, 40)
            await r.stub.PreInfer(pre_infer_request("u2", long))
            await r.settle()
            assert r.cache.leased_bytes() == 40 * KV_BYTES_PER_TOKEN == held_bytes(r.cache)["hbm"]
            profile = r.app.plane.profile()
            assert (profile.hbm_capacity_bytes, profile.dram_capacity_bytes) == r.cache.budgets()

    run(scenario())
