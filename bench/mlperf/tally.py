"""What the Recommend answers of one run say about the cache: tier hit rates and the history each Rank
computed on its critical path.

Tiers. Every answered, ranked call reports where its long-term prefix came from (`cache_source`): HBM
(a prefix in accelerator memory: pre-inferred, or a production the Rank joined), DRAM (reloaded), EXTENDED
(a cached strict prefix extended by the events appended since), MISS (the whole sequence computed, with
its `miss_reason`). `rates` are shares of the ranked answers and add up to 1; `later_rates` count only
visits after a user's first answered visit of the run (ordered by the stub's request time), which is what
streaming users return for.

Critical path. Every answer says how many long-term events its Rank computed on its own critical path
(`computed_prefix_events`: all of them on a MISS, the appended ones of an extension it started itself, 0 for
a prefix found in HBM, reloaded from DRAM, or joined while a pre-inference or a concurrent Rank of the same
user was computing it: a MISS that joined another Rank's computation counts 0), and every Rank computes
its `short_term` short-term events (and its candidates, not history). So the history computed on the
critical path is exact: `computed` = `computed_prefix` (the sum of `computed_prefix_events`) +
`computed_short_term` (short-term events times ranked answers), with its share of the history `tokens`
(long-term + short-term events of the ranked answers), overall and per tier.

Prefix wait. Every answer also says how long its Rank waited for its long-term prefix (`prefix_wait_ms`):
about 0 for a prefix ready in HBM, the rest of a pre-inference still running for a Rank that joined it, the
whole computation, reload or extension for one it started. `PrefixWait` gives its percentiles over all
ranked answers and per tier; for HBM, how long relayed Ranks waited for a pre-inference still running.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence

from bench.lib.stats import percentile
from bench.mlperf.sut import Answer
from relaygr.v1 import common_pb2
from services.common.contract import CACHE_SOURCES, cache_source_label

# The sources every run's tallies hold; a source beyond them (`peer`: a prefix another ranker handed off or
# was fetched from, which a fleet at a steady ring does not see) is counted where it occurs.
TIERS = tuple(source for source in CACHE_SOURCES if source != "peer")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tiers:
    """Where the ranked answers' prefixes came from."""

    ranked: int  # answered calls that were ranked (not abandoned upstream)
    counts: dict[str, int]  # per tier: hbm, dram, extended, miss
    rates: dict[str, float]  # counts / ranked; they add up to 1 (all 0 without a ranked answer)
    later_visits: int  # ranked answers after their user's first answered visit of the run
    later_counts: dict[str, int]
    later_rates: dict[str, float]
    miss_reasons: dict[str, int]
    admitted: int  # answers whose Admit fired a pre-inference


@dataclasses.dataclass(frozen=True, kw_only=True)
class History:
    """History tokens (long-term + short-term events) of the ranked answers, and those computed on the
    Ranks' critical paths."""

    short_term: int  # short-term events per request (the stub's --short-term-length)
    tokens: int
    tokens_by_tier: dict[str, int]
    computed: int  # on the Ranks' critical paths: computed_prefix + computed_short_term
    computed_prefix: int  # long-term events: the sum of the answers' computed_prefix_events
    computed_short_term: int  # short-term events: every ranked answer's `short_term`
    computed_share: float  # computed / tokens
    computed_by_tier: dict[str, int]  # per tier: its answers' computed_prefix_events + short-term events
    computed_share_by_tier: dict[str, float]  # computed_by_tier / tokens_by_tier (0 for an empty tier)
    mean_long_term: float
    extended_computed_mean: float | None  # EXTENDED: mean computed_prefix_events (0 for a joined extension)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Latencies:
    """Percentiles, ms, of the answered calls (failed ones are not in them)."""

    p50: float | None
    p90: float | None
    p99: float | None


def _share(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


def _rates(counts: dict[str, int], whole: int) -> dict[str, float]:
    return {tier: _share(count, whole) for tier, count in counts.items()}


def latencies(samples_ms: Sequence[float]) -> Latencies:
    def at(q: float) -> float | None:
        value = percentile(samples_ms, q) if samples_ms else math.nan
        return None if math.isnan(value) else round(value, 3)

    return Latencies(p50=at(50), p90=at(90), p99=at(99))


def ranked(answers: Sequence[Answer]) -> list[Answer]:
    """The answered, ranked calls in the order their stub received them (request time, then issue)."""
    kept = [a for a in answers if a.ok and not a.response.abandoned]
    return sorted(kept, key=lambda a: (a.response.request_time_ms, a.issued_s))


def tiers(answers: Sequence[Answer]) -> Tiers:
    """The tier tally of a run's answers (`Answer`s of any status; only ranked answers count)."""
    counts = dict.fromkeys(TIERS, 0)
    later = dict.fromkeys(TIERS, 0)
    misses: collections.Counter[str] = collections.Counter()
    seen: set[str] = set()
    rows = ranked(answers)
    for answer in rows:
        response = answer.response
        tier = cache_source_label(response.cache_source)
        counts[tier] = counts.get(tier, 0) + 1
        if answer.user in seen:
            later[tier] = later.get(tier, 0) + 1
        seen.add(answer.user)
        if response.cache_source == common_pb2.CACHE_SOURCE_MISS:
            misses[common_pb2.MissReason.Name(response.miss_reason).removeprefix("MISS_REASON_").lower()] += 1
    later_total = sum(later.values())
    return Tiers(
        ranked=len(rows),
        counts=counts,
        rates=_rates(counts, len(rows)),
        later_visits=later_total,
        later_counts=later,
        later_rates=_rates(later, later_total),
        miss_reasons=dict(misses),
        admitted=sum(1 for a in rows if a.response.admitted),
    )


def history(answers: Sequence[Answer], short_term: int) -> History:
    """The history tally of a run's answers, `short_term` events per request."""
    by_tier = dict.fromkeys(TIERS, 0)
    computed_by_tier = dict.fromkeys(TIERS, 0)
    extended: list[int] = []
    rows = ranked(answers)
    for answer in rows:
        response = answer.response
        tier = cache_source_label(response.cache_source)
        by_tier[tier] = by_tier.get(tier, 0) + response.long_term_length + short_term
        computed_by_tier[tier] = computed_by_tier.get(tier, 0) + response.computed_prefix_events + short_term
        if tier == "extended":
            extended.append(response.computed_prefix_events)
    tokens = sum(by_tier.values())
    computed = sum(computed_by_tier.values())
    return History(
        short_term=short_term,
        tokens=tokens,
        tokens_by_tier=by_tier,
        computed=computed,
        computed_prefix=sum(a.response.computed_prefix_events for a in rows),
        computed_short_term=short_term * len(rows),
        computed_share=_share(computed, tokens),
        computed_by_tier=computed_by_tier,
        computed_share_by_tier={tier: _share(computed_by_tier[tier], by_tier[tier]) for tier in by_tier},
        mean_long_term=round(sum(a.response.long_term_length for a in rows) / len(rows), 1) if rows else 0.0,
        extended_computed_mean=round(sum(extended) / len(extended), 1) if extended else None,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrefixWait:
    """The Ranks' waits for their long-term prefix (`prefix_wait_ms`), ms, of the ranked answers."""

    all: Latencies
    by_tier: dict[str, Latencies]  # hbm: a prefix ready (about 0) or a pre-inference still running (joined)
    hbm_over_1ms: int  # HBM answers that waited over 1 ms: they joined a pre-inference still running


def prefix_wait(answers: Sequence[Answer]) -> PrefixWait:
    """The prefix-wait tally of a run's answers."""
    rows = ranked(answers)
    by_tier: dict[str, list[float]] = {tier: [] for tier in TIERS}
    for answer in rows:
        by_tier.setdefault(cache_source_label(answer.response.cache_source), []).append(
            answer.response.prefix_wait_ms
        )
    return PrefixWait(
        all=latencies([a.response.prefix_wait_ms for a in rows]),
        by_tier={tier: latencies(waits) for tier, waits in by_tier.items()},
        hbm_over_1ms=sum(1 for wait in by_tier["hbm"] if wait > 1.0),
    )
