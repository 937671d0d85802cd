"""The synthetic user universe: deterministic, heavy-tailed, Zipf-skewed, growing by appending."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest

from services.launcher.procs import REPO_ROOT
from services.workload.universe import UniverseConfig, UserHistory, UserUniverse

EPOCH_MS = 1_750_000_000_000
MINUTE_MS = 60_000
CONFIG = UniverseConfig(universe_epoch_ms=EPOCH_MS)


class FakeClock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def whole(history: UserHistory) -> dict[str, np.ndarray]:
    return {
        field: np.concatenate([getattr(history.long_term, field), getattr(history.short_term, field)])
        for field in ("item_ids", "action_types", "timestamps_ms")
    }


def digest(universe: UserUniverse, user_ids: list[str], now_ms: int) -> str:
    h = hashlib.sha256()
    for user_id in user_ids:
        for array in whole(universe.history(user_id, now_ms)).values():
            h.update(array.astype(np.int64).tobytes())
        h.update(universe.candidates(user_id, now_ms).tobytes())
    return h.hexdigest()


def test_same_user_id_gives_the_same_user_in_another_instance_and_another_process():
    user_ids = [f"user-{i}" for i in range(20)]
    now_ms = EPOCH_MS + 7 * MINUTE_MS
    here = digest(UserUniverse(CONFIG), user_ids, now_ms)
    assert digest(UserUniverse(dataclasses.replace(CONFIG)), user_ids, now_ms) == here
    script = (
        "import sys; from services.workload.universe import UniverseConfig, UserUniverse;"
        "from tests.workload.test_universe import digest;"
        f"print(digest(UserUniverse(UniverseConfig(universe_epoch_ms={EPOCH_MS})), {user_ids!r}, {now_ms}))"
    )
    other = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    )  # fmt: skip
    assert other.stdout.strip() == here


def test_another_seed_gives_other_users():
    a = UserUniverse(CONFIG).history("user-1", EPOCH_MS)
    b = UserUniverse(dataclasses.replace(CONFIG, universe_seed=1)).history("user-1", EPOCH_MS)
    assert not (len(a) == len(b) and np.array_equal(whole(a)["item_ids"], whole(b)["item_ids"]))


@pytest.mark.parametrize("distribution", ["lognormal", "pareto"])
def test_history_lengths_are_heavy_tailed_within_bounds(distribution):
    universe = UserUniverse(dataclasses.replace(CONFIG, history_distribution=distribution))
    lengths = np.array([universe.user(f"user-{i}").base_length for i in range(4000)])
    assert lengths.min() >= CONFIG.history_min and lengths.max() <= CONFIG.history_max
    median, p99 = np.percentile(lengths, [50, 99])
    assert abs(median - CONFIG.history_median) / CONFIG.history_median < 0.1
    assert p99 >= 10 * median  # a tail of thousands of events
    assert np.mean(lengths <= 2 * CONFIG.history_median) > 0.5  # most users are short
    assert np.mean(lengths == CONFIG.history_max) < 0.05  # the cap only trims the far tail


def test_the_fixed_law_gives_every_user_the_median_length_and_histories_still_grow():
    config = dataclasses.replace(CONFIG, history_distribution="fixed", history_median=1000, history_max=1200)
    universe = UserUniverse(config)
    assert {universe.user(f"user-{i}").base_length for i in range(200)} == {1000}
    early = universe.history("user-3", EPOCH_MS)
    later = universe.history("user-3", EPOCH_MS + 30 * MINUTE_MS)  # 30 to 90 more events at 1 to 3 a minute
    assert len(early) == 1000 and 1000 < len(later) <= 1200
    assert later.long_term.item_ids[: len(early.long_term)].tolist() == early.long_term.item_ids.tolist()


def test_history_at_the_epoch_has_the_drawn_length_split_into_long_and_short_term():
    universe = UserUniverse(CONFIG)
    for i in range(50):
        user = universe.user(f"user-{i}")
        history = universe.history(user.user_id, EPOCH_MS)
        assert len(history) == user.base_length
        assert len(history.short_term) == CONFIG.short_term_length
        assert len(history.long_term) == user.base_length - CONFIG.short_term_length
        events = whole(history)
        assert np.all(np.diff(events["timestamps_ms"]) > 0) and events["timestamps_ms"][-1] <= EPOCH_MS
        assert events["action_types"].min() >= 0 and events["action_types"].max() < CONFIG.num_action_types
        assert events["item_ids"].min() >= 0 and events["item_ids"].max() < CONFIG.num_items


def first_growth(universe: UserUniverse, user_id: str, start_ms: int) -> tuple[int, int]:
    """The last time with the starting count and the first time with one more event (binary search)."""
    count = universe.event_count(user_id, start_ms)
    low, high = start_ms, start_ms + MINUTE_MS
    while universe.event_count(user_id, high) == count:
        high += MINUTE_MS
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if universe.event_count(user_id, middle) == count else (low, middle)
    return low, high


def test_one_appended_event_makes_the_old_long_term_a_strict_prefix_of_the_new():
    universe = UserUniverse(CONFIG)
    for i in range(10):
        user_id = f"user-{i}"
        before_ms, after_ms = first_growth(universe, user_id, EPOCH_MS + i * MINUTE_MS)
        old, new = universe.history(user_id, before_ms), universe.history(user_id, after_ms)
        assert len(new) == len(old) + 1
        assert len(new.long_term) == len(old.long_term) + 1
        for field in ("item_ids", "action_types", "timestamps_ms"):
            old_long, new_long = getattr(old.long_term, field), getattr(new.long_term, field)
            assert np.array_equal(new_long[: len(old_long)], old_long)
            assert np.array_equal(whole(new)[field][:-1], whole(old)[field])
        assert old.long_term.timestamps_ms[-1] < new.short_term.timestamps_ms[-1] <= after_ms


def test_histories_grow_at_about_the_configured_rate():
    universe = UserUniverse(CONFIG)
    minutes = 600
    later_ms = EPOCH_MS + minutes * MINUTE_MS
    users = [f"user-{i}" for i in range(200)]
    grown = [universe.event_count(user, later_ms) - universe.event_count(user, EPOCH_MS) for user in users]
    expected = CONFIG.growth_events_per_min * minutes
    assert abs(np.mean(grown) - expected) / expected < 0.05


def test_past_the_cap_the_window_slides_and_the_old_prefix_goes_stale():
    config = dataclasses.replace(CONFIG, history_min=40, history_median=60, history_max=64)
    universe = UserUniverse(config)
    user_id = next(f"user-{i}" for i in range(1000) if universe.user(f"user-{i}").base_length == 64)
    old = universe.history(user_id, EPOCH_MS)
    new = universe.history(user_id, EPOCH_MS + 10 * MINUTE_MS)
    shift = new.first_index - old.first_index
    assert len(new) == len(old) == 64 and 0 < shift < 64
    assert np.array_equal(whole(new)["item_ids"][: 64 - shift], whole(old)["item_ids"][shift:])
    assert not np.array_equal(new.long_term.item_ids[: len(old.long_term)], old.long_term.item_ids)


def test_item_popularity_follows_the_zipf_law():
    universe = UserUniverse(CONFIG)
    items = np.concatenate([whole(universe.history(f"user-{i}", EPOCH_MS))["item_ids"] for i in range(300)])
    counts = np.bincount(items, minlength=4)
    # P(rank r) ∝ r^-s: the most popular item is 2^s times as frequent as the second.
    assert counts[0] / counts[1] == pytest.approx(2**CONFIG.zipf_exponent, rel=0.15)
    harmonic = np.sum(np.arange(1, CONFIG.num_items + 1, dtype=np.float64) ** -CONFIG.zipf_exponent)
    assert counts[0] / len(items) == pytest.approx(1 / harmonic, rel=0.1)


def test_candidates_are_distinct_and_deterministic_per_user_and_request_time():
    universe = UserUniverse(CONFIG)
    now_ms = EPOCH_MS + 1234
    candidates = universe.candidates("user-3", now_ms)
    assert len(candidates) == CONFIG.num_candidates == len(set(candidates.tolist()))
    assert candidates.min() >= 0 and candidates.max() < CONFIG.num_items
    assert np.array_equal(UserUniverse(CONFIG).candidates("user-3", now_ms), candidates)
    assert not np.array_equal(universe.candidates("user-3", now_ms + 1), candidates)
    assert not np.array_equal(universe.candidates("user-4", now_ms), candidates)


def test_the_clock_is_injectable_and_an_unset_epoch_is_the_construction_time():
    clock = FakeClock(EPOCH_MS)
    universe = UserUniverse(dataclasses.replace(CONFIG, universe_epoch_ms=0), clock=clock)
    assert universe.epoch_ms == EPOCH_MS
    clock.now_ms = EPOCH_MS + 90 * MINUTE_MS
    history = universe.history("user-5")
    assert history.now_ms == clock.now_ms
    again = universe.history("user-5", clock.now_ms)
    assert np.array_equal(history.long_term.item_ids, again.long_term.item_ids)
    assert np.array_equal(universe.candidates("user-5"), universe.candidates("user-5", clock.now_ms))
    with pytest.raises(ValueError, match="before the universe epoch"):
        universe.history("user-5", EPOCH_MS - 1)


def test_histories_convert_to_behavior_sequences():
    history = UserUniverse(CONFIG).history("user-6", EPOCH_MS)
    proto = history.long_term.to_proto()
    assert list(proto.item_ids) == history.long_term.item_ids.tolist()
    assert list(proto.action_types) == history.long_term.action_types.tolist()
    assert list(proto.timestamps_ms) == history.long_term.timestamps_ms.tolist()


@pytest.mark.parametrize(
    "change",
    [
        {"history_min": 16},  # no long-term part left for the shortest users
        {"history_median": 8192, "history_max": 4096},
        {"history_distribution": "uniform"},
        {"num_candidates": 10, "num_items": 5},
        {"growth_events_per_min": 0.0},
    ],
)
def test_inconsistent_settings_are_refused(change):
    with pytest.raises(ValueError):
        UserUniverse(dataclasses.replace(CONFIG, **change))


def test_settings_round_trip_through_json():
    # The stub logs its epoch; the same settings must rebuild the same universe.
    rebuilt = UniverseConfig(**json.loads(json.dumps(dataclasses.asdict(CONFIG))))
    users = ["user-7", "user-8"]
    assert digest(UserUniverse(rebuilt), users, EPOCH_MS) == digest(UserUniverse(CONFIG), users, EPOCH_MS)
