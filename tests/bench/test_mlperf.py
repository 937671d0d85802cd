"""`python -m bench mlperf`: real LoadGen runs, one against a real local fleet (cpu-tiny, relay mode).

No timed assertion: LoadGen's verdict is recorded, never asserted (a few seconds at a low load end INVALID
by early stopping anyway). What is asserted holds on any machine: LoadGen's logs are written and name the
scenario, every sample LoadGen issued is completed (failures included, none lost), the tier shares add up
to 1, a user's first visit can only be pre-inferred or a miss, and a later visit is served from a cache
tier; the history computed on the Ranks' critical paths is the answers' computed_prefix_events plus every
Rank's short-term events, none of the prefix for an HBM or DRAM answer, all of it for a MISS.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import grpc
import pytest

from bench.lib import envelope
from bench.mlperf import report
from bench.mlperf.__main__ import main
from bench.mlperf.results import (
    DETAIL_FILE,
    SUMMARY_FILE,
    RunResult,
    SearchResult,
    read_json,
    read_summary,
    write_json,
)
from bench.mlperf.run import StreamingUsers, user_count
from bench.mlperf.tally import tally
from relaygr.v1 import common_pb2, recommend_pb2
from services.loadgen.openloop import CallRecord
from tests.support.processes import fleet_children

CACHE_TIERS = ("hbm", "dram", "extended")
HBM, DRAM, EXTENDED, MISS = (
    common_pb2.CACHE_SOURCE_HBM, common_pb2.CACHE_SOURCE_DRAM,
    common_pb2.CACHE_SOURCE_EXTENDED, common_pb2.CACHE_SOURCE_MISS,
)  # fmt: skip
RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def test_a_short_server_run_against_a_local_relay_fleet(tmp_path: Path):
    out = tmp_path / "run"
    # Two users visited about 10 times each in 5 s; histories of 32-512 events that never reach the cap (so
    # none slides and goes stale), growing by about 2 events a second.
    main([
        "--scenario", "Server", "--target-qps", "4", "--duration-s", "5", "--min-query-count", "10",
        "--mode", "relay", "--model-preset", "cpu-tiny", "--rankers", "2", "--users", "2",
        "--history-median", "64", "--history-sigma", "0.5", "--history-max", "512",
        "--growth-events-per-min", "120", "--startup-timeout-s", "60", "--output", str(out),
    ])  # fmt: skip
    assert fleet_children() == [], "the command left processes of its fleet behind"
    summary = (out / SUMMARY_FILE).read_text()
    assert "Scenario : Server" in summary
    assert (out / DETAIL_FILE).stat().st_size > 0
    result = read_json(RunResult, out / "result.json")
    assert (out / "summary.md").read_text().startswith("# LoadGen Server: relay, target 4 QPS")

    # Every sample LoadGen issued was completed by the SUT; here every one was answered and ranked.
    assert result.loadgen.issued_samples >= 10
    assert result.completed == result.loadgen.issued_samples
    assert result.failed == 0 and result.error_codes == {}
    assert result.tiers.ranked == result.completed
    assert result.loadgen.scenario == "Server" and result.loadgen.result in ("VALID", "INVALID")
    # The SUT times each call from LoadGen's issue to its answer, inside LoadGen's own time for the sample.
    assert 0 < result.recommend_ms.p50 <= result.recommend_ms.p99 <= result.loadgen.max_ms

    tiers = result.tiers
    assert sum(tiers.rates.values()) == pytest.approx(1.0, abs=1e-3)
    assert sum(tiers.counts.values()) == tiers.ranked
    assert tiers.later_visits == tiers.ranked - result.distinct_users
    # A user's first visit finds nothing cached (its namespace is new): pre-inferred (HBM) or a miss.
    first = {tier: tiers.counts[tier] - tiers.later_counts[tier] for tier in tiers.counts}
    assert first["dram"] == 0 and first["extended"] == 0
    # Relay: a later visit of a user is served from a cache tier (DRAM, extended or pre-inferred).
    assert sum(tiers.later_counts[tier] for tier in CACHE_TIERS) > 0

    history = result.history
    assert history.short_term == 16 and history.mean_long_term >= 32
    assert (
        history.computed
        == history.computed_prefix + history.computed_short_term
        == sum(history.computed_by_tier.values())
    )
    assert history.computed_short_term == 16 * tiers.ranked
    # Relay: a visit served from HBM (pre-inferred, or joined) or DRAM computed no long-term event itself.
    for tier in ("hbm", "dram"):
        assert history.computed_by_tier[tier] == 16 * tiers.counts[tier]
    # A MISS computed its whole long-term prefix on its critical path, unless it joined a computation of the
    # same prefix that a concurrent Rank of its user had started (then 0).
    assert 16 * tiers.counts["miss"] <= history.computed_by_tier["miss"] <= history.tokens_by_tier["miss"]
    assert history.computed_share < 1.0 and history.computed <= history.tokens
    waits = result.prefix_wait_ms
    assert waits.all.p50 is not None and 0 <= waits.all.p50 <= waits.all.p99
    assert waits.hbm_over_1ms <= tiers.counts["hbm"]


def test_a_baseline_miss_computes_its_whole_long_term_history(tmp_path: Path):
    out = tmp_path / "baseline"
    main([
        "--scenario", "Server", "--target-qps", "4", "--duration-s", "2", "--min-query-count", "6",
        "--mode", "baseline", "--model-preset", "cpu-tiny", "--rankers", "1", "--users", "60",
        "--history-median", "64", "--history-sigma", "0.5", "--history-max", "512",
        "--startup-timeout-s", "60", "--output", str(out),
    ])  # fmt: skip
    result = read_json(RunResult, out / "result.json")
    tiers, history = result.tiers, result.history
    # 60 users for about 8 visits: no two Ranks of a user at once, so no MISS joined another's computation.
    assert tiers.ranked == result.completed >= 6 and tiers.counts["miss"] > 0
    assert history.computed_by_tier["miss"] == history.tokens_by_tier["miss"] > 16 * tiers.counts["miss"]
    assert history.computed_share_by_tier["miss"] == 1.0
    assert history.computed == history.computed_prefix + 16 * tiers.ranked


def answer(user: int, source: int, long_term: int, computed: int, wait_ms: float, at_ms: int) -> CallRecord:
    """An answered call of QSL sample (user) `user`, received by the stub at `at_ms`."""
    response = recommend_pb2.RecommendResponse(
        cache_source=source, long_term_length=long_term, computed_prefix_events=computed,
        prefix_wait_ms=wait_ms, request_time_ms=at_ms, rank_latency_ms=at_ms,
    )  # fmt: skip
    return CallRecord(user, at_ms / 1000, at_ms / 1000, 0.01 * at_ms, grpc.StatusCode.OK, "", response)


def test_the_tally_counts_the_critical_path_the_answers_report():
    a, b, c = 0, 1, 2
    records = [
        answer(a, EXTENDED, 320, 10, 3.0, 4),  # extended by the 10 events appended (completed out of order)
        answer(a, MISS, 300, 300, 40.0, 1),  # computed in full
        answer(a, HBM, 310, 0, 0.1, 2),  # pre-inferred and ready
        answer(b, HBM, 200, 0, 12.0, 3),  # joined a pre-inference still running
        answer(b, DRAM, 200, 0, 2.0, 5),  # reloaded
        CallRecord(c, 0.006, 0.006, 2.0, grpc.StatusCode.DEADLINE_EXCEEDED, "", None),  # failed: not counted
    ]
    t = tally(records, short_term=16)
    h = t["history"]
    assert h.tokens == 300 + 310 + 200 + 320 + 200 + 5 * 16
    assert (h.computed_prefix, h.computed_short_term, h.computed) == (310, 80, 390)
    assert h.computed_by_tier == {"hbm": 32, "dram": 16, "extended": 26, "miss": 316}
    assert h.computed_share_by_tier["miss"] == 1.0 and h.computed_share == round(390 / h.tokens, 4)
    assert h.extended_computed_mean == 10.0
    w = t["prefix_wait_ms"]
    assert w.hbm_over_1ms == 1 and w.by_tier["miss"].p99 == 40.0 and w.by_tier["hbm"].p99 > 11.0
    assert w.all.p50 == 3.0
    # The first visit of each user, in the stub's order: a's MISS and b's HBM; the three others are later.
    tiers = t["tiers"]
    assert tiers.ranked == 5 and tiers.counts == {"hbm": 2, "dram": 1, "extended": 1, "miss": 1}
    assert tiers.later_visits == 3 and tiers.later_counts == {"hbm": 1, "dram": 1, "extended": 1, "miss": 0}
    assert tiers.later_rates["hbm"] == round(1 / 3, 4) and tiers.rates["hbm"] == 0.4
    assert (t["distinct_users"], t["visits_per_user"]) == (2, 2.5)
    assert (t["rank_ms"].p50, t["recommend_ms"].p99) == (3.0, 50.0)


@pytest.mark.parametrize("scenario", ["Server", "Offline"])
def test_every_sample_is_completed_when_every_call_fails(tmp_path: Path, scenario: str):
    """Nothing listens at the address: each call fails at once, and is completed and counted (Offline: in
    one batch of every sample, at most --max-in-flight calls at once)."""
    out = tmp_path / "dead"
    main([
        "--recommend", "127.0.0.1:1", "--scenario", scenario, "--target-qps", "20", "--duration-s", "1",
        "--min-query-count", "15", "--max-in-flight", "4", "--timeout-s", "1", "--output", str(out),
    ])  # fmt: skip
    result = read_json(RunResult, out / "result.json")
    assert result.loadgen.scenario == scenario and (out / "summary.md").exists()
    assert result.settings.mode == "external"
    assert result.completed == result.loadgen.issued_samples >= 15
    assert result.failed == result.completed and set(result.error_codes) == {"UNAVAILABLE"}
    assert not result.valid and result.tiers.ranked == 0
    assert result.tiers.rates == dict.fromkeys(("hbm", "dram", "extended", "miss"), 0.0)


def loadgen_logs(folder: Path, summary: str, *detail: tuple[str, object]) -> Path:
    """A folder with LoadGen's two logs: `summary`'s lines, and the detail log's entries (key, value)."""
    folder.mkdir(exist_ok=True)
    (folder / SUMMARY_FILE).write_text(summary)
    entries = [f":::MLLOG {json.dumps({'key': key, 'value': value})}" for key, value in detail]
    (folder / DETAIL_FILE).write_text("\n".join(["not an entry", *entries]) + "\n")
    return folder


def test_the_summary_parser_reads_the_verdict_and_refuses_an_unfinished_log(tmp_path: Path):
    text = "Scenario : Offline\nSamples per second: 12.5\nResult is : VALID\n  Min duration satisfied : Yes\n"
    logs = loadgen_logs(
        tmp_path / "offline", text, ("result_query_count", 1), ("generated_samples_per_query", 40)
    )
    parsed = read_summary(logs)
    assert (parsed.scenario, parsed.valid, parsed.samples_per_s) == ("Offline", True, 12.5)
    assert parsed.issued_samples == 40  # queries times samples per query
    assert parsed.min_duration is True and parsed.early_stopping is None and parsed.p99_ms is None
    assert parsed.overlatency_queries is None and parsed.loadgen_errors == 0
    server = "Scenario : Server\nResult is : INVALID\n99.00 percentile latency (ns) : 80123456\n"
    logs = loadgen_logs(
        tmp_path / "server", server, ("result_query_count", 7), ("result_overlatency_query_count", 2),
        ("result_query_count", 99),  # only a key's first entry counts
    )  # fmt: skip
    parsed = read_summary(logs)
    assert (parsed.valid, parsed.p99_ms) == (False, 80.123)
    assert (parsed.issued_samples, parsed.overlatency_queries) == (7, 2)
    with pytest.raises(ValueError, match="Result is"):
        read_summary(loadgen_logs(tmp_path / "unfinished", "Scenario : Server\n", ("result_query_count", 3)))
    with pytest.raises(ValueError, match="result_query_count"):
        read_summary(loadgen_logs(tmp_path / "no-count", text))


def test_sample_indices_name_users_and_the_qsl_is_sized_by_visits():
    users = StreamingUsers("ns", user_count(queries=100, visits_per_user=4))
    assert users.count == 25 and users.user(0) == "ns-u0" and users.user(24) == "ns-u24"
    with pytest.raises(IndexError):
        users.user(25)
    assert user_count(queries=100, visits_per_user=4, users=7) == 7


@pytest.mark.parametrize("name", ["mlperf", "mlperf-m512"])
def test_the_committed_searches_read_back_and_render_as_committed(name: str, tmp_path: Path):
    search = read_json(SearchResult, RESULTS / name / "result.json")
    assert (RESULTS / name / "summary.md").read_text() == report.search_markdown(search)
    write_json(search, tmp_path / "result.json")  # the record as committed, in this machine's envelope
    assert envelope.read(tmp_path / "result.json", "mlperf") == envelope.read(
        RESULTS / name / "result.json", "mlperf"
    )
    for mode in search.modes.values():
        assert mode.best_qps is not None and mode.best().valid
        for run in mode.runs:
            folder = RESULTS / name / mode.mode / f"q{run.settings.target_qps:g}"
            assert run.completed == run.loadgen.issued_samples and run.failed == 0
            assert read_json(RunResult, folder / "result.json") == run
            assert read_summary(folder) == run.loadgen  # what LoadGen's own logs say
            assert (folder / "summary.md").read_text() == report.run_markdown(run)


def test_a_search_states_its_absolute_p99_target_in_the_hosts_unit():
    search = read_json(SearchResult, RESULTS / "mlperf" / "result.json")
    assert search.host_unit_ms is None and "u (the host's unit" not in report.search_markdown(search)
    timed = dataclasses.replace(search, host_unit_ms=40.0)
    target = search.configuration["p99_ms"]
    assert f"on this host it is {target / 40.0:.2f} u (the host's unit u = 40 ms" in report.search_markdown(
        timed
    )
