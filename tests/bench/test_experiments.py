"""A whole benchmark run over fake fleets: every mode's limits are known, so the run's order, its sweeps
(refinements, sequential verdicts, brackets, abandonment, ablations) and its results (rendered by the real
report) are checked against values worked out by hand.

A fake load's latencies say how near it is to the mode's limit L, in 100 ranked requests per seed: far
below (at most 0.9 L) every request takes 40 ms, far above (over 1.1 L) 400 ms, so one seed decides;
just below (0.9 L, L], one request of each seed takes 400 ms (the P99 meets the SLO, its interval holds
it at every pooled size: undecided at the full profile's cap of 5 seeds, passing); just above (L, 1.1 L],
four of each seed do (the first seed's interval holds the SLO, two seeds' lies above it: failing after 2).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys
from typing import Any

import grpc
import pytest

from bench import report
from bench.lib import driving, probes
from bench.lib.config import BenchConfig
from bench.lib.driving import Plan
from bench.lib.points import FIRST_SEED, Before, PointSpec, summarize
from bench.lib.schema import CachedRankPoint, Cost, FloorPoint, Machine, Point, Run, Versions, recorded
from bench.lib.workload import Universe
from bench.report.figures import hit_rate_points
from bench.run import experiments
from bench.run.__main__ import assemble, summary
from bench.run.experiments import Bench
from relaygr.v1 import common_pb2, recommend_pb2
from services.loadgen.openloop import CallRecord

CONFIG = dataclasses.replace(BenchConfig(), profile="full")
MIX1, MIX2 = "mix-m1024-s0.75-max2048", "mix-m1536-s0.75-max4096"
# The longest length (events) and the highest load (req/s) at which each mode meets the SLO.
LENGTH_LIMITS = {
    ("baseline", 100.0): 1536, ("relay", 100.0): 3072, ("relay", 30.0): 2048, ("relay", 200.0): 4096,
}  # fmt: skip
LOAD_LIMITS = {
    ("baseline", MIX1, 0.0): 13, ("relay", MIX1, 0.0): 40,
    ("baseline", MIX2, 0.0): 5, ("relay", MIX2, 0.0): 9,
    ("baseline", MIX1, 0.1): 14, ("relay", MIX1, 0.1): 36,
    ("baseline", MIX1, 0.3): 16, ("relay", MIX1, 0.3): 30,
    ("admit-all", MIX1, 0.0): 45, ("dram-only", MIX1, 0.0): 20, ("no-affinity", MIX1, 0.0): 30,
    ("no-dram", MIX1, 0.0): 25, ("no-revisit", MIX1, 0.0): 18,
}  # fmt: skip
WASTED_S_PER_POINT = 2.0  # RelayGR's rankers' wasted pre-inference per point, per abandoned share
FOREIGN_CORES = 0.1  # other users' cores during every fake point
# The host's unit u (the full pass at the first mix's cap, 2048 events) is 100 / 2.87 ms: the SLO and the
# relay window at their default 2.87 u are 100 ms, the other SLO multiples 69.7 (2 u) and 139.4 ms (4 u).
U_MS = 100 / 2.87
FLOOR = [
    FloorPoint(prefix_length=n, full_ms=n * U_MS / 2048, pre_infer_ms=n / 40, rank_ms=2.0)
    for n in CONFIG.length_grid()
]


def latencies(rate: float, limit: float) -> list[float]:
    """One seed's 100 ranking latencies at `rate` for a mode whose limit is `limit` (the module's rule);
    between 0.7 L and 0.9 L the fast ones take 80 ms, which meets the SLO at 2.87 u and 4 u, not at 2 u."""
    slow = 0 if rate <= 0.9 * limit else 1 if rate <= limit else 4 if rate <= 1.1 * limit else 100
    fast = 80.0 if 0.7 * limit < rate <= 0.9 * limit else 40.0
    return [fast] * (100 - slow) + [400.0] * slow


def seeds_by_rule(rate: float, limit: float) -> int:
    """The seeds a load's verdict takes under the module's rule (the full profile's cap: 5)."""
    return 5 if 0.9 * limit < rate <= limit else 3 if limit < rate <= 1.1 * limit else 1


def fake_point(
    rate: float, rank_ms: list[float], source: int, abandoned: int, seed: int, **extra: Any
) -> Point:
    """A point summarized by the benchmark's own `summarize` from calls that took `rank_ms` (plus
    `abandoned` abandoned ones), as a run records it (its samples in memory)."""
    spec = PointSpec(rate, warmup=0, measured=len(rank_ms) + abandoned, timeout_s=1, slo_ms=CONFIG.slo_ms,
                     max_error_fraction=CONFIG.max_error_fraction, seed=seed)  # fmt: skip
    gone = recommend_pb2.RecommendResponse(abandoned=True, admitted=True)
    answers = [gone] * abandoned + [
        recommend_pb2.RecommendResponse(rank_latency_ms=ms, cache_source=source, long_term_length=8)
        for ms in rank_ms
    ]
    calls = [CallRecord(i, i / rate, i / rate, 0.05, grpc.StatusCode.OK, "", answer)
             for i, answer in enumerate(answers)]  # fmt: skip
    cost = Cost(cpu_s={"ranker-0": 3.0, "router": 1.0}, rankers={}, wall_s=10.0, foreign_cores=FOREIGN_CORES)
    point = recorded(Point, summarize(calls, spec, aborted=False, wall_s=10.0), seed=seed, cost=cost)
    return dataclasses.replace(point, **extra)


class FakeFleet:
    """A fleet that is never started; its rankers' counters are a dictionary the fake points add to."""

    def __init__(self, mode: Any, started: list[str], counters: dict[str, dict[str, Any]]) -> None:
        self.mode = mode
        self.url = f"fake://{mode.name}"
        counters[self.url] = {"device_s": {"rank": 0.0}, "pre_infer_wasted_s": 0.0}
        started.append(mode.name)

    def __enter__(self) -> FakeFleet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass

    def router(self) -> str:
        return "fake-router"

    def ranker_metrics(self) -> dict[str, str]:
        return {"ranker-0": self.url}


@pytest.fixture(scope="module")
def run():
    """The fake run's results as results.json holds them, and every point measured, in order."""
    return fake_run(CONFIG)


def fake_run(config: BenchConfig, started: list[str] | None = None) -> tuple[dict, list[str], list[tuple]]:
    """A whole run of `config` over fake fleets, its floor `FLOOR` (u = `U_MS`): results.json's content,
    the fleets in start order (appended to `started`), and every point measured (mode, universe, rate,
    window, abandoned share, seed index, the SLO judged against, the plan's tag), in order."""
    monkeypatch = pytest.MonkeyPatch()
    started = [] if started is None else started
    counters: dict[str, dict[str, Any]] = {}
    measured: list[tuple] = []

    def point(
        self: Bench,
        plan: Plan,
        universe: Universe,
        rate: float,
        seed_index: int = 0,
        before: Before = FIRST_SEED,
        slo_ms: float | None = None,
    ) -> Point:
        mode = plan.fleet.mode.name if plan.revisits else "no-revisit"
        judged = self.config.slo_ms if slo_ms is None else slo_ms
        measured.append(
            (mode, universe.label, rate, plan.delay_ms, plan.abandon_fraction, seed_index, judged, plan.tag)
        )
        if universe.label.startswith("L"):  # lengths: far from the limit (one seed)
            passes = int(universe.label[1:]) <= LENGTH_LIMITS[mode, plan.delay_ms]
            rank_ms = [40.0 if passes else 400.0] * 100
            extra = {"long_term": int(universe.label[1:]), "delay_ms": plan.delay_ms}
        else:
            rank_ms = latencies(rate, LOAD_LIMITS[mode, universe.label, plan.abandon_fraction])
            extra = {}
        fleet_counters = counters[plan.fleet.url]
        fleet_counters["device_s"]["rank"] += 10.0
        if plan.fleet.mode.relay:
            fleet_counters["pre_infer_wasted_s"] += WASTED_S_PER_POINT * plan.abandon_fraction
        abandoned = round(100 * plan.abandon_fraction)
        source = common_pb2.CACHE_SOURCE_HBM if plan.fleet.mode.relay else common_pb2.CACHE_SOURCE_MISS
        return fake_point(rate, rank_ms, source, abandoned, seed_index, **extra)

    def fake_snapshot(pids: dict, metrics: dict) -> dict:
        rankers = {}
        for url in metrics.values():
            probes._add(rankers, counters[url])
        return {"at": 0.0, "machine_busy_s": 0.0, "cpu_s": {}, "rankers": rankers}

    monkeypatch.setattr(experiments, "in_fresh_process", lambda function, *args: FLOOR)
    for name, value in (("LEASE_TTL_MS", 0), ("SETTLE_S", 0.0)):
        monkeypatch.setattr(driving, name, value)
    monkeypatch.setattr(
        experiments,
        "cached_rank_through_router",
        lambda *args: [
            CachedRankPoint(
                prefix_length=2048,
                request_kib=40.0,
                serialize_ms=0.1,
                rank_ms_p50=6.0,
                rank_ms_p99=9.0,
                sources={"hbm": 100},
            )
        ],
    )
    monkeypatch.setattr(experiments, "LEASE_SETTLE_S", 0.0)
    monkeypatch.setattr(probes, "snapshot", fake_snapshot)
    monkeypatch.setattr(Bench, "point", point)
    monkeypatch.setattr(Bench, "fleet", lambda self, mode: FakeFleet(mode, started, counters))
    try:
        bench = Bench(config, log_dir=None, log=lambda line: None)
        machine = Machine(cores=2, cpu_model="x", memory_gib=8.0, platform="x", python="x")
        results = assemble(
            Run, config, bench.run(), "2026-01-01T00:00:00+00:00", 3600.0, machine,
            Versions(torch="2.x", git_commit="abc1234"),
        )  # fmt: skip
    finally:
        monkeypatch.undo()
    return results.to_json(), started, measured


def test_the_fleets_start_in_order_and_no_revisit_runs_on_relays_own_fleet(run):
    _, started, measured = run
    assert started == ["relay", "baseline", "admit-all", "dram-only", "no-affinity", "no-dram"]
    assert {m[0] for m in measured} == {mode for mode, _, _ in LOAD_LIMITS}
    assert {m[3] for m in measured if m[0] == "no-revisit"} == {100.0}


def test_the_length_sweep_and_the_window_sensitivity_find_their_limits(run):
    results, _, _ = run
    assert results["length_ratio"] == 2.0
    length = results["length_sweep"]
    assert length["baseline"]["best"] == 1536 and length["relay"]["best"] == 3072
    assert length["relay"]["refined"] == []  # lengths are not refined
    assert {w: s["best"] for w, s in results["window_sensitivity"].items()} == {"30": 2048, "200": 4096}


def test_each_mix_is_swept_in_turn_and_refined_by_two_geometric_bisections(run):
    results, _, measured = run
    first, second = results["throughput_sweeps"][MIX1], results["throughput_sweeps"][MIX2]
    # 11 passes and 16 fails for the baseline: sqrt(11·16) = 13.3 fails, sqrt(11·13.3) = 12.1 passes.
    assert (first["baseline"]["best"], first["baseline"]["refined"]) == (12.1, [13.3, 12.1])
    # 32 passes and 45 fails for RelayGR: 37.9 passes, sqrt(37.9·45) = 41.3 fails.
    assert (first["relay"]["best"], first["relay"]["refined"]) == (37.9, [37.9, 41.3])
    assert results["throughput_ratio"] == first["ratio"] == round(37.9 / 12.1, 3)
    assert (second["baseline"]["best"], second["relay"]["best"]) == (4.9, 8.7)
    assert results["throughput_ratios"] == {MIX1: round(37.9 / 12.1, 3), MIX2: round(8.7 / 4.9, 3)}
    modes = ("baseline", "relay")
    for slo_ms in (139.4, 100.0, 69.7):  # the SLO multiples 4, 2.87 and 2 u, the largest first
        sweep = [m[0] for m in measured if m[1] == MIX1 and m[4] == 0.0 and m[5] == 0 and m[6] == slo_ms]
        assert sweep or slo_ms == 69.7  # at 2 u every first seed was measured before (reused)
        turns = 2 * min(sweep.count("baseline"), sweep.count("relay"))
        assert sweep[:turns] == ["baseline", "relay"] * (turns // 2)  # one point of each mode in turn
    on_mix1 = [m[6] for m in measured if m[1] == MIX1 and m[4] == 0.0 and m[0] in modes]
    assert on_mix1.index(100.0) > max(i for i, slo in enumerate(on_mix1) if slo == 139.4)


def test_the_first_mix_has_a_capacity_at_each_slo_multiple_reusing_the_points_measured(run):
    results, _, measured = run
    first = results["throughput_sweeps"][MIX1]
    assert results["host_unit"] == {
        "u_ms": results["floor"][4]["full_ms"], "length": 2048, "model_preset": "cpu-small", "slo_u": 2.87,
        "relay_window_u": 2.87, "slo_ms": 100.0, "relay_window_ms": 100.0, "slo_multiples": [2.0, 2.87, 4.0],
    }  # fmt: skip
    assert results["floor"][4]["prefix_length"] == 2048
    assert results["configuration"]["slo_ms"] == results["configuration"]["relay_window_ms"] == 100.0
    capacity = first["capacity"]
    assert set(capacity) == {"2", "4"}
    # At 2 u (69.7 ms) a load above 0.7 L fails (80 ms): the baseline's 11 and RelayGR's 32 do.
    two = capacity["2"]
    assert (two["slo_ms"], two["baseline"]["best"], two["baseline"]["first_failure"]) == (69.7, 8, 11)
    assert (two["relay"]["best"], two["relay"]["first_failure"]) == (23, 32)
    assert two["ratio"] == round(23 / 8, 3) and two["ratio_interval"] == [round(23 / 11, 3), 4.0]
    # At 4 u (139.4 ms) the grid alone: 11 and 32 pass (their one slow request of 100 is not the P99).
    four = capacity["4"]
    assert (four["baseline"]["best"], four["baseline"]["first_failure"]) == (11, 16)
    assert (four["relay"]["best"], four["relay"]["first_failure"]) == (32, 45)
    assert four["baseline"]["refined"] == four["relay"]["refined"] == []

    # The 2 u sweeps search no load below the lowest the larger multiples measured.
    def lowest(*sweeps: dict) -> float:
        return min(point["rate"] for sweep in sweeps for point in sweep["points"])

    larger = (four["baseline"], four["relay"], first["baseline"], first["relay"])
    assert lowest(two["baseline"], two["relay"]) >= lowest(*larger)
    # No point was measured twice: each SLO's sweep reused the points the larger ones measured.
    first_mix = [(*m[:6], m[7]) for m in measured if m[1] == MIX1 and m[4] == 0.0 and m[6] != math.inf]
    assert len(first_mix) == len(set(first_mix))


def test_each_load_takes_the_seeds_its_verdict_needs_and_pools_them(run):
    results, _, measured = run
    sweeps = [((mode, label, 0.0), mix[mode]) for label, mix in results["throughput_sweeps"].items()
              for mode in ("baseline", "relay")]  # fmt: skip
    sweeps += [((mode, MIX1, float(share)), entry["sweeps"][mode])
               for share, entry in results["abandonment"]["fractions"].items() if entry["sweeps"]
               for mode in ("baseline", "relay")]  # fmt: skip
    sweeps += [((mode, MIX1, 0.0), sweep) for mode, sweep in results["ablations"]["sweeps"].items()]
    tags = {id(sweep): mode for mode, sweep in results["ablations"]["sweeps"].items() if mode != "no-revisit"}
    beside = results["ablations"]["relay_beside"]
    sweeps += [(("relay", MIX1, 0.0), sweep) for sweep in beside.values()]
    tags |= {id(sweep): mode for mode, sweep in beside.items()}
    for key, sweep in sweeps:
        for point in sweep["points"]:
            verdict, limit = point["verdict"], LOAD_LIMITS[key]
            assert len(verdict["seeds"]) == seeds_by_rule(point["rate"], limit), (key, point["rate"])
            assert verdict["meets_slo"] == (point["rate"] <= limit)
            assert verdict["requests"] == 100 * len(verdict["seeds"])
            assert [p["seed"] for p in verdict["points"]] == verdict["seeds"][1:]
    relay = {p["rate"]: p["verdict"] for p in results["throughput_sweeps"][MIX1]["relay"]["points"]}
    # 37.9 is within 0.9 L of RelayGR's 40: one slow request a seed, its interval holding the SLO at every
    # pooled size up to the cap; the pooled P99, 40 ms (the 495th of 500), passes it.
    assert (relay[37.9]["seeds"], relay[37.9]["decided"], relay[37.9]["meets_slo"]) == (
        [0, 1, 2, 3, 4],
        False,
        True,
    )
    assert relay[37.9]["rank_p99_ms"] == 40.0 and relay[37.9]["rank_p99_ci_ms"][1] == 400.0
    # 41.3 is within 1.1 L: four slow a seed; at 99 % a look (5 looks), three seeds' interval lies above
    # the SLO.
    assert (relay[41.3]["seeds"], relay[41.3]["decided"], relay[41.3]["meets_slo"]) == (
        [0, 1, 2],
        True,
        False,
    )
    assert relay[41.3]["rank_p99_ms"] == relay[41.3]["rank_p99_ci_ms"][0] == 400.0
    assert relay[32]["seeds"] == [0] and relay[32]["decided"] and relay[45]["seeds"] == [0]
    lengths = results["length_sweep"]["relay"]["points"]
    assert all(p["verdict"]["seeds"] == [0] and p["verdict"]["decided"] for p in lengths)
    # Every seed measured was one the rule asked for, and no verdict point was measured again (the first
    # mix's sweeps at the other SLO multiples and its edge pairs reuse them).
    asked = {(key[0], key[1], p["rate"], key[2], k, tags.get(id(sweep), "")) for key, sweep in sweeps
             for p in sweep["points"] for k in p["verdict"]["seeds"][1:]}  # fmt: skip
    for multiple in results["throughput_sweeps"][MIX1]["capacity"].values():
        asked |= {(mode, MIX1, p["rate"], 0.0, k, "") for mode in ("baseline", "relay")
                  for p in multiple[mode]["points"] for k in p["verdict"]["seeds"][1:]}  # fmt: skip
    judged = [(m[0], m[1], m[2], m[4], m[5], m[7]) for m in measured if m[5] > 0 and m[6] != math.inf]
    assert sorted(judged) == sorted(asked)
    assert all(sweep["repeats"] == [] and sweep["seeds_agree"] is None for _, sweep in sweeps)


def test_each_edge_is_bracketed_and_each_ratio_has_the_brackets_interval(run):
    results, _, _ = run
    first, second = results["throughput_sweeps"][MIX1], results["throughput_sweeps"][MIX2]
    # Brackets: [best, the lowest failure above it).
    assert (first["baseline"]["best"], first["baseline"]["first_failure"]) == (12.1, 13.3)
    assert (first["relay"]["best"], first["relay"]["first_failure"]) == (37.9, 41.3)
    # [RelayGR's best / the baseline's failure, RelayGR's failure / the baseline's best].
    assert first["ratio_interval"] == [round(37.9 / 13.3, 3), round(41.3 / 12.1, 3)] == [2.85, 3.413]
    # Second mix: 4 passes, 6 fails, 4.9 passes, 5.4 fails; 8 passes, 11 fails, 9.4 fails, 8.7 passes.
    assert (second["baseline"]["first_failure"], second["relay"]["first_failure"]) == (5.4, 9.4)
    assert second["ratio_interval"] == [round(8.7 / 5.4, 3), round(9.4 / 4.9, 3)] == [1.611, 1.918]
    # Lengths, not refined: baseline [1536, 2048), RelayGR [3072, 4096).
    assert results["length_ratio_interval"] == [1.5, round(4096 / 1536, 3)]
    zero, tenth = results["abandonment"]["fractions"]["0"], results["abandonment"]["fractions"]["0.1"]
    assert zero["ratio_interval"] == first["ratio_interval"]
    assert tenth["ratio_interval"] == [round(34.8 / 14.6, 3), round(37.9 / 13.3, 3)]
    # admit-all (limit 45): 45 passes, 64 fails, 53.7 and 49.2 fail.
    admit_all = results["ablations"]["sweeps"]["admit-all"]
    assert (admit_all["best"], admit_all["first_failure"]) == (45, 49.2)


def test_abandonment_sweeps_both_modes_and_counts_relays_wasted_pre_inference(run):
    results, _, measured = run
    fractions = results["abandonment"]["fractions"]
    assert list(fractions) == ["0", "0.1", "0.3"]
    zero = fractions["0"]
    assert zero["sweeps"] is None and (zero["baseline_best"], zero["relay_best"]) == (12.1, 37.9)
    assert zero["wasted_pre_infer_s"] == 0.0 and zero["wasted_share"] == 0.0
    # 0.1: 11 passes, 13.3 passes, 14.6 fails; 32 passes, 37.9 fails, 34.8 passes.
    assert (fractions["0.1"]["baseline_best"], fractions["0.1"]["relay_best"]) == (13.3, 34.8)
    # 0.3: 16 passes, 23 fails, 19.2 and 17.5 fail; 32 fails, 23 passes, 27.1 and 29.4 pass.
    assert (fractions["0.3"]["baseline_best"], fractions["0.3"]["relay_best"]) == (16, 29.4)
    assert fractions["0.3"]["ratio"] == round(29.4 / 16, 3)
    relay_points = [m for m in measured if m[4] == 0.3 and m[0] == "relay"]
    all_points = [m for m in measured if m[4] == 0.3]
    wasted = WASTED_S_PER_POINT * 0.3 * len(relay_points)
    assert fractions["0.3"]["wasted_pre_infer_s"] == pytest.approx(wasted)
    # Device time counted on RelayGR's fleet only: 10 s per RelayGR point.
    assert fractions["0.3"]["wasted_share"] == pytest.approx(round(wasted / (10.0 * len(relay_points)), 4))
    point_of = fractions["0.3"]["sweeps"]["relay"]["points"][0]
    assert point_of["abandoned"] == 30 and point_of["measured"] == 130 and len(all_points) > len(relay_points)


def test_every_ablation_is_swept_from_relays_best(run):
    results, _, measured = run
    ablations = results["ablations"]
    assert ablations["rate"] == 32.0  # the grid load at or below RelayGR's best, 37.9
    bests = {name: sweep["best"] for name, sweep in ablations["sweeps"].items()}
    assert bests == {
        "no-revisit": 17.5, "admit-all": 45, "dram-only": 19.2, "no-affinity": 29.4, "no-dram": 25.0,
    }  # fmt: skip
    first_loads = {}
    for mode, label, rate, *_ in measured:
        if mode in bests and label == MIX1:
            first_loads.setdefault(mode, rate)
    assert first_loads == dict.fromkeys(bests, 32.0)  # the grid value at or below RelayGR's best
    assert set(results["modes"]) == {"baseline", "relay", *bests}


def test_each_ablation_on_a_fleet_of_its_own_is_compared_with_relay_measured_beside_it(run):
    """The machine's speed drifts over a run: an ablation's fresh fleet, swept last, is swept in turns with
    RelayGR's fleet on users of their own (the pair's tag), and the comparisons take that sweep."""
    results, _, measured = run
    ablations = results["ablations"]
    own_fleet = {"admit-all", "dram-only", "no-affinity", "no-dram"}
    assert set(ablations["relay_beside"]) == own_fleet
    for mode in own_fleet:
        pair = [(m[0], m[2], m[5]) for m in measured if m[7] == mode]
        relay = [(rate, k) for who, rate, k in pair if who == "relay"]
        assert relay and [(rate, k) for who, rate, k in pair if who == mode]
        # One load seed of each in turn: while both sweeps run, neither measures twice in a row.
        both_running = pair[: 2 * min(len(relay), len(pair) - len(relay))]
        assert all(a[0] != b[0] for a, b in itertools.pairwise(both_running))
        assert ablations["relay_beside"][mode]["points"][0]["rate"] == 32.0  # from RelayGR's best
        assert ablations["relay_beside"][mode]["best"] == 37.9
    # Tagged points are new users: none of the untagged sweeps' points was taken for them.
    assert all(m[0] in own_fleet | {"relay"} for m in measured if m[7])
    run_ = Run.from_json(results)
    mix = run_.first_mix[1]
    assert (
        run_.measured.ablations.relay_for("admit-all", mix.relay)
        is run_.measured.ablations.relay_beside["admit-all"]
    )
    assert run_.measured.ablations.relay_for("no-revisit", mix.relay) is mix.relay


def test_the_results_render_and_the_summary_names_every_ratio(run, tmp_path):
    # results.json as the run wrote it reads back as the same run.
    results = Run.from_json(run[0])
    assert results.to_json() == run[0]
    report.write(results, tmp_path)
    modes = {"relay", "admit-all", "dram-only", "no-affinity", "no-dram", "no-revisit"}
    assert set(hit_rate_points(results)) == modes  # each measured at the ablations' rate
    markdown = (tmp_path / "report.md").read_text()
    assert "| dram-only | 19.2 | x1.59 |" in markdown and "| 10% | 12.1 | 37.9 |" not in markdown
    assert "| 10% | 13.3 | 34.8 | x2.62 |" in markdown
    # No checks are taken (the floor at both ends is recorded); the brackets, the ratios' intervals and
    # the pooled verdicts at the brackets.
    assert results.checks is None and "Checks:" not in markdown
    assert results.measured.floor_end == results.measured.floor == FLOOR
    assert f"| load (req/s) on `{MIX1}` | [12.1, 13.3) | [37.9, 41.3) | x3.13 | x2.85 to x3.41 |" in markdown
    assert "| length (events) at 8 req/s | [1536, 2048) | [3072, 4096) | x2.00 | x1.50 to x2.67 |" in markdown
    undecided = "| meets | **no** (undecided at the seed cap (the pooled P99 decided)) |"
    assert (
        f"| relay on `{MIX1}` | best | 37.9 | 0, 1, 2, 3, 4 | 500 | 40.0 [40.0, 400.0] {undecided}"
        in markdown
    )
    assert (
        f"| relay on `{MIX1}` | first failure | 41.3 | 0, 1, 2 | 300 | 400.0 [400.0, 400.0] | fails | yes |"
        in markdown
    )
    # What stopped each mode: what the Ranks over the SLO were at the first failing load, pooled over
    # its three seeds (each seed's 100 calls, 0.024 s apart, all over the SLO, in one burst).
    assert (
        "other users of the machine 0.10. Over the SLO: 300 of its 300 Ranks (3 load seeds); their prefixes "
        "from hbm 300; mean wait for an in-flight prefix 0.0 ms; 0% of their long-term events computed on "
        "the critical path; in 3 bursts, the largest of 100. 0 Ranks" in markdown
    )
    assert "| meets (5 seeds, undecided) |" in markdown and "| fails (3 seeds) |" in markdown
    line = summary(results)
    assert f"throughput ratios {MIX1} {round(37.9 / 12.1, 3)} in [2.85, 3.413] (37.9 vs 12.1 req/s)" in line
    assert "length ratio 2.0 in [1.5, 2.667] (3072 vs 1536 events at 8 req/s, relay window 100 ms)" in line
    abandoned = f"0% {round(37.9 / 12.1, 3)} in [2.85, 3.413], 10% {round(34.8 / 13.3, 3)} in [2.384, 2.85], "
    assert abandoned + f"30% {round(29.4 / 16, 3)} in [1.68, 2.0]" in line
    assert not math.isnan(results.duration_s)


def test_a_smaller_multiple_searches_no_load_below_those_measured_before(monkeypatch):
    """The baseline's fast Ranks take 80 ms at every load of the first mix: it fails 2 u (69.7 ms)
    everywhere, and its 2 u sweep stops at the lowest load the larger multiples measured."""
    module = sys.modules[__name__]
    real = module.latencies

    def slow_baseline(rate: float, limit: float) -> list[float]:
        samples = real(rate, limit)
        return [80.0 if ms == 40.0 else ms for ms in samples] if limit == 13 else samples

    monkeypatch.setattr(module, "latencies", slow_baseline)
    results, _, _ = fake_run(CONFIG)
    first = results["throughput_sweeps"][MIX1]
    two = first["capacity"]["2"]["baseline"]
    before = min(p["rate"] for sweep in (first["capacity"]["4"]["baseline"], first["baseline"])
                 for p in sweep["points"])  # fmt: skip
    assert two["best"] is None and two["first_failure"] == before
    assert min(p["rate"] for p in two["points"]) == before > CONFIG.load_grid()[0]
