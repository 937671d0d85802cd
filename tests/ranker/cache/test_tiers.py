"""Byte-budgeted tiers and DRAM eviction policies, without tensors."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.ranker.cache.tiers import LruPolicy, Recency, SizeAwarePolicy, Tier


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


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 60), min_size=1, max_size=30),
    touched=st.lists(st.integers(0, 29), max_size=20),
    kept=st.sets(st.integers(0, 29)),
    need=st.integers(1, 400),
)
def test_make_room_evicts_in_lru_order_until_it_fits_skipping_what_evict_keeps(sizes, touched, kept, need):
    """The LRU order is read as eviction goes: the same keys go, in the same order, as from a snapshot of
    the order taken before; keys `evict` keeps (pinned, in use) are offered once and passed over."""
    tier = Tier("dram", 400, LruPolicy())
    held = {key for key, nbytes in enumerate(sizes) if tier.reserve(key, nbytes, now=float(key))}
    for key in touched:
        if key in tier:
            tier.touch(key, now=100.0 + len(touched))
    snapshot = list(tier.victims())
    expected_gone, free = [], tier.free_bytes()
    for key in snapshot:
        if free >= need:
            break
        if key not in kept:
            expected_gone.append(key)
            free += sizes[key]
    offered: list[int] = []

    def evict(key: int) -> None:
        offered.append(key)
        if key not in kept:
            tier.release(key)

    fits = tier.make_room(need, evict)
    assert fits == (free >= need)
    assert [key for key in offered if key not in kept] == expected_gone
    assert len(offered) == len(set(offered))  # each key offered once
    assert all(key not in tier for key in expected_gone) and all(key in tier for key in kept & held)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["use", "forget"]), st.integers(0, 12), st.integers(0, 20))))
def test_keys_are_ordered_by_last_use_whatever_order_the_uses_are_recorded_in(operations):
    """A use stamped earlier than the newest (an entry handed off, stamped with its last use on its sender)
    takes its place by its time; uses at the same time keep the order they were recorded in."""
    recency, model = Recency(), {}
    for step, (op, key, at) in enumerate(operations):
        if op == "use":
            recency.place(key, float(at))
            model[key] = (float(at), step)
        elif key in model:
            recency.forget(key)
            del model[key]
        expected = sorted(model, key=model.__getitem__)
        assert [(key, at) for key, at in recency.walk()] == [(key, model[key][0]) for key in expected]
        assert recency.oldest() == (model[expected[0]][0] if expected else None)
        assert len(recency) == len(model)


@settings(max_examples=100, deadline=None)
@given(
    times=st.lists(st.integers(0, 50), min_size=1, max_size=60),
    behind=st.lists(st.integers(0, 50), max_size=10),
)
def test_a_walk_reads_the_order_as_it_goes_and_visits_each_key_once(times, behind):
    """Forgetting the keys walked (as eviction does), enough of them to compact the order under the walk,
    and placing uses behind the walk's position: every key is yielded once, in order, and those placed
    behind are not."""
    recency = Recency()
    for key, at in enumerate(times):
        recency.place(key, float(at))
    expected = sorted(range(len(times)), key=lambda key: (times[key], key))
    walked, extra = [], iter(behind)
    for key, at in recency.walk():
        walked.append(key)
        recency.forget(key)
        late = next(extra, None)
        if late is not None:  # a new key, used before the one just walked
            recency.place(("behind", len(walked)), min(float(late), at) - 1.0)
    assert walked == expected
    assert all(isinstance(key, tuple) for key, _ in recency.walk())  # only those placed behind are left
