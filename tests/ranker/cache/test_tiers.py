"""Byte-budgeted tiers and DRAM eviction policies, without tensors."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.ranker.cache.tiers import LruPolicy, SizeAwarePolicy, Tier


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["reserve", "release", "resize"]), st.integers(0, 9), st.integers(0, 400))
    )
)
def test_reservations_never_exceed_the_budget(operations):
    tier = Tier("hbm", 1000)
    held: dict[int, int] = {}
    for op, key, nbytes in operations:
        if op == "reserve" and key not in tier:
            if tier.reserve(key, nbytes, now=0.0):
                held[key] = nbytes
        elif op == "release" and key in tier:
            assert tier.release(key) == held.pop(key)
        elif op == "resize" and key in tier and tier.resize(key, nbytes):
            held[key] = nbytes
        assert tier.used_bytes == sum(held.values()) <= tier.budget_bytes
        assert len(tier) == len(held)


def test_lru_evicts_least_recently_used_first():
    tier = Tier("dram", 100, LruPolicy())
    for key in "abc":
        tier.reserve(key, 10, now=0.0)
    tier.touch("a", now=1.0)
    assert list(tier.victims()) == ["b", "c", "a"]


def test_size_aware_evicts_the_largest_of_the_older_half_first():
    tier = Tier("dram", 1000, SizeAwarePolicy())
    for key, nbytes in [("a", 10), ("b", 300), ("c", 20), ("d", 500)]:
        tier.reserve(key, nbytes, now=0.0)
    assert list(tier.victims()) == ["b", "a", "c", "d"]


def test_idle_keys_are_listed_oldest_first_and_stop_at_a_recent_one():
    tier = Tier("dram", 100)
    tier.reserve("a", 1, now=1.0)
    tier.reserve("b", 1, now=2.0)
    tier.reserve("c", 1, now=3.0)
    tier.touch("a", now=4.0)
    assert tier.idle_keys(older_than=3.5) == ["b", "c"]
    assert tier.idle_keys(older_than=1.5) == []
