"""A whole benchmark run over fake fleets: every mode's limits are known, so the run's order, its sweeps
(refinements, repeats, abandonment, ablations) and its results (rendered by the real report) are checked
against values worked out by hand."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from bench import experiments, probes, record, report
from bench.config import BenchConfig
from bench.experiments import Bench, Plan
from bench.schema import CachedRankPoint, FloorPoint, Machine, Point, Run, Versions
from bench.workload import Universe
from relaygr.v1 import common_pb2
from tests.bench.synthetic import point_of

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
    monkeypatch = pytest.MonkeyPatch()
    started: list[str] = []
    counters: dict[str, dict[str, Any]] = {}
    measured: list[tuple] = []

    def fake_point(self: Bench, plan: Plan, universe: Universe, rate: float, seed_index: int = 0) -> Point:
        mode = plan.fleet.mode.name if plan.revisits else "no-revisit"
        measured.append((mode, universe.label, rate, plan.delay_ms, plan.abandon_fraction, seed_index))
        if universe.label.startswith("L"):
            passes = int(universe.label[1:]) <= LENGTH_LIMITS[mode, plan.delay_ms]
            extra = {"long_term": int(universe.label[1:]), "delay_ms": plan.delay_ms}
        else:
            # RelayGR's best on the first mix fails with the third load seed: the seeds disagree there.
            unlucky = (mode, universe.label, plan.abandon_fraction, seed_index) == ("relay", MIX1, 0.0, 2)
            passes = rate <= LOAD_LIMITS[mode, universe.label, plan.abandon_fraction] - 3 * unlucky
            extra = {}
        fleet_counters = counters[plan.fleet.url]
        fleet_counters["device_s"]["rank"] += 10.0
        if plan.fleet.mode.relay:
            fleet_counters["pre_infer_wasted_s"] += WASTED_S_PER_POINT * plan.abandon_fraction
        abandoned = round(100 * plan.abandon_fraction)
        source = common_pb2.CACHE_SOURCE_HBM if plan.fleet.mode.relay else common_pb2.CACHE_SOURCE_MISS
        return point_of(Point, rate, 40.0 if passes else 400.0, source, abandoned, seed=seed_index, **extra)

    def fake_snapshot(pids: dict, metrics: dict) -> dict:
        rankers = {}
        for url in metrics.values():
            probes._add(rankers, counters[url])
        return {"at": 0.0, "machine_busy_s": 0.0, "cpu_s": {}, "rankers": rankers}

    floor = [
        FloorPoint(prefix_length=n, full_ms=n / 10, pre_infer_ms=n / 40, rank_ms=2.0)
        for n in CONFIG.length_grid()
    ]
    monkeypatch.setattr(experiments, "model_floor", lambda *args: floor)
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
    monkeypatch.setattr(Bench, "point", fake_point)
    monkeypatch.setattr(Bench, "fleet", lambda self, mode: FakeFleet(mode, started, counters))
    try:
        bench = Bench(CONFIG, log_dir=None, log=lambda line: None)
        machine = Machine(cores=2, cpu_model="x", memory_gib=8.0, platform="x", python="x")
        results = record.assemble(
            CONFIG, bench.run(), "2026-01-01T00:00:00+00:00", 3600.0, machine,
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
    sweep = [m[0] for m in measured if m[1] == MIX1 and m[4] == 0.0 and m[5] == 0 and m[0] in modes]
    turns = 2 * min(sweep.count("baseline"), sweep.count("relay"))
    assert sweep[:turns] == ["baseline", "relay"] * (turns // 2)  # one point of each mode in turn


def test_the_verdict_points_are_measured_again_with_the_other_seeds_and_a_disagreement_is_reported(run):
    results, _, measured = run
    relay = results["throughput_sweeps"][MIX1]["relay"]
    best, failure = relay["repeats"]
    assert (best["role"], best["rate"], best["seeds"]) == ("best", 37.9, [0, 1, 2])
    assert best["meets_slo"] == [True, True, False] and not best["agree"]
    assert best["rank_p99_ms"] == [40.0, 40.0, 400.0] and len(best["points"]) == 2
    assert (failure["role"], failure["rate"], failure["meets_slo"]) == ("first_failure", 41.3, [False] * 3)
    assert relay["seeds_agree"] is False
    assert results["throughput_sweeps"][MIX1]["baseline"]["seeds_agree"] is True
    repeated = [m for m in measured if m[5] > 0]
    assert len(repeated) == 2 * 2 * 2 * 2  # 2 mixes x 2 modes x 2 verdict points x 2 more seeds
    assert {m[0] for m in repeated} == {"baseline", "relay"}  # no ablation or abandonment sweep repeats


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


def test_the_results_render_and_the_summary_names_every_ratio(run, tmp_path):
    # results.json as the run wrote it reads back as the same run.
    results = Run.from_json(run[0])
    assert results.to_json() == run[0]
    report.write(results, tmp_path)
    modes = {"relay", "admit-all", "dram-only", "no-affinity", "no-dram", "no-revisit"}
    assert set(report.hit_rate_points(results)) == modes  # each measured at the ablations' rate
    markdown = (tmp_path / "report.md").read_text()
    assert "| dram-only | 19.2 | x1.59 |" in markdown and "| 10% | 12.1 | 37.9 |" not in markdown
    assert "| 10% | 13.3 | 34.8 | x2.62 |" in markdown
    line = record.summary(results)
    assert f"throughput ratios {MIX1} {round(37.9 / 12.1, 3)} (37.9 vs 12.1 req/s)" in line
    assert "length ratio 2.0 (3072 vs 1536 events at 8 req/s, relay window 100 ms)" in line
    assert f"0% {round(37.9 / 12.1, 3)}, 10% {round(34.8 / 13.3, 3)}, 30% {round(29.4 / 16, 3)}" in line
    assert not math.isnan(results.duration_s)
