"""The benchmark's users: revisits within a window, reproducible per point, and the universes' shapes."""

from __future__ import annotations

import numpy as np
import pytest

from bench.lib.workload import RevisitSampler, fixed_length_universe, mix_universe
from services.common.config import load
from services.retrieval_stub.config import RetrievalStubConfig
from services.workload.universe import UserUniverse

EPOCH_MS = 1_750_000_000_000


def users(sampler: RevisitSampler, count: int) -> list[str]:
    return [sampler.user(i) for i in range(count)]


def test_the_same_namespace_and_seed_give_the_same_users_and_other_namespaces_other_users():
    a = users(RevisitSampler("L2048-r8", rate=8, revisit_probability=0.5, window_s=5, seed=0), 500)
    assert a == users(RevisitSampler("L2048-r8", rate=8, revisit_probability=0.5, window_s=5, seed=0), 500)
    b = users(RevisitSampler("L4096-r8", rate=8, revisit_probability=0.5, window_s=5, seed=0), 500)
    assert not set(a) & set(b)
    out_of_order = RevisitSampler("L2048-r8", rate=8, revisit_probability=0.5, window_s=5, seed=0)
    assert [out_of_order.user(i) for i in (300, 7, 499)] == [a[300], a[7], a[499]]


@pytest.mark.parametrize("probability", [0.0, 0.5, 0.8])
def test_about_the_configured_share_of_requests_revisit_a_user_of_the_window(probability):
    rate, window_s, count = 20.0, 5.0, 4000
    drawn = users(RevisitSampler("p", rate, probability, window_s, seed=3), count)
    last_seen: dict[str, int] = {}
    revisits = 0
    for index, user in enumerate(drawn):
        if user in last_seen:
            revisits += 1
            assert index - last_seen[user] <= rate * window_s  # within the window, in requests
        last_seen[user] = index
    assert revisits / count == pytest.approx(probability, abs=0.03)


def test_bad_sampler_settings_are_refused():
    for probability, rate, window_s in [(1.0, 1, 1), (-0.1, 1, 1), (0.5, 0, 1), (0.5, 1, 0)]:
        with pytest.raises(ValueError):
            RevisitSampler("p", rate, probability, window_s, seed=0)


def universe_of(stub_args: tuple[str, ...]) -> UserUniverse:
    config = load(RetrievalStubConfig, [*stub_args, "--universe-epoch-ms", str(EPOCH_MS)], environ={})
    return UserUniverse(config)


def test_a_fixed_length_universe_starts_every_user_at_the_length_and_grows_by_appending():
    spec = fixed_length_universe(long_term=3000, short_term=16, growth_headroom=256, seed=0)
    universe = universe_of(spec.stub_args)
    for i in range(20):
        assert len(universe.history(f"u-{i}", EPOCH_MS).long_term) == 3000
    early = universe.history("u-1", EPOCH_MS)
    later = universe.history("u-1", EPOCH_MS + 20 * 60_000)  # 20 to 60 more events
    assert 3000 < len(later.long_term) <= spec.max_long_term
    assert np.array_equal(later.long_term.item_ids[:3000], early.long_term.item_ids)  # appended: extendable
    assert spec.label == "L3000"


def test_the_mix_is_lognormal_around_its_median_and_capped():
    spec = mix_universe(median=512, sigma=1.0, maximum=2048, short_term=16, seed=0)
    universe = universe_of(spec.stub_args)
    lengths = np.array([len(universe.history(f"u-{i}", EPOCH_MS).long_term) for i in range(2000)])
    assert lengths.max() == spec.max_long_term == 2048
    assert abs(np.median(lengths) - 512) / 512 < 0.1
    assert 0.05 < np.mean(lengths == 2048) < 0.12  # P(lognormal > 4 x median) at sigma 1 is 8%
