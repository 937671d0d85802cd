"""What the Recommend answers of one run say about the cache: tier hit rates and the history each Rank
computed on its critical path.

Tiers. Every answered, ranked call reports where its long-term prefix came from (`cache_source`): HBM
(a prefix in accelerator memory: pre-inferred, or a production the Rank joined), DRAM (reloaded), EXTENDED
(a cached strict prefix extended by the events appended since), MISS (the whole sequence computed, with
its `miss_reason`). `rates` are shares of the ranked answers and add up to 1; `later_rates` count only
visits after a user's first answered visit of the run (ordered by the stub's request time), which is what
streaming users return for.

Critical path. A Rank computes its short-term events and candidates in every case, and its whole
long-term prefix on a MISS. What the answers do not carry: how many tokens an EXTENDED Rank appended (the
cached base's length), and whether an HBM or DRAM Rank found its prefix ready or joined a production still
running (and waited for part of it). So the history computed on the critical path is known only as a
lower bound, `computed_at_least`: every MISS's long-term + short-term events, every other Rank's
short-term events. `extended_appended_mean` is a client-side observation beside it, not the ranker's
count: for EXTENDED Ranks, how many long-term events the user gained since its previous answered visit.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence

from bench.mlperf.sut import Answer
from bench.stats import percentile
from relaygr.v1 import common_pb2
from services.common.contract import CACHE_SOURCES, cache_source_label


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
    """History tokens (long-term + short-term events) of the ranked answers."""

    short_term: int  # short-term events per request (the stub's --short-term-length)
    tokens: int
    tokens_by_tier: dict[str, int]
    computed_at_least: int  # on the Ranks' critical paths: MISS's long + short term, the others' short
    computed_at_least_share: float  # of `tokens`
    mean_long_term: float
    extended_appended_mean: float | None  # EXTENDED: events gained since the user's previous visit


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
    counts = dict.fromkeys(CACHE_SOURCES, 0)
    later = dict.fromkeys(CACHE_SOURCES, 0)
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
    by_tier = dict.fromkeys(CACHE_SOURCES, 0)
    at_least = 0
    previous: dict[str, int] = {}
    appended: list[int] = []
    rows = ranked(answers)
    for answer in rows:
        response = answer.response
        tier = cache_source_label(response.cache_source)
        long_term = response.long_term_length
        by_tier[tier] = by_tier.get(tier, 0) + long_term + short_term
        at_least += long_term + short_term if tier == "miss" else short_term
        if tier == "extended" and answer.user in previous:
            appended.append(long_term - previous[answer.user])
        previous[answer.user] = long_term
    tokens = sum(by_tier.values())
    return History(
        short_term=short_term,
        tokens=tokens,
        tokens_by_tier=by_tier,
        computed_at_least=at_least,
        computed_at_least_share=_share(at_least, tokens),
        mean_long_term=round(sum(a.response.long_term_length for a in rows) / len(rows), 1) if rows else 0.0,
        extended_appended_mean=round(sum(appended) / len(appended), 1) if appended else None,
    )
