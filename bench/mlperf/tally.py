"""What the Recommend answers of one run say about the cache, over its ranked answers in their stub's order.

Tiers: where each Rank's long-term prefix came from (`cache_source`: HBM, pre-inferred or joined; DRAM;
EXTENDED, a cached prefix extended by the events since; MISS, with its `miss_reason`), over all answers and
over the visits after a user's first. Critical path: each answer's `computed_prefix_events` (all on a MISS,
the appended ones of an extension it started, 0 for a prefix found in HBM, reloaded, or joined while a
pre-inference or a concurrent Rank of its user computed it) plus the `short_term` events every Rank
computes: exact. Prefix wait (`prefix_wait_ms`): about 0 for a prefix ready in HBM, the rest of a
pre-inference a Rank joined, the whole computation, reload or extension of one it started.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from bench.lib.schema import Percentiles
from bench.lib.stats import finite, percentile
from bench.mlperf.results import History, PrefixWait, Tiers
from relaygr.v1 import common_pb2
from services.common.contract import CACHE_SOURCES, cache_source_label
from services.loadgen.openloop import CallRecord

# The sources every run's tallies hold; a source beyond them (`peer`: a prefix another ranker handed off or
# was fetched from, which a fleet at a steady ring does not see) is counted where it occurs.
TIERS = tuple(source for source in CACHE_SOURCES if source != "peer")


def _share(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


def latencies(samples_ms: Sequence[float]) -> Percentiles:
    return Percentiles(**{f"p{q}": finite(percentile(samples_ms, q)) for q in (50, 90, 99)})


def tally(records: Sequence[CallRecord], short_term: int) -> dict[str, Any]:
    """The `RunResult` fields that a run's call records give (each record's `index` is its QSL sample
    index, so its user): only answered, ranked calls count, in the order their stub received them."""
    rows = sorted(
        (r for r in records if r.ok and not r.response.abandoned),
        key=lambda r: (r.response.request_time_ms, r.intended_s),
    )
    counts, later, tokens, computed = (collections.Counter(dict.fromkeys(TIERS, 0)) for _ in range(4))
    waits: dict[str, list[float]] = {tier: [] for tier in TIERS}
    misses: collections.Counter[str] = collections.Counter()
    seen: set[int] = set()
    for record in rows:
        answer = record.response
        tier = cache_source_label(answer.cache_source)
        counts[tier] += 1
        if record.index in seen:
            later[tier] += 1
        seen.add(record.index)
        if answer.cache_source == common_pb2.CACHE_SOURCE_MISS:
            misses[common_pb2.MissReason.Name(answer.miss_reason).removeprefix("MISS_REASON_").lower()] += 1
        tokens[tier] += answer.long_term_length + short_term
        computed[tier] += answer.computed_prefix_events + short_term
        waits.setdefault(tier, []).append(answer.prefix_wait_ms)
    later_visits, all_tokens, all_computed = later.total(), tokens.total(), computed.total()
    ranked, extended, short_total = len(rows), counts["extended"], short_term * len(rows)
    return {
        "tiers": Tiers(
            ranked=ranked, counts=dict(counts), rates={tier: _share(n, ranked) for tier, n in counts.items()},
            later_visits=later_visits, later_counts=dict(later),
            later_rates={tier: _share(n, later_visits) for tier, n in later.items()},
            miss_reasons=dict(misses), admitted=sum(1 for r in rows if r.response.admitted),
        ),
        "history": History(
            short_term=short_term, tokens=all_tokens, tokens_by_tier=dict(tokens), computed=all_computed,
            computed_prefix=all_computed - short_total, computed_short_term=short_total,
            computed_share=_share(all_computed, all_tokens), computed_by_tier=dict(computed),
            computed_share_by_tier={tier: _share(computed[tier], tokens[tier]) for tier in tokens},
            mean_long_term=round((all_tokens - short_total) / ranked, 1) if ranked else 0.0,
            extended_computed_mean=round((computed["extended"] - short_term * extended) / extended, 1)
            if extended else None,
        ),
        "prefix_wait_ms": PrefixWait(
            all=latencies([r.response.prefix_wait_ms for r in rows]),
            by_tier={tier: latencies(tier_waits) for tier, tier_waits in waits.items()},
            hbm_over_1ms=sum(1 for wait in waits["hbm"] if wait > 1.0),
        ),
        "rank_ms": latencies([r.response.rank_latency_ms for r in rows]),
        "recommend_ms": latencies([r.latency_s * 1000 for r in rows]),
        "distinct_users": len(seen),
        "visits_per_user": round(ranked / len(seen), 2) if seen else 0.0,
    }  # fmt: skip
