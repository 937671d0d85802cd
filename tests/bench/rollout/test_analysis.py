"""One rollout run's arithmetic on synthetic records: who was resident on a drained ranker and what their
next call found, the phases' split, the spare's returning users, and the metrics read across a restart."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from bench.lib.probes import metric_values
from bench.rollout.analysis import (
    drain_outcome,
    increase,
    last_before,
    phase_stats,
    resident_users,
    returning,
    scale_out,
    timeline,
)
from bench.rollout.config import Phase
from bench.rollout.run import KEYS, Call, Change, Sample

TTL_S = 60.0


def call(
    index: int, user: str, at_s: float, instance: str = "ranker-0", source: str = "dram", **more
) -> Call:
    """An answered call (`ms` its Recommend latency) or, with `code`, a failed one."""
    code, ms = more.get("code", "OK"), more.get("ms", 100.0)
    if code != "OK":
        return Call(index, user, at_s, math.inf, code)
    miss = "never_pre_inferred" if source == "miss" else ""
    return Call(index, user, at_s, ms, "OK", source, miss, instance, more.get("rank_ms", 10.0))


def drained_at_100() -> list[Call]:
    """ranker-2 gets SIGTERM at 100 s and is gone at 102 s (DRAM TTL 60 s)."""
    r2, r0, r1 = "ranker-2", "ranker-0", "ranker-1"
    return [
        # Its next call answered at 101.1 s, while ranker-2 drained.
        call(0, "draining", 80.0, r2), call(1, "draining", 101.0, r2),
        call(2, "moved", 90.0, r2), call(3, "moved", 103.0, r0, "miss"),
        # Back on ranker-2 once restarted: read through from whoever served it meanwhile.
        call(4, "back", 95.0, r2), call(5, "back", 120.0, r2, "extended", ms=300.0),
        # Its last call before the SIGTERM was ranker-1's: not resident.
        call(6, "elsewhere", 60.0, r2), call(7, "elsewhere", 70.0, r1),
        call(8, "elsewhere", 110.0, r1, "miss"),
        # A call sent before the SIGTERM and answered after it (at 100.1 s) is neither its last nor its next.
        call(9, "in-flight", 50.0, r2), call(10, "in-flight", 99.95, r0, ms=150.0),
        call(11, "in-flight", 130.0, r0, "hbm"),
        call(12, "stale", 30.0, r2), call(13, "stale", 140.0, r2, "miss"),  # 70 s before: past the TTL
        call(14, "gone", 98.0, r2),  # resident, never comes back: not counted
        call(15, "failed", 97.0, r2), call(16, "failed", 104.0, code="UNAVAILABLE"),
    ]  # fmt: skip


def test_a_drained_rankers_resident_users_are_those_it_answered_last_within_the_ttl():
    # "in-flight" sent a call just before the SIGTERM that another ranker answered after it: its last call
    # answered before the SIGTERM was ranker-2's.
    assert resident_users(drained_at_100(), "ranker-2", 100.0, TTL_S) == [
        "back", "draining", "failed", "gone", "in-flight", "moved"
    ]  # fmt: skip


def test_their_next_call_is_split_by_who_answered_it_and_a_failure_is_no_hit():
    change = Change("restart", "ranker-2", 100.0, 100.0, 100.0, 102.0, 0, 105.0, {"dram": 3 * 2**20})
    samples = [
        Sample(99.9, "ranker-0", 7, {"handoff_received_bytes": 10.0}),
        Sample(99.9, "ranker-2", 9, {"kv_bytes/dram": 3.0 * 2**20}),
        Sample(101.9, "ranker-2", 9, {"handoff_sent/sent": 4.0, "handoff_sent_bytes": 2.0 * 2**20}),
        Sample(102.1, "ranker-0", 7, {"handoff_received_bytes": 10.0 + 2 * 2**20}),
        Sample(110.0, "ranker-0", 7, {"handoff_received_bytes": 99.0 * 2**20}),  # later: a read-through
    ]
    outcome = drain_outcome(drained_at_100(), change, samples, TTL_S)
    assert (outcome.resident, outcome.hits, outcome.failed) == (5, 3, 1)
    assert (outcome.draining, outcome.draining_hits) == (1, 1)
    assert (outcome.moved, outcome.moved_hits) == (2, 1)  # "moved" missed, "in-flight" hit in HBM
    assert (outcome.back, outcome.back_hits) == (1, 1)
    assert outcome.next_hit == {
        "back": True,
        "draining": True,
        "failed": False,
        "in-flight": True,
        "moved": False,
    }
    assert outcome.received_bytes == 2 * 2**20  # from the SIGTERM to a second after its exit
    assert outcome.sent == {"handoff_sent/sent": 4.0, "handoff_sent_bytes": 2.0 * 2**20}
    assert outcome.resident_bytes == {"dram": 3 * 2**20}


def test_returning_calls_came_within_the_ttl_of_their_users_previous_call():
    calls = drained_at_100()
    back = returning(calls, TTL_S)
    assert {c.index for c in calls if c.index in back} == {1, 3, 5, 7, 8, 10, 11, 16}
    # "stale" came back after 110 s, past the TTL: not returning.
    assert 13 not in back


def test_phases_split_the_calls_by_their_send_time_and_count_every_failure():
    calls = [
        call(0, "a", 1.0, source="miss", ms=110.0), call(1, "a", 5.0, ms=120.0),
        call(2, "b", 9.5, source="hbm"), call(3, "b", 10.0, code="DEADLINE_EXCEEDED"),
        call(4, "a", 12.0, source="extended", rank_ms=30.0), call(5, "c", 19.0, source="miss"),
    ]  # fmt: skip
    pre_infer, rank, uncached, profile = (
        "device_s/pre_infer",
        "device_s/rank",
        "device_s/uncached",
        "device_s/profile",
    )
    samples = [
        Sample(0.0, "ranker-0", 1, {pre_infer: 1.0, profile: 5.0}, baseline=True),
        Sample(10.0, "ranker-0", 1, {pre_infer: 1.5, rank: 0.2, "read_through/hit": 2.0}),
        Sample(20.0, "ranker-0", 1, {pre_infer: 1.75, uncached: 0.5, "read_through/hit": 3.0}),
    ]
    back = returning(calls, TTL_S)
    first = phase_stats(calls, Phase("steady", 0.0, 10.0), samples, back)
    assert (first.calls, first.failed, first.returning, first.returning_hits) == (3, 0, 1, 1)
    assert first.sources == {"hbm": 1, "dram": 1, "peer": 0, "extended": 0, "miss": 1}
    assert first.miss_reasons == {"never_pre_inferred": 1}
    assert first.device_s == {"pre_infer": 0.5, "rank": 0.2} and first.recompute_s == 0.5  # no profile
    assert first.rankers == {"read_through/hit": 2.0}
    second = phase_stats(calls, Phase("rollout", 10.0, 20.0), samples, back)
    assert (second.calls, second.failed, second.failure_codes) == (3, 1, {"DEADLINE_EXCEEDED": 1})
    assert second.recommend_ms == {"p50": 100.0, "p99": None}  # the failed call is infinitely slow
    assert second.rank_ms["p50"] == 30.0 and second.recompute_s == 0.75  # pre_infer 0.25 + uncached 0.5


def test_the_spares_returning_users_are_judged_on_their_first_call_to_it():
    r3 = "ranker-3"
    calls = [
        call(0, "a", 40.0, "ranker-0"), call(1, "a", 55.0, r3, "miss"), call(2, "a", 60.0, r3),
        call(3, "b", 56.0, r3, "miss"), call(4, "b", 70.0, r3),  # new to the run on the spare
        call(5, "c", 20.0, "ranker-1"), call(6, "c", 58.0, r3, "extended"),
        call(7, "d", 45.0, "ranker-1"), call(8, "d", 52.0, "ranker-1"),  # before its routers saw it: not its
        call(9, "e", 30.0, "ranker-0"), call(10, "e", 85.0, r3, "miss"),  # after the window
    ]  # fmt: skip
    spare = scale_out(calls, r3, 50.0, 80.0, returning(calls, TTL_S))
    assert (spare.first_visits, spare.first_hits) == (
        2,
        1,
    )  # a missed, c hit; b's first call was not returning
    assert (spare.calls, spare.hits) == (4, 3)  # a 55 and 60, b 70, c 58


def test_the_timeline_counts_each_bucket_and_the_device_time_recomputing_in_it():
    calls = [call(0, "a", 0.2, source="miss"), call(1, "a", 0.7), call(2, "b", 2.5, code="UNAVAILABLE")]
    samples = [
        Sample(0.0, "ranker-0", 1, {"device_s/pre_infer": 0.0}, baseline=True),
        Sample(1.0, "ranker-0", 1, {"device_s/pre_infer": 0.25}),
        Sample(3.0, "ranker-0", 1, {"device_s/pre_infer": 0.25, "device_s/uncached": 0.5}),
    ]
    buckets = timeline(calls, samples, 1.0, 3.0)
    assert [(b.start_s, b.calls, b.failed, b.sources["miss"], b.sources["dram"]) for b in buckets] == [
        (0.0, 2, 0, 1, 1), (1.0, 0, 0, 0, 0), (2.0, 1, 1, 0, 0)
    ]  # fmt: skip
    assert [b.recompute_s for b in buckets] == [0.25, 0.0, 0.5]
    assert buckets[2].recommend_p99_ms is None


def test_counters_add_up_across_a_restart_and_a_family_not_exported_reads_as_zero():
    samples = [
        Sample(0.0, "ranker-0", 1, {"device_s/uncached": 5.0, "kv_bytes/dram": 9.0}, baseline=True),
        Sample(10.0, "ranker-0", 1, {"device_s/uncached": 7.0}),
        Sample(20.0, "ranker-0", 1, {"device_s/uncached": 9.0}),  # its last before it was restarted
        Sample(25.0, "ranker-0", 2, {"device_s/uncached": 1.0, "read_through/hit": 4.0}),  # counted from 0
        Sample(30.0, "ranker-0", 2, {"device_s/uncached": 3.0, "read_through/hit": 6.0}),
        Sample(30.0, "ranker-1", 3, {"device_s/uncached": 100.0}),  # started during the run: from 0
    ]
    assert increase(samples, 0.0, 30.0, ["ranker-0"]) == {"device_s/uncached": 7.0, "read_through/hit": 6.0}
    assert increase(samples, 15.0, 27.0, ["ranker-0"]) == {"device_s/uncached": 3.0, "read_through/hit": 4.0}
    assert increase(samples, 0.0, 30.0)["device_s/uncached"] == 107.0  # gauges (kv_bytes) are left out
    assert increase(samples, 0.0, 30.0).get("handoff_received_bytes", 0.0) == 0.0
    assert last_before(samples, "ranker-0", 24.0).values == {"device_s/uncached": 9.0}


def test_the_exposition_is_read_flat_by_family_and_label():
    """As prometheus_client writes it: a histogram's sum, counters by label, a gauge; others ignored."""
    registry = CollectorRegistry()
    Histogram("relaygr_model_seconds", "", ["op"], registry=registry).labels("uncached").observe(0.75)
    received = Counter("relaygr_handoff_received_entries", "", ["outcome"], registry=registry)
    received.labels("admitted").inc(12)
    received.labels("checksum").inc()
    Counter("relaygr_handoff_received_bytes", "", registry=registry).inc(6 * 2**20)
    Gauge("relaygr_kv_cache_bytes", "", ["tier"], registry=registry).labels("dram").set(524288)
    Counter("relaygr_rank_requests", "", ["cache_source"], registry=registry).labels("hbm").inc(7)
    assert metric_values(generate_latest(registry).decode(), KEYS) == {
        "device_s/uncached": 0.75, "handoff_received/admitted": 12.0, "handoff_received/checksum": 1.0,
        "handoff_received_bytes": 6.0 * 2**20, "kv_bytes/dram": 524288.0,
    }  # fmt: skip
