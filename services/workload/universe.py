"""A synthetic, deterministic user universe: the retrieval stub's stand-in for a behaviour store, and
the source of the requests that tools (`tools/ghz_data.py`) and tests generate.

Contract:

- A user id maps to a `SyntheticUser` through a blake2b digest of (`universe_seed`, user id): the same id
  and seed give the same user in every process and on every platform.
- Every user has an unbounded event stream. Event i is drawn from a hash of (user, i) alone: its item id
  from a Zipf law over `num_items` (id 0 is the most popular item), its action type uniform in
  [0, `num_action_types`), and its gap to the previous event from an exponential law at the user's event
  rate. Appending events therefore never changes earlier ones.
- At the reference time `universe_epoch_ms` a user has `base_length` events, drawn from a heavy-tailed law
  (lognormal, or a Pareto of the second kind above `history_min`; median `history_median`, capped at
  `history_max`): most users are short, a tail has thousands. The `fixed` law gives every user exactly
  `history_median` events instead (benchmarks sweep one length at a time). Afterwards events arrive as a
  Poisson process at the user's rate.
- `history(user_id, now_ms)` returns the most recent `min(n, history_max)` of the n events that happened
  by `now_ms`, split into the long-term part and the short-term part (the last `short_term_length`
  events). While n ≤ `history_max` one appended event makes the old long-term part a strict prefix of the
  new one (an extension); past the cap the window slides, as production's capped sequences do, and a
  cached prefix goes stale.
- `candidates(user_id, now_ms)`: `num_candidates` distinct Zipf item ids, deterministic per (user, time).

Everything per event is vectorised with numpy: an 8192-event history takes about 1 ms on one CPU core,
and about 0.7 ms more to become a BehaviorSequence.
The universe is immutable after construction and safe to share between threads.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import time
from collections.abc import Callable
from statistics import NormalDist

import numpy as np

from relaygr.v1 import common_pb2
from services.common.config import check, setting

HISTORY_DISTRIBUTIONS = ("lognormal", "pareto", "fixed")
# Per-user event rates are spread uniformly within ±50% of the configured mean.
GROWTH_RATE_SPREAD = 0.5

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_UNIT = 2.0**-53

# Which 64-bit word of a user's blake2b digest seeds which random stream.
_ITEM, _ACTION, _GAP, _CANDIDATE, _LENGTH, _RATE = range(6)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclasses.dataclass(frozen=True)
class UniverseConfig:
    """Shape of the synthetic user universe; the retrieval stub's settings include these."""

    universe_seed: int = setting(0, "seed of the synthetic user universe (same seed, same users)")
    universe_epoch_ms: int = setting(
        0,
        "reference time (Unix ms) at which histories have their drawn lengths; 0 = when the service "
        "starts (replicas must share one value)",
        minimum=0,
    )
    num_items: int = setting(
        1_000_000, "item catalogue size; ids are 0..num_items-1, 0 the most popular", above=0
    )
    zipf_exponent: float = setting(
        1.1, "Zipf exponent of item popularity (history events and candidates)", above=0
    )
    num_action_types: int = setting(8, "action types are drawn uniformly from [0, num_action_types)", above=0)
    history_distribution: str = setting(
        "lognormal",
        "law of history lengths: lognormal, pareto, or fixed (every user has --history-median)",
        choices=HISTORY_DISTRIBUTIONS,
    )
    history_min: int = setting(32, "shortest history at the reference time (must exceed --short-term-length)")
    history_median: int = setting(256, "median history length at the reference time")
    history_max: int = setting(8192, "longest history (a cap at the reference time, a sliding window after)")
    history_sigma: float = setting(
        1.5, "lognormal shape: sigma of the log length (larger, heavier tail)", above=0
    )
    history_pareto_shape: float = setting(1.2, "pareto tail index alpha (smaller, heavier tail)", above=0)
    growth_events_per_min: float = setting(
        2.0, "mean events per user and minute after the reference time", above=0
    )
    short_term_length: int = setting(
        16, "latest events sent as the short-term part; the rest are long-term", above=0
    )
    num_candidates: int = setting(128, "distinct candidate items retrieved per request", above=0)

    def validate(self) -> None:
        check(self)
        if not self.short_term_length < self.history_min < self.history_median <= self.history_max:
            raise ValueError(
                "history lengths must satisfy --short-term-length < --history-min < --history-median "
                "<= --history-max"
            )
        if self.num_candidates > self.num_items:
            raise ValueError("--num-candidates must not exceed --num-items")


@dataclasses.dataclass(frozen=True, eq=False)
class EventArrays:
    """Behaviour events as parallel numpy arrays, oldest first (the ranker has its own tensor `Events`)."""

    item_ids: np.ndarray  # int64
    action_types: np.ndarray  # int32
    timestamps_ms: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.item_ids)

    def __getitem__(self, window: slice) -> EventArrays:
        return EventArrays(self.item_ids[window], self.action_types[window], self.timestamps_ms[window])

    def to_proto(self) -> common_pb2.BehaviorSequence:
        return common_pb2.BehaviorSequence(
            item_ids=self.item_ids.tolist(),
            action_types=self.action_types.tolist(),
            timestamps_ms=self.timestamps_ms.tolist(),
        )


@dataclasses.dataclass(frozen=True, eq=False)
class UserHistory:
    """A user's history as seen at `now_ms`; `first_index` is the stream index of its oldest event."""

    user_id: str
    now_ms: int
    first_index: int
    long_term: EventArrays
    short_term: EventArrays

    def __len__(self) -> int:
        return len(self.long_term) + len(self.short_term)


@dataclasses.dataclass(frozen=True)
class SyntheticUser:
    """What a user id hashes to: the seeds of its random streams, its length and its event rate."""

    user_id: str
    keys: tuple[int, ...]  # the blake2b digest as 64-bit words, one per random stream
    base_length: int  # events at the reference time
    events_per_min: float

    @property
    def mean_gap_ms(self) -> float:
        return 60_000.0 / self.events_per_min


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a uint64 array: a bijective, well-scrambled hash."""
    x = (x ^ (x >> np.uint64(30))) * _MIX_1
    x = (x ^ (x >> np.uint64(27))) * _MIX_2
    return x ^ (x >> np.uint64(31))


def _uniforms(key: int, indices: np.ndarray) -> np.ndarray:
    """One uniform in (0, 1) per index, a pure function of (key, index)."""
    words = _mix(np.uint64(key) + (indices.astype(np.uint64) + np.uint64(1)) * _GOLDEN)
    return ((words >> np.uint64(11)).astype(np.float64) + 0.5) * _UNIT


def _word_uniform(word: int) -> float:
    return ((word >> 11) + 0.5) * _UNIT


@functools.lru_cache(maxsize=4)  # universes of one shape share it (8 MB for a million items)
def _zipf_cdf(num_items: int, exponent: float) -> np.ndarray:
    weights = np.arange(1, num_items + 1, dtype=np.float64) ** -exponent
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


class UserUniverse:
    """Deterministic synthetic users, their growing histories and their candidate items."""

    def __init__(self, config: UniverseConfig, clock: Callable[[], int] = wall_clock_ms) -> None:
        UniverseConfig.validate(config)
        self.config = config
        self.clock = clock
        self.epoch_ms = config.universe_epoch_ms or clock()
        self._cdf = _zipf_cdf(config.num_items, config.zipf_exponent)
        # Pareto II (Lomax) above history_min, scaled so that its median is history_median.
        self._pareto_scale = (config.history_median - config.history_min) / (
            2 ** (1 / config.history_pareto_shape) - 1
        )

    def now_ms(self) -> int:
        return self.clock()

    def user(self, user_id: str) -> SyntheticUser:
        digest = hashlib.blake2b(f"{self.config.universe_seed}\x00{user_id}".encode()).digest()
        keys = tuple(int.from_bytes(digest[i : i + 8], "little") for i in range(0, 64, 8))
        mean_rate = self.config.growth_events_per_min
        rate = mean_rate * (1 - GROWTH_RATE_SPREAD + 2 * GROWTH_RATE_SPREAD * _word_uniform(keys[_RATE]))
        return SyntheticUser(user_id, keys, self._base_length(_word_uniform(keys[_LENGTH])), rate)

    def _base_length(self, u: float) -> int:
        c = self.config
        if c.history_distribution == "fixed":
            return c.history_median
        if c.history_distribution == "pareto":
            length = c.history_min + self._pareto_scale * ((1 - u) ** (-1 / c.history_pareto_shape) - 1)
        else:
            length = c.history_median * math.exp(c.history_sigma * NormalDist().inv_cdf(u))
        return int(min(max(round(length), c.history_min), c.history_max))

    def _items(self, key: int, indices: np.ndarray) -> np.ndarray:
        ranks = np.searchsorted(self._cdf, _uniforms(key, indices), side="right")
        return np.minimum(ranks, self.config.num_items - 1).astype(np.int64)

    def _gaps_ms(self, user: SyntheticUser, indices: np.ndarray) -> np.ndarray:
        """Milliseconds from event i-1 to event i: exponential, at least 1 so timestamps strictly increase."""
        exponential = -np.log(_uniforms(user.keys[_GAP], indices))
        return 1 + np.floor(exponential * user.mean_gap_ms).astype(np.int64)

    def _elapsed_ms(self, now_ms: int) -> int:
        if now_ms < self.epoch_ms:
            raise ValueError(f"now_ms {now_ms} is before the universe epoch {self.epoch_ms}")
        return now_ms - self.epoch_ms

    def _arrivals_ms(self, user: SyntheticUser, elapsed_ms: int) -> np.ndarray:
        """Offsets from the epoch of the events that arrived within `elapsed_ms` after it."""
        expected = elapsed_ms / user.mean_gap_ms
        batch = int(expected + 6 * math.sqrt(expected) + 8)
        while True:
            offsets = np.cumsum(self._gaps_ms(user, np.arange(user.base_length, user.base_length + batch)))
            if offsets[-1] > elapsed_ms:
                return offsets[: np.searchsorted(offsets, elapsed_ms, side="right")]
            batch *= 2

    def event_count(self, user_id: str, now_ms: int) -> int:
        """Events the user has made by `now_ms`, including those beyond the history window."""
        user = self.user(user_id)
        return user.base_length + len(self._arrivals_ms(user, self._elapsed_ms(now_ms)))

    def history(self, user_id: str, now_ms: int | None = None) -> UserHistory:
        now_ms = self.now_ms() if now_ms is None else now_ms
        user = self.user(user_id)
        arrivals = self._arrivals_ms(user, self._elapsed_ms(now_ms))
        base, count = user.base_length, user.base_length + len(arrivals)
        first = max(0, count - self.config.history_max)
        indices = np.arange(first, count)
        # Events before the epoch sit at epoch - (their gaps up to the epoch); the rest at their arrivals.
        if first < base:
            before = self._gaps_ms(user, np.arange(first, base))
            pre = self.epoch_ms - np.cumsum(before[::-1])[::-1]
            timestamps = np.concatenate([pre, self.epoch_ms + arrivals])
        else:
            timestamps = self.epoch_ms + arrivals[first - base :]
        actions = np.floor(_uniforms(user.keys[_ACTION], indices) * self.config.num_action_types)
        events = EventArrays(
            item_ids=self._items(user.keys[_ITEM], indices),
            action_types=actions.astype(np.int32),
            timestamps_ms=timestamps.astype(np.int64),
        )
        split = len(indices) - self.config.short_term_length
        return UserHistory(user_id, now_ms, first, long_term=events[:split], short_term=events[split:])

    def candidates(self, user_id: str, now_ms: int | None = None) -> np.ndarray:
        """`num_candidates` distinct Zipf item ids, in draw order, deterministic per (user, now_ms)."""
        now_ms = self.now_ms() if now_ms is None else now_ms
        user = self.user(user_id)
        request_word = np.array([user.keys[_CANDIDATE] ^ (now_ms & 0xFFFFFFFFFFFFFFFF)], np.uint64)
        request_key = int(_mix(request_word)[0])
        wanted = self.config.num_candidates
        draws = 2 * wanted
        while True:
            items = self._items(request_key, np.arange(draws))
            _, first_seen = np.unique(items, return_index=True)
            if len(first_seen) >= wanted:
                return items[np.sort(first_seen)[:wanted]]
            draws *= 2
