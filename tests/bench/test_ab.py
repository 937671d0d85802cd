"""The fixed-load A/B (`python -m bench ab`) over fake fleets whose latencies are known: its order, the
users and arrivals every mode gets, no early stop, its statistics (the real ones) and its results files;
and one tiny real run on loopback."""

from __future__ import annotations

import math
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.ab import __main__ as ab_main
from bench.ab import config as ab_config
from bench.ab import report as ab_report
from bench.ab.__main__ import AbBench, Job, schedule
from bench.ab.config import AbConfig
from bench.ab.report import render_markdown
from bench.ab.schema import AbResults, analyse
from bench.lib import envelope, orders
from bench.lib.fleets import Mode
from bench.lib.recommends import Load, bench_config
from bench.lib.workload import RevisitSampler
from relaygr.v1 import recommend_pb2
from services.common.config import load
from services.loadgen.openloop import CallRecord
from tests.support.processes import fleet_children

ARGS = [
    "--modes", "baseline,relay,no-dram", "--rates", "10,20", "--seeds", "4", "--requests", "200",
    "--warmup-s", "1", "--resamples", "300", "--load-seed", "3",
]  # fmt: skip
B, R, N = "baseline", "relay", "no-dram"


def fake_rank_ms(mode: str, index: int, load: Load) -> float | None:
    """Baseline: every 10th request over 100 ms; relay and no-dram: every 100th; relay's fourth measured
    request of load seed 4 (the second) fails."""
    if mode == R and load.seed == 4 and index == load.warmup + 3:
        return None
    every = 10 if mode == B else 100
    return 150.0 if index % every == 0 else 40.0


class FakeFleet:
    def __init__(self, mode: Mode, events: list) -> None:
        self.mode = mode
        self.events = events

    def __enter__(self) -> FakeFleet:
        self.events.append(("start", self.mode.name))
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.events.append(("stop", self.mode.name))

    def pids(self) -> dict[str, int]:
        return {}

    def stub(self, universe, delay_ms: float, abandon_fraction: float) -> str:
        assert (delay_ms, abandon_fraction) == (100.0, 0.0)
        return f"fake://{self.mode.name}/{universe.label}"


class FakeAbBench(AbBench):
    events: list = []

    def fleet(self, mode: Mode) -> FakeFleet:
        return FakeFleet(mode, self.events)

    def drive(self, address: str, sampler: RevisitSampler, load: Load) -> list[CallRecord]:
        mode = address.split("/")[2]
        named = [sampler.user(i) for i in range(load.total)]
        self.events.append(("drive", mode, load, named))
        records = []
        for index in range(load.total):
            rank_ms = fake_rank_ms(mode, index, load)
            ok = rank_ms is not None
            response = recommend_pb2.RecommendResponse(rank_latency_ms=rank_ms) if ok else None
            code = grpc.StatusCode.OK if ok else grpc.StatusCode.DEADLINE_EXCEEDED
            latency_s = (rank_ms + 105.0) / 1000 if ok else 2.1
            records.append(
                CallRecord(index, index / load.rate, index / load.rate, latency_s, code, "", response)
            )
        return records


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    out = tmp_path_factory.mktemp("results")
    monkeypatch.setattr(ab_config, "RESULTS_DIR", out)
    monkeypatch.setattr(ab_main, "SETTLE_S", 0.0)
    FakeAbBench.events = []
    try:
        results = ab_main.main([*ARGS, "--name", "fake"], bench_class=FakeAbBench)
    finally:
        monkeypatch.undo()
    return results, FakeAbBench.events, out / "fake"


def test_the_runs_rotate_the_modes_by_seed_and_load():
    jobs = schedule([B, R, N], [10.0, 20.0], 2)
    assert [(j.seed_index, j.rate, j.mode) for j in jobs] == [
        (0, 10.0, B), (0, 10.0, R), (0, 10.0, N),
        (0, 20.0, R), (0, 20.0, N), (0, 20.0, B),
        (1, 10.0, R), (1, 10.0, N), (1, 10.0, B),
        (1, 20.0, N), (1, 20.0, B), (1, 20.0, R),
    ]  # fmt: skip
    assert schedule([B, R], [5.0], 3) == [Job(0, 5.0, B), Job(0, 5.0, R), Job(1, 5.0, R), Job(1, 5.0, B),
                                          Job(2, 5.0, B), Job(2, 5.0, R)]  # fmt: skip


def first_at_each_load(jobs: list[Job], modes: int) -> dict[float, list[str]]:
    """The mode that runs first in each (seed, load) block, by load."""
    return {
        rate: [j.mode for j in jobs[::modes] if j.rate == rate]
        for rate in dict.fromkeys(j.rate for j in jobs)
    }


def test_with_two_modes_at_two_loads_each_mode_runs_first_at_each_load_as_often_as_the_other():
    """The committed A/Bs' setting: 2 modes, 2 loads, 4 or 5 seeds. A rotation by block alone put relay
    first in every block at the first load and admit-all first in every block at the second."""
    assert first_at_each_load(schedule([R, "admit-all"], [12.0, 16.0], 4), 2) == {
        12.0: [R, "admit-all", R, "admit-all"], 16.0: ["admit-all", R, "admit-all", R],
    }  # fmt: skip
    five = first_at_each_load(schedule([R, "admit-all"], [12.0, 16.0], 5), 2)
    assert [(firsts.count(R), firsts.count("admit-all")) for firsts in five.values()] == [(3, 2), (2, 3)]


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 4), st.integers(1, 4), st.integers(1, 9))
def test_at_every_load_the_modes_turns_are_williams_rows_balanced_over_each_whole_set(modes, loads, seeds):
    names = [f"mode-{m}" for m in range(modes)]
    rates = [float(r + 1) for r in range(loads)]
    jobs = schedule(names, rates, seeds)
    assert len(jobs) == modes * loads * seeds
    blocks = [jobs[start : start + modes] for start in range(0, len(jobs), modes)]
    assert all(sorted(j.mode for j in block) == names for block in blocks)  # every mode once a block
    size = len(orders.williams_rows(modes))  # a whole set: modes rows (even), twice as many (odd)
    for rate in rates:
        at_rate = [[job.mode for job in block] for block in blocks if block[0].rate == rate]
        for place in range(modes):
            counts = [sum(order[place] == name for order in at_rate) for name in names]
            if modes % 2 == 0:  # every run of consecutive rows is a Latin square's
                assert max(counts) - min(counts) <= 1
        if seeds % size == 0:  # positions and neighbours alike
            assert orders.is_balanced(at_rate)


def test_every_fleet_is_up_before_the_first_run_and_down_after_the_last(fake_run):
    _, events, _ = fake_run
    kinds = [event[0] for event in events]
    assert kinds == ["start"] * 3 + ["drive"] * (3 + 24) + ["stop"] * 3  # each fleet's warm-up first
    assert [e[1] for e in events if e[0] == "start"] == [B, R, N]
    schedule_modes = [j.mode for j in schedule([B, R, N], [10.0, 20.0], 4)]
    assert [e[1] for e in events if e[0] == "drive"] == [B, R, N, *schedule_modes]


def test_each_fleet_warms_up_with_users_of_its_own_before_its_first_run_and_it_is_counted_nowhere(fake_run):
    results, events, folder = fake_run
    warmups = [event for event in events if event[0] == "drive"][:3]
    # 30 s (the default) at the first load, 10/s: 300 requests, all recorded, none left out as warm-up.
    assert {(load_.rate, load_.total, load_.warmup, load_.seed) for _, _, load_, _ in warmups} == {
        (10.0, 300, 0, 7)  # load seed index 4, after the measured 0-3: seed 3 + 4
    }
    named = {tuple(users) for _, _, _, users in warmups}
    assert len(named) == 1  # every mode's warm-up has the same users and arrivals ...
    measured = {tuple(users) for _, _, _, users in [e for e in events if e[0] == "drive"][3:]}
    assert not set(next(iter(named))) & {user for users in measured for user in users}  # ... and no run's
    assert [(run.mode, run.seed, len(run.rank_ms)) for run in results.warmups] == [(B, 7, 300), (R, 7, 300),
                                                                                    (N, 7, 300)]  # fmt: skip
    assert all(run.seed != 7 for run in results.runs)
    assert sum(cell.ranks for cell in results.cells) == 3 * 2 * 4 * 200  # modes x loads x seeds x requests
    report = (folder / "report.md").read_text()
    assert "Before its first run each fleet got 30 s of load at 10 Recommend/s" in report
    # Baseline: every 10th request over 100 ms, 30 of 300; relay and no-dram every 100th.
    assert (
        "baseline rank P99 150.0 ms, 30 of 300 Ranks over the SLO; relay rank P99 40.0 ms, 3 of 300" in report
    )


def test_every_mode_gets_the_same_users_and_arrivals_at_a_seed_and_load_and_no_early_stop(fake_run):
    results, events, _ = fake_run
    drives = [event for event in events if event[0] == "drive"][3:]  # after the fleets' warm-ups
    by_block: dict = {}
    for _, mode, load_, named in drives:
        by_block.setdefault((load_.seed, load_.rate), []).append((mode, load_, named))
    assert set(by_block) == {(seed, rate) for seed in (3, 4, 5, 6) for rate in (10.0, 20.0)}  # load seeds 3-6
    blocks = list(by_block.values())
    for block in blocks:
        assert len({mode for mode, _, _ in block}) == 3
        assert len({load_ for _, load_, _ in block}) == 1  # rate, total, deadline and arrival seed
        assert len({tuple(named) for _, _, named in block}) == 1
        (_, load_, named), *_ = block
        assert load_.total == load_.warmup + 200 and load_.warmup == round(load_.rate)  # 1 s of warm-up
        assert len(set(named)) < len(named)  # revisits: some users come back
    # Another seed or load: other users.
    assert len({block[0][2][0] for block in blocks}) == 8
    for run in results.runs:
        assert len(run.rank_ms) == len(run.recommend_ms) == 200  # every request sent, the warm-up left out


def test_the_cells_count_every_request_over_the_slo_failures_included(fake_run):
    results, _, _ = fake_run
    cells = {(cell.mode, cell.rate): cell for cell in results.cells}
    # Baseline: multiples of 10 among indices 10-209 (20-219): 20 a seed. Relay: 100 and 200 a seed, and
    # one failure at load seed 4. Recommends: 105 ms more than their Rank, over 200 ms exactly when it is.
    for rate in (10.0, 20.0):
        assert (cells[B, rate].ranks, cells[B, rate].ranks_over, cells[B, rate].errors) == (800, 80, 0)
        assert (cells[R, rate].ranks_over, cells[R, rate].errors) == (9, 1)
        assert (cells[N, rate].ranks_over, cells[N, rate].errors) == (8, 0)
        for cell in (cells[B, rate], cells[R, rate], cells[N, rate]):
            assert cell.recommends_over == cell.ranks_over
            share = cell.ranks_over_share
            assert share.value == cell.ranks_over / 800 and share.low < share.value < share.high
        assert cells[B, rate].ranks_design_effect == 1.0  # the same count in every seed
        assert cells[B, rate].rank_p99_ms.value == 150.0
        assert cells[R, rate].block == round(rate)  # 1 s of requests a block
    results_recommend_bound = results.recommend_bound_ms
    assert results_recommend_bound == 200.0


def test_every_pair_of_modes_is_compared_with_a_verdict(fake_run):
    results, _, _ = fake_run
    pairs = {(pair.a, pair.b, pair.rate): pair for pair in results.comparisons}
    assert set(pairs) == {(a, b, rate) for a, b in ((B, R), (B, N), (R, N)) for rate in (10.0, 20.0)}
    relay = pairs[B, R, 10.0]
    assert relay.ranks_over_share.value == pytest.approx(9 / 800 - 80 / 800)
    assert relay.ranks_over_share.high < 0
    assert relay.verdicts[0].startswith(
        "relay has fewer Ranks over the SLO than baseline at 10/s: -8.88 pp [-12.83, -5.39]"
    )
    close = pairs[R, N, 20.0]
    assert close.ranks_over_share.low < 0 < close.ranks_over_share.high
    assert "no difference shown" in close.verdicts[0]
    # Relay's 800 Ranks: 791 at 40 ms, 8 at 150, one failure: its P99 (the 792nd) is 150; no-dram has 792
    # at 40 ms. A resample with one fewer of relay's slow ones ties them: the interval reaches 0.
    p99 = close.rank_p99_ms
    assert (p99.value, p99.low, p99.high) == (-110.0, -110.0, 0.0)
    assert close.verdicts[2] == (
        "Rank P99 at 20/s, no-dram against relay: no difference shown (-110.0 ms [-110.0, +0.0])"
    )


def test_the_results_read_back_byte_for_byte_and_render_the_written_report(fake_run):
    results, _, folder = fake_run
    text = (folder / "results.json").read_text()
    loaded = AbResults.load(folder / "results.json")
    assert loaded == results
    assert envelope.dumps(envelope.wrap("ab", loaded.to_json(), commit=loaded.versions.git_commit)) == text
    report = (folder / "report.md").read_text()
    assert render_markdown(loaded) == report
    assert "| 20 | relay | 800 | 1 | 9 | 1.12 [0.41, 3.06] | 1 |" in report
    assert "- relay has fewer Ranks over the SLO than baseline at 20/s" in report
    failed = loaded.runs[[run.mode == R and run.seed == 4 for run in loaded.runs].index(True)]
    assert failed.rank_ms[3] is None and failed.errors == 1


def test_the_report_names_the_quantile_its_share_intervals_take():
    assert ab_report.quantile(5) == (
        "taking Student's t quantile for 4 degrees of freedom (seeds - 1: the effect is estimated from them)"
    )
    assert ab_report.quantile(1) == "with the normal quantile (one seed: no design effect is estimated)"


def test_settings_need_two_modes_and_name_only_known_ones():
    with pytest.raises(SystemExit):
        load(AbConfig, ["--modes", "relay"])
    with pytest.raises(SystemExit):
        load(AbConfig, ["--modes", "relay,nonsense"])
    config = load(AbConfig, ["--modes", "relay,relay-owner-only", "--relay-window-ms", "80"], environ={})
    assert [mode.trigger_args for mode in config.mode_list()] == ["", "--relay-window-ms 0"]
    assert config.recommend_bound_ms == 180.0 and config.block(45.0) == 45
    assert config.out_dir().name == "relaygr-ab"
    singles = load(AbConfig, ["--modes", "relay,relay-single-pre-infers"], environ={})
    assert [mode.trigger_args for mode in singles.mode_list()] == ["", "--pre-infer-batch-window-ms 0"]
    fleets = bench_config(config)
    assert (fleets.relay_window_ms, fleets.longest_long_term) == (80.0, 2048)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_tiny_real_ab_runs_end_to_end_on_loopback(tmp_path: Path, monkeypatch):
    """Two cpu-tiny fleets of one ranker each up at once, each warmed up for 2 s, then baseline and relay at
    10/s, two seeds of 30 requests: every run sends every request, the results read back, and no process
    is left behind."""
    monkeypatch.setattr(ab_config, "RESULTS_DIR", tmp_path)
    results = ab_main.main([
        "--name", "tiny", "--model-preset", "cpu-tiny", "--rankers", "1", "--modes", "baseline,relay",
        "--rates", "10", "--seeds", "2", "--requests", "30", "--warmup-s", "0.5", "--fleet-warmup-s", "2",
        "--mix-median", "128",
        "--mix-max", "256", "--ranker-profile-repeats", "1",
        "--ranker-profile-lengths", "128,256", "--resamples", "200", "--startup-timeout-s", "60",
    ])  # fmt: skip
    assert fleet_children() == []
    assert [(run.mode, run.seed) for run in results.runs] == [("baseline", 0), ("relay", 0),
                                                              ("relay", 1), ("baseline", 1)]  # fmt: skip
    for run in results.runs:
        assert len(run.rank_ms) == 30 and run.warmup == 5
        assert all(ms is None or (0 < ms < 10_000 and not math.isnan(ms)) for ms in run.rank_ms)
    assert len(results.cells) == 2 and len(results.comparisons) == 1
    assert [(run.mode, len(run.rank_ms)) for run in results.warmups] == [("baseline", 20), ("relay", 20)]
    assert AbResults.load(tmp_path / "tiny" / "results.json") == results


@pytest.mark.parametrize(("name", "warmups"), [("ab-mix1-admit-all", 0), ("ab-mix1-admit-all-warm", 2)])
def test_the_committed_ab_runs_read_back_and_render_their_reports(name: str, warmups: int):
    """The committed A/Bs (the first from before the fleets' warm-up, the second with it): each results.json
    holds what the schema writes, and each report.md is what the report renders from it (every run's latencies
    are kept, so its intervals can be computed again)."""
    folder = Path(__file__).resolve().parents[2] / "bench" / "results" / name
    results = AbResults.load(folder / "results.json")
    assert results.to_json() == envelope.read(folder / "results.json", "ab")
    assert render_markdown(results) == (folder / "report.md").read_text()
    assert [mode.name for mode in results.modes] == ["relay", "admit-all"] and len(results.runs) == 20
    assert len(results.warmups) == warmups
    assert results.settings.fleet_warmup_s == (30.0 if warmups else 0.0)
    # Both ran before the Latin-square order: relay first at 12/s in every block, admit-all at 16/s, and
    # the report says so.
    assert ab_report.places(results) == {12.0: {R: [5, 0], "admit-all": [0, 5]},
                                         16.0: {R: [0, 5], "admit-all": [5, 0]}}  # fmt: skip
    assert (
        "at 12/s relay in 5 of 5, admit-all in 0 of 5; at 16/s relay in 0 of 5, admit-all in 5 of 5"
        in (folder / "report.md").read_text()
    )
    assert "**The order is unbalanced at a load**" in (folder / "report.md").read_text()


@pytest.mark.parametrize("name", ["ab-mix1-admit-all", "ab-mix1-admit-all-warm"])
def test_the_committed_ab_statistics_are_what_the_analysis_computes_from_their_runs(name: str):
    """Every cell and comparison a committed A/B stores is what `bench.ab.schema.analyse` computes again from
    its runs' latencies and its settings."""
    folder = Path(__file__).resolve().parents[2] / "bench" / "results" / name
    results = AbResults.load(folder / "results.json")
    assert analyse(results.runs, results.settings) == (results.cells, results.comparisons)
