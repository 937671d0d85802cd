"""DLRMv3-shaped streaming users for LoadGen: who each sample index is, and the universe the stub serves.

MLPerf DLRMv3 (an HSTU ranking benchmark) streams users: its dataset holds each user at successive
timestamps, each time with a history longer by the events since. We write that shape from its published
description, not from its data:

- The QSL's sample index i is user `<namespace>-u<i>`; a run has `users` of them, sized so that each is
  visited `visits_per_user` times on average (LoadGen draws sample indices uniformly, with replacement).
  One namespace per LoadGen run keeps runs on one fleet from inheriting each other's caches, and equal
  namespaces give every mode the same users.
- A visit's history is what the retrieval stub's synthetic universe (`services.workload.universe`) says
  the user has done by the moment the Recommend reaches it: a heavy-tailed length at the run's start
  (lognormal: `history_median`, `history_sigma`, capped at `history_max` as production caps sequences;
  past the cap the history slides and a cached prefix goes stale), then new events at
  `growth_events_per_min` per user (each user's rate within ±50 % of it). A user returning after a few
  seconds therefore has a few new events: its last prefix can be reloaded from the DRAM tier, or extended
  by only the new events, or (relay) pre-inferred again off the critical path.

Why a user's visits stay in time order although LoadGen picks the sample indices: a sample index names
only the user, never a point of its history. The history is a pure function of (user, the stub's clock at
arrival), and events are only appended, so whatever order LoadGen draws indices in, the visit that arrives
later sees the longer history: the earlier visit's long-term sequence is a prefix of the later one's (or a
slid window past the cap). Timestamps are the stub's wall clock, not the dataset's, so a run compresses
days of a user's returns into seconds; `growth_events_per_min` sets how many events each return brings.

Each LoadGen run gets its own universe epoch (`--universe-epoch-ms`: the run's start): lengths are their
drawn values when the run starts and grow during it only, so a run late in a search does not see longer
histories than an early one.

Sizes for a 2-core CPU running `cpu-small` (the defaults of `bench.mlperf.config`): median 256, sigma 0.75,
cap 1024 (3 % of users at the cap). The benchmark's first mix is median 1024 / cap 2048 at a 100 ms SLO on
the Rank alone; here 80 ms bounds the whole Recommend, the 30 ms relay window included, so a baseline Rank
has about 40 ms. Measured before choosing: with median 512 / cap 2048 the baseline missed the target at
3 QPS already (a capped user's full computation, about 30 ms, plus the window and the hops: bound by
latency at any load), so a search would have measured the length limit, not throughput; with 256 / 1024
both modes met it at 24 QPS.
"""

from __future__ import annotations

import dataclasses
import math

from bench.lib.workload import Universe, mix_universe


@dataclasses.dataclass(frozen=True)
class StreamingUsers:
    """The users of one LoadGen run: the QSL's sample index → user id mapping."""

    namespace: str
    count: int

    def user(self, index: int) -> str:
        """The user of QSL sample `index` (0 ≤ index < count)."""
        if not 0 <= index < self.count:
            raise IndexError(f"sample index {index} outside the QSL's {self.count} users")
        return f"{self.namespace}-u{index}"


def user_count(queries: int, visits_per_user: float, users: int = 0) -> int:
    """Users of a run of about `queries` samples: `users` when given, else queries / visits_per_user."""
    if users > 0:
        return users
    return max(1, math.ceil(queries / visits_per_user))


def expected_queries(target_qps: float, duration_s: float, min_query_count: int) -> int:
    """About how many samples LoadGen issues: it generates queries until both the duration (at the
    target rate) and the minimum count are reached."""
    return max(math.ceil(target_qps * duration_s), min_query_count)


def namespace(mode_independent_label: str, target_qps: float, seed: int) -> str:
    """The users' namespace of one run: the same for every mode at one load and seed, new otherwise."""
    return f"mlperf-{mode_independent_label}-q{target_qps:g}-s{seed}"


def streaming_universe(
    median: int,
    sigma: float,
    maximum: int,
    short_term: int,
    growth_events_per_min: float,
    universe_seed: int,
    epoch_ms: int,
) -> Universe:
    """The stub's universe for one run: `bench.lib.workload.mix_universe`'s lognormal length mix, growing at
    `growth_events_per_min` from `epoch_ms` (the run's start, Unix ms)."""
    mix = mix_universe(median, sigma, maximum, short_term, universe_seed)
    extra = (
        "--growth-events-per-min", str(growth_events_per_min), "--universe-epoch-ms", str(epoch_ms),
    )  # fmt: skip
    label = f"stream-{mix.label}-g{growth_events_per_min:g}"
    return dataclasses.replace(mix, label=label, stub_args=(*mix.stub_args, *extra))
