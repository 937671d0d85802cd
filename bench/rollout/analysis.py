"""The rollout benchmark's arithmetic, pure functions over one run's records (`bench.rollout.run`); the
figures' definitions: docs/benchmark.md ("Cache handoff through a rollout").

A call *hits* when its prefix came from a cache (`HITS`; a failed call does not hit), and is *returning*
when its user's previous call was sent within the DRAM TTL before it. Phases split calls by their intended
send time. A drained ranker's *resident users* (`drain_outcome`) are those whose last call answered before
its SIGTERM was answered by it within the DRAM TTL; their *next call* is their first one sent at or after
the SIGTERM, answered by the ranker while it drains, by another (*moved*) or by it once restarted (*back*).
Counters are read as increases over a window (`increase`) across restarts: every sample carries its
process's id, a process's counters before its first sample read as that sample's when it was the load's
baseline, else as 0 (started during the run), and gauges (`GAUGES`) are levels, never increases.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from bench.lib.stats import finite, percentile
from bench.rollout.config import Phase
from bench.rollout.run import Call, Change, Sample

HITS = frozenset(("hbm", "dram", "peer", "extended"))
SOURCES = ("hbm", "dram", "peer", "extended", "miss")  # runs before the peer was a source have no `peer`
RECOMPUTE_OPS = ("pre_infer", "uncached")
HANDOFF_SETTLE_S = 1.0  # after a drained ranker exits, what its peers received by then is its handoff's
GAUGES = ("handoff_duration_s", "kv_bytes")  # keys (or key prefixes) read as levels, never as increases


def _level(samples: list[Sample], at_s: float) -> Mapping[str, float]:
    """One process's counters at `at_s`, from its samples in time order (see the module docstring)."""
    last: Mapping[str, float] = samples[0].values if samples[0].baseline else {}
    for sample in samples:
        if sample.at_s > at_s:
            break
        last = sample.values
    return last


def increase(
    samples: Iterable[Sample], start_s: float, end_s: float, rankers: Iterable[str] | None = None
) -> dict[str, float]:
    """Every counter's increase over [start_s, end_s], summed over the processes of `rankers` (None:
    every ranker); gauges are left out."""
    wanted = None if rankers is None else set(rankers)
    processes: dict[tuple[str, int], list[Sample]] = collections.defaultdict(list)
    for sample in sorted(samples, key=lambda s: s.at_s):
        if wanted is None or sample.ranker in wanted:
            processes[(sample.ranker, sample.pid)].append(sample)
    total: dict[str, float] = collections.defaultdict(float)
    for process in processes.values():
        before, after = _level(process, start_s), _level(process, end_s)
        for key, value in after.items():
            if key.split("/")[0] not in GAUGES:
                total[key] += value - before.get(key, 0.0)
    return {key: round(value, 6) for key, value in sorted(total.items())}


def last_before(samples: Iterable[Sample], ranker: str, at_s: float) -> Sample | None:
    """The last sample of `ranker` taken at or before `at_s`."""
    found = [s for s in samples if s.ranker == ranker and s.at_s <= at_s]
    return max(found, key=lambda s: s.at_s) if found else None


def hit(call: Call) -> bool:
    return call.ok and call.source in HITS


def returning(calls: Sequence[Call], ttl_s: float) -> set[int]:
    """The indices of the returning calls: their user's previous call was sent within `ttl_s` before."""
    last: dict[str, float] = {}
    found = set()
    for call in sorted(calls, key=lambda c: c.intended_s):
        previous = last.get(call.user)
        if previous is not None and call.intended_s - previous <= ttl_s:
            found.add(call.index)
        last[call.user] = call.intended_s
    return found


def within(calls: Iterable[Call], start_s: float, end_s: float) -> list[Call]:
    return [call for call in calls if start_s <= call.intended_s < end_s]


def latency(values: Sequence[float]) -> dict[str, float | None]:
    """P50 and P99 (nearest rank; a failed call is infinitely slow: an infinite P99 is None)."""

    return {f"p{q}": finite(percentile(list(values), q)) if values else None for q in (50, 99)}


@dataclasses.dataclass(frozen=True)
class PhaseStats:
    """One phase of one run: where the calls' prefixes came from, what failed, latencies, device time."""

    phase: str
    calls: int
    failed: int
    failure_codes: dict[str, int]
    sources: dict[str, int]  # hbm, dram, extended, miss
    miss_reasons: dict[str, int]
    returning: int
    returning_hits: int
    recommend_ms: dict[str, float | None]
    rank_ms: dict[str, float | None]
    computed_events: int  # long-term events computed on the Ranks' critical path
    device_s: dict[str, float]  # the rankers' model seconds by op
    recompute_s: float
    rankers: dict[str, float]  # the handoff's and read-through's counters (metrics), summed over rankers


def phase_stats(calls: Sequence[Call], phase: Phase, samples: Sequence[Sample], back: set[int]) -> PhaseStats:
    """`phase` of a run from its calls, its metrics samples and its returning calls' indices (`back`)."""
    inside = within(calls, phase.start_s, phase.end_s)
    answered = [call for call in inside if call.ok]
    counters = increase(samples, phase.start_s, phase.end_s)
    device = {key.split("/")[1]: value for key, value in counters.items() if key.startswith("device_s/")}
    again = [call for call in inside if call.index in back]
    return PhaseStats(
        phase=phase.name, calls=len(inside), failed=len(inside) - len(answered),
        failure_codes=dict(collections.Counter(call.code for call in inside if not call.ok)),
        sources={source: sum(call.source == source for call in answered) for source in SOURCES},
        miss_reasons=dict(collections.Counter(c.miss_reason for c in answered if c.source == "miss")),
        returning=len(again), returning_hits=sum(hit(call) for call in again),
        recommend_ms=latency([call.recommend_ms for call in inside]),
        rank_ms=latency([call.rank_ms for call in inside]),
        computed_events=sum(call.computed_events for call in answered),
        device_s={op: round(seconds, 3) for op, seconds in sorted(device.items()) if op != "profile"},
        recompute_s=round(sum(device.get(op, 0.0) for op in RECOMPUTE_OPS), 3),
        rankers={key: value for key, value in counters.items() if not key.startswith("device_s/")},
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class DrainOutcome:
    """A drained ranker's resident users and what their next call found (see the module docstring)."""

    action: str
    ranker: str
    signalled_s: float
    resident: int  # resident users with a call after the SIGTERM
    hits: int
    failed: int
    draining: int
    draining_hits: int
    moved: int
    moved_hits: int
    back: int
    back_hits: int
    next_hit: dict[str, bool]  # by resident user: whether the next call hit
    resident_bytes: dict[str, float]  # what the ranker held by tier just before its SIGTERM (metrics)
    sent: dict[str, float]  # its handoff's counters as last scraped before it exited
    received_bytes: float  # what its peers received from the SIGTERM to just after its exit


def resident_users(calls: Sequence[Call], ranker: str, at_s: float, ttl_s: float) -> list[str]:
    """Users whose last call answered before `at_s` was answered by `ranker`, at most `ttl_s` before."""
    last: dict[str, Call] = {}
    for call in sorted(calls, key=lambda c: c.answered_s):
        if call.ok and call.answered_s < at_s:
            last[call.user] = call
    return sorted(
        user for user, call in last.items() if call.instance == ranker and at_s - call.answered_s <= ttl_s
    )


def next_calls(calls: Sequence[Call], users: Iterable[str], at_s: float) -> dict[str, Call]:
    """Each user's first call sent at or after `at_s` (users without one are left out)."""
    wanted, found = set(users), {}
    for call in sorted(calls, key=lambda c: c.intended_s):
        if call.user in wanted and call.user not in found and call.intended_s >= at_s:
            found[call.user] = call
    return found


def drain_outcome(
    calls: Sequence[Call], change: Change, samples: Sequence[Sample], ttl_s: float
) -> DrainOutcome:
    at_s, exited_s = change.signalled_s, change.exited_s
    assert at_s is not None and exited_s is not None, "a drain has a SIGTERM and an exit"
    following = next_calls(calls, resident_users(calls, change.ranker, at_s, ttl_s), at_s)
    answered = [call for call in following.values() if call.ok]
    moved = [call for call in answered if call.instance != change.ranker]
    draining = [c for c in answered if c.instance == change.ranker and c.answered_s <= exited_s]
    back = [c for c in answered if c.instance == change.ranker and c.answered_s > exited_s]
    peers = {sample.ranker for sample in samples} - {change.ranker}
    received = increase(samples, at_s, exited_s + HANDOFF_SETTLE_S, peers).get("handoff_received_bytes", 0.0)
    last = last_before(samples, change.ranker, exited_s)
    held = last.values if last else {}
    return DrainOutcome(
        action=change.action, ranker=change.ranker, signalled_s=at_s, resident=len(following),
        hits=sum(map(hit, following.values())), failed=sum(not call.ok for call in following.values()),
        draining=len(draining), draining_hits=sum(hit(call) for call in draining),
        moved=len(moved), moved_hits=sum(hit(call) for call in moved),
        back=len(back), back_hits=sum(hit(call) for call in back),
        next_hit={user: hit(call) for user, call in sorted(following.items())},
        resident_bytes=change.resident_bytes,
        sent={k: v for k, v in held.items() if k.startswith(("handoff_sent", "handoff_dur"))},
        received_bytes=received,
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ScaleOut:
    """The spare's returning users once it served, against the steady phase's."""

    ranker: str
    ready_s: float
    end_s: float
    first_visits: int  # users whose first call the spare answered was a returning one
    first_hits: int
    calls: int  # every returning call the spare answered in the window
    hits: int


def scale_out(calls: Sequence[Call], ranker: str, ready_s: float, end_s: float, back: set[int]) -> ScaleOut:
    served = [call for call in within(calls, ready_s, end_s) if call.ok and call.instance == ranker]
    first = [
        call for call in next_calls(served, {c.user for c in served}, ready_s).values() if call.index in back
    ]
    again = [call for call in served if call.index in back]
    return ScaleOut(
        ranker, ready_s, end_s, len(first), sum(hit(call) for call in first), len(again),
        sum(hit(call) for call in again),
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Bucket:
    """One timeline bucket of one run: calls sent in [start_s, start_s + width)."""

    start_s: float
    calls: int
    sources: dict[str, int]
    failed: int
    recommend_p99_ms: float | None
    recompute_s: float


def timeline(
    calls: Sequence[Call], samples: Sequence[Sample], width_s: float, duration_s: float
) -> list[Bucket]:
    by_bucket: dict[int, list[Call]] = collections.defaultdict(list)
    for call in calls:
        by_bucket[int(call.intended_s // width_s)].append(call)
    buckets = []
    for k in range(int(duration_s / width_s + 0.5)):
        inside = by_bucket.get(k, [])
        device = increase(samples, k * width_s, (k + 1) * width_s)
        buckets.append(Bucket(
            start_s=round(k * width_s, 3), calls=len(inside),
            sources={s: sum(c.ok and c.source == s for c in inside) for s in SOURCES},
            failed=sum(not c.ok for c in inside),
            recommend_p99_ms=latency([c.recommend_ms for c in inside])["p99"],
            recompute_s=round(sum(device.get(f"device_s/{op}", 0.0) for op in RECOMPUTE_OPS), 4),
        ))  # fmt: skip
    return buckets
