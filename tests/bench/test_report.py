"""The report and plots rendered from a run's results alone, and a results file that lacks what they read
refused."""

from __future__ import annotations

import json

import pytest

from bench import report
from bench.lib import codec, envelope
from bench.lib.probes import LOAD_GENERATOR
from bench.lib.schema import Point, Run
from bench.report import __main__ as report_command
from bench.report.figures import cores_needed, cpu_ms_per_request, hit_rate_points, requests_sent
from bench.report.plots import PLOTS
from relaygr.v1 import common_pb2
from tests.bench.synthetic import SLO_MS, point, sweep

HBM, MISS = common_pb2.CACHE_SOURCE_HBM, common_pb2.CACHE_SOURCE_MISS
MIX1, MIX2 = "mix-m512-s1-max2048", "mix-m1536-s1-max4096"


def waste(wasted_s: float, device_s: float) -> dict:
    share = round(wasted_s / device_s, 4) if device_s else None
    tokens = {"consumed": 1000.0, "wasted": 100.0}
    return {
        "wasted_pre_infer_s": wasted_s,
        "device_s": device_s,
        "wasted_share": share,
        "pre_infer_tokens": tokens,
    }


def repeat(role: str, rate: float, p99s: list[float], verdicts: list[bool]) -> dict:
    """A verdict point measured at seeds 0, 1 and 2 (the points of the two repeats kept)."""
    return {
        "role": role,
        "rate": rate,
        "seeds": [0, 1, 2],
        "rank_p99_ms": p99s,
        "rank_p99_ci_ms": [[p - 1, p + 1] for p in p99s],
        "meets_slo": verdicts,
        "agree": len(set(verdicts)) == 1,
        "points": [point(rate, p99s[seed], HBM, seed=seed) for seed in (1, 2)],
    }


CONFIGURATION = dict(
    profile="full", model_preset="cpu-small", rankers=2, torch_threads=1, slo_ms=SLO_MS,
    relay_window_ms=100.0, warmup_s=5.0, revisit_probability=0.5, revisit_window_s=5.0,
    lengths="1024,2048,4096", loads="4,8,16,32", max_error_fraction=0.001, short_term=16, mix_median=512,
    mix_sigma=1.0, mix_max=2048, mix2_median=1536, mix2_max=4096,
)  # fmt: skip
MACHINE = {"cores": 2, "cpu_model": "test CPU", "memory_gib": 8.0, "platform": "Linux", "python": "3"}
PROFILE = {
    "measured": 100, "floor_repeats": 1, "cached_rank_iterations": 1, "window_delays_ms": [200.0],
    "refine_steps": 2, "seeds": 3,
}  # fmt: skip
FLEET = {
    "rankers": 2, "model_preset": "cpu-small", "hbm_budget_mb": 256.0, "dram_budget_mb": 1024.0,
    "slo_ms": SLO_MS, "ranker_args": "", "max_long_term": 4096, "stub_args": "", "startup_timeout_s": 60.0,
}  # fmt: skip


def fraction(share, sweeps, baseline_best, relay_best, ratio, wasted) -> dict:
    return {
        "fraction": share,
        "sweeps": sweeps,
        "baseline_best": baseline_best,
        "relay_best": relay_best,
        "ratio": ratio,
        **wasted,
    }


def results() -> dict:
    floor = [
        {"prefix_length": n, "full_ms": n / 10, "pre_infer_ms": n / 20, "rank_ms": 2.0}
        for n in (1024, 2048, 4096)
    ]
    base_length = [point(8, 50, MISS, long_term=1024), point(8, 150, MISS, long_term=2048)]
    relay_length = [point(8, 20, HBM, long_term=2048), point(8, 300, HBM, long_term=4096)]
    relay_mix1 = sweep(
        [point(16, 30, HBM), point(32, 130, HBM), point(22.6, 60, HBM)],
        22.6,
        refined=[22.6],
        repeats=[repeat("best", 22.6, [60, 70, 120], [True, True, False])],
        seeds_agree=False,
    )
    abandoned_relay = sweep([point(16, 40, HBM, abandoned=30), point(23, 150, HBM, abandoned=30)], 16)
    abandoned_base = sweep([point(4, 50, MISS, abandoned=30), point(6, 150, MISS, abandoned=30)], 4)
    return {
        "name": "unit",
        "throughput_ratio": 5.65,
        "throughput_ratios": {MIX1: 5.65, MIX2: 2.0},
        "length_ratio": 2.0,
        "started_at": "2026-01-01T00:00:00+00:00",
        "duration_s": 300.0,
        "machine": MACHINE,
        "versions": {"torch": "2.x", "git_commit": "abc1234"},
        "configuration": CONFIGURATION,
        "profile": PROFILE,
        "floor": floor,
        "cached_rank": [
            {
                "prefix_length": 2048,
                "request_kib": 40.0,
                "serialize_ms": 0.1,
                "rank_ms_p50": 6.0,
                "rank_ms_p99": 9.0,
                "sources": {"hbm": 20},
            }
        ],
        "length_sweep": {
            "rate": 8.0,
            "baseline": sweep(base_length, 1024),
            "relay": sweep(relay_length, 2048),
        },
        "throughput_sweeps": {
            MIX1: {
                "universe": MIX1,
                "max_long_term": 2048,
                "baseline": sweep([point(4, 40, MISS), point(8, 120, MISS)], 4, seeds_agree=True),
                "relay": relay_mix1,
                "ratio": 5.65,
                **waste(2.0, 100.0),
            },
            MIX2: {
                "universe": MIX2,
                "max_long_term": 4096,
                "baseline": sweep([point(2, 40, MISS), point(4, 120, MISS)], 2),
                "relay": sweep([point(4, 30, HBM), point(8, 130, HBM)], 4),
                "ratio": 2.0,
                **waste(1.0, 50.0),
            },
        },
        "abandonment": {
            "universe": MIX1,
            "fractions": {
                "0": fraction(0.0, None, 4, 22.6, 5.65, waste(2.0, 100.0)),
                "0.3": fraction(
                    0.3, {"baseline": abandoned_base, "relay": abandoned_relay}, 4, 16, 4.0, waste(12.5, 50.0)
                ),
            },
        },
        "window_sensitivity": {"200": sweep([point(8, 60, HBM, long_term=4096)], 4096)},
        "ablations": {
            "universe": MIX1,
            "rate": 22.6,
            "sweeps": {
                "admit-all": sweep([point(22.6, 20, HBM), point(32, 90, HBM)], 32),
                "no-dram": sweep([point(22.6, 140, MISS), point(16, 60, MISS)], 16),
                "no-revisit": sweep([point(22.6, 110, MISS), point(16, 140, MISS)], None),
            },
        },
        "modes": {
            "relay": {"name": "relay", "description": "RelayGR"},
            "no-revisit": {"name": "no-revisit", "description": "no request revisits a user"},
        },
        "fleet": FLEET,
        "mix_universes": [
            {"label": MIX1, "stub_args": [], "max_long_term": 2048},
            {"label": MIX2, "stub_args": [], "max_long_term": 4096},
        ],
    }


def run(data: dict | None = None) -> Run:
    """The run a results dictionary holds (`results()` by default)."""
    return Run.from_json(results() if data is None else data)


def section(markdown: str, title: str) -> str:
    return markdown.split(f"## {title}")[1].split("\n## ")[0]


def test_results_json_holds_the_ratios_machine_and_points_and_the_report_and_plots_are_written(tmp_path):
    report.write(run(), tmp_path)
    written = envelope.read(tmp_path / "results.json", "run")
    assert written["throughput_ratio"] == 5.65 and written["throughput_ratios"][MIX2] == 2.0
    assert written["machine"]["cpu_model"] == "test CPU"
    assert written["length_sweep"]["relay"]["points"][0]["rank_ms"]["p99"] == 20.0
    markdown = (tmp_path / "report.md").read_text()
    assert "only the ratios between the modes are meaningful" in markdown
    headline = section(markdown, "Headline")
    assert "| 1024 | 2048 | x2.00 |" in headline
    assert f"on the mix `{MIX1}` | 4 | 22.6 | x5.65 |" in headline
    assert f"on the mix `{MIX2}` | 2 | 4 | x2.00 |" in headline
    # What stopped RelayGR's length sweep is named from its first failing point, against the floor.
    assert "- Length, relay: at 4096 events the ranking P99 was 300.0 ms" in markdown
    assert "pre-inferring 4096 events takes 205 ms, against a relay window of 100 ms" in markdown
    assert f"- Throughput on `{MIX2}`, relay: at 8 req/s the ranking P99 was 130.0 ms" in markdown
    assert "| 200 | 4096 | x4.00 |" in markdown  # the window sensitivity table
    for name in PLOTS.values():
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")


def test_each_mix_has_a_results_table_with_every_mode_its_best_and_its_p99_interval():
    markdown = report.render_markdown(run())
    first = markdown.split(f"### Mix `{MIX1}`")[1].split("### Mix")[0]
    # Every point's 100 calls took the same time: the interval is that time at both ends.
    assert "| relay | 22.6 | x5.65 | 60.0 [60.0, 60.0] | 32 | 130.0 [130.0, 130.0] | **no** |" in first
    assert "| baseline | 4 | x1.00 | 40.0 [40.0, 40.0] | 8 | 120.0 [120.0, 120.0] | yes |" in first
    assert "| admit-all | 32 | x8.00 | 90.0 [90.0, 90.0] |  |  |  |" in first
    assert "| no-revisit | none | n/a |  | 16 | 140.0 [140.0, 140.0] |  |" in first
    assert "| 22.6 (refined) | 100/100 |" in first  # RelayGR's refined point in its sweep table
    assert "| relay | best | 22.6 | 0, 1, 2 | 60.0, 70.0, 120.0 | meets, meets, fails | **no** |" in first
    second = markdown.split(f"### Mix `{MIX2}`")[1].split("\n## ")[0]
    assert "| relay | 4 | x2.00 |" in second and "admit-all" not in second


def test_the_abandonment_table_has_both_bests_the_ratio_and_the_wasted_device_time():
    markdown = report.render_markdown(run())
    abandonment = section(markdown, "Abandonment: pre-inference that no Rank consumes")
    assert "| 0% | 4 | 22.6 | x5.65 | 2.0 | 2.0% |" in abandonment
    assert "| 30% | 4 | 16 | x4.00 | 12.5 | 25.0% |" in abandonment
    assert "**relay, 30% abandoned**" in abandonment
    assert "| 16 | 130/130 (30 abandoned) | 40.0 | 40.0 [40.0, 40.0] |" in abandonment


def test_the_ablations_compare_every_mode_measured_at_relays_best_load():
    ablations = section(report.render_markdown(run()), "Experiment 4: ablations and hit rates by tier")
    rows = [line for line in ablations.splitlines() if line.startswith(("| relay ", "| admit-all", "| no-"))]
    assert [row.split(" | ")[0] for row in rows] == ["| relay", "| admit-all", "| no-dram", "| no-revisit"]
    assert "`no-revisit`: no request revisits a user" in ablations
    assert set(hit_rate_points(run())) == {"relay", "admit-all", "no-dram", "no-revisit"}


def test_a_result_without_a_headline_ratio_or_a_point_field_is_refused_naming_where():
    incomplete = results()
    del incomplete["throughput_ratios"]
    with pytest.raises(ValueError, match="results: the top level lacks throughput_ratios"):
        run(incomplete)
    broken = results()
    del broken["throughput_sweeps"][MIX1]["relay"]["points"][0]["cost"]
    with pytest.raises(ValueError, match=rf"throughput_sweeps\.{MIX1}\.relay\.points\.0 lacks cost"):
        run(broken)
    no_interval = results()
    del no_interval["abandonment"]["fractions"]["0.3"]["sweeps"]["relay"]["points"][1]["rank_p99_ci_ms"]
    with pytest.raises(ValueError, match=r"fractions\.0\.3\.sweeps\.relay\.points\.1 lacks rank_p99_ci_ms"):
        run(no_interval)
    repeat_point = results()
    del repeat_point["throughput_sweeps"][MIX1]["relay"]["repeats"][0]["points"][0]["abandoned"]
    with pytest.raises(ValueError, match=r"relay\.repeats\.0\.points\.0 lacks abandoned"):
        run(repeat_point)
    no_waste = results()
    del no_waste["abandonment"]["fractions"]["0"]["wasted_share"]
    with pytest.raises(ValueError, match=r"abandonment\.fractions\.0 lacks wasted_share"):
        run(no_waste)
    unknown = results()
    unknown["length_sweep"]["relay"]["points"][0]["p99"] = 1.0
    with pytest.raises(ValueError, match=r"length_sweep\.relay\.points\.0 has unknown p99"):
        run(unknown)
    no_mix = results()
    no_mix["throughput_sweeps"] = {}
    with pytest.raises(ValueError, match="throughput_sweeps has no mix"):
        run(no_mix)


def test_a_baseline_that_met_the_slo_nowhere_gives_a_lower_bound_not_a_missing_ratio():
    measured = results()
    mix2 = measured["throughput_sweeps"][MIX2]
    mix2["baseline"] = sweep([point(1, 150, MISS), point(2, 160, MISS)], None)
    mix2["ratio"] = measured["throughput_ratios"][MIX2] = None
    headline = section(report.render_markdown(run(measured)), "Headline")
    assert (
        f"on the mix `{MIX2}` | none | 4 | > x4.00 (the baseline met the SLO nowhere; it failed even at 1 "
        "req/s) |" in headline
    )


def test_relay_is_set_against_dram_only_and_against_admit_all_at_every_load_admit_all_met_the_slo():
    measured = results()
    measured["ablations"]["sweeps"]["dram-only"] = sweep(
        [point(22.6, 140, MISS), point(16, 110, MISS), point(11.3, 80, MISS)], 11.3
    )
    text = section(
        report.render_markdown(run(measured)),
        "RelayGR against the strongest no-relay serving and against admitting",
    )
    assert "met the SLO up to 11.3 req/s, RelayGR up to 22.6 req/s: x2.00." in text
    # admit-all met the SLO at 22.6 and 32: RelayGR meets at 22.6, and fails at 32 outside admit-all's
    # interval.
    assert "| 22.6 | 20.0 [20.0, 20.0] | 60.0 [60.0, 60.0] | meets | yes |" in text
    assert "| 32 | 90.0 [90.0, 90.0] | 130.0 [130.0, 130.0] | fails | **no** |" in text
    # A RelayGR failure whose interval reaches into admit-all's is noise, not a loss.
    relay_32 = next(p for p in measured["throughput_sweeps"][MIX1]["relay"]["points"] if p["rate"] == 32)
    relay_32["rank_p99_ci_ms"] = [85.0, 140.0]
    text = section(report.render_markdown(run(measured)), "RelayGR against the strongest no-relay serving")
    assert "| 32 | 90.0 [90.0, 90.0] | 130.0 [85.0, 140.0] | fails | yes |" in text


def costly_point(rate: float, rank_ms: float) -> dict:
    """A point whose cost splits 3.1 s of CPU between every service of the fleet over 6.2 s."""
    found = point(rate, rank_ms, HBM)
    found["cost"] = {
        "cpu_s": {
            "ranker-0": 0.3, "ranker-1": 0.2, "router": 0.4, "trigger": 0.3, "retrieval-stub": 0.8,
            "retrieval-stub-mix-m512-s1-max2048-d100-a0": 0.1, LOAD_GENERATOR: 1.0,
        },
        "rankers": {},
        "wall_s": 6.2,
        "foreign_cores": 0.25,
    }  # fmt: skip
    return found


def test_cpu_per_request_is_each_services_cpu_over_every_request_the_point_sent_warm_up_included():
    measured = run()
    busy = codec.from_json(
        Point, costly_point(180, 30)
    )  # 5 s of warm-up at 180 req/s: 900 requests, then 100 measured
    assert requests_sent(measured, busy) == 1000
    per_request = cpu_ms_per_request(measured, busy)
    assert per_request == pytest.approx({
        "rankers": 0.5, "router": 0.4, "trigger": 0.3, "retrieval stub": 0.9, "load generator": 1.0,
        "total": 3.1,
    })  # fmt: skip
    assert cores_needed(measured, busy) == pytest.approx(0.558)  # 3.1 ms x 180 req/s
    # The synthetic cost: 6 s (5 of them the rankers') over 4 req/s x 5 s of warm-up + 100 measured.
    synthetic = codec.from_json(Point, point(4, 40, MISS))
    assert cpu_ms_per_request(measured, synthetic)["total"] == pytest.approx(50.0)


def test_each_mix_shows_cpu_per_request_and_the_machines_ceiling_at_every_modes_best_load():
    measured = results()
    measured["throughput_sweeps"][MIX1]["relay"] = sweep([costly_point(180, 30), point(200, 130, HBM)], 180)
    markdown = report.render_markdown(run(measured))
    first = markdown.split(f"### Mix `{MIX1}`")[1].split("### Mix")[0]
    assert (
        "| mode | best load req/s | requests (warm-up included) | rankers ms | router ms (target ≤ 0.6) | "
        "trigger ms (target ≤ 0.4) | retrieval stub ms (target ≤ 1) | load generator ms | total ms |" in first
    )
    assert "| relay | 180 | 1000 | 0.50 | 0.40 | 0.30 | 0.90 | 1.00 | 3.10 |" in first
    assert "| baseline | 4 | 120 | 41.67 | 8.33 | 0.00 | 0.00 | 0.00 | 50.00 |" in first
    assert "| no-revisit | none |  |  |  |  |  |  |  |" in first
    # 0.558 of the 2 cores needed (0.50 used over the point's 6.2 s), 0.25 foreign: 40.4% of the machine.
    assert "The machine's ceiling (2 cores)" in first
    assert "| relay | 180 | 3.10 | 0.56 | 27.9% | 0.50 | 0.25 | 40.4% |" in first
    assert "| baseline | 4 | 50.00 | 0.20 | 10.0% | 0.60 | 0.25 | 22.5% |" in first
    second = markdown.split(f"### Mix `{MIX2}`")[1].split("\n## ")[0]
    assert "| baseline | 2 | 110 | 45.45 | 9.09 | 0.00 | 0.00 | 0.00 | 54.55 |" in second
    assert "| relay | 4 | 50.00 | 0.20 | 10.0% | 0.60 | 0.25 | 22.5% |" in second


def test_a_run_that_did_not_record_its_cores_gives_its_ceiling_as_unknown():
    measured = results()
    measured["machine"] = {**MACHINE, "cores": None}
    markdown = report.render_markdown(run(measured))
    assert "The machine's ceiling (unknown cores)" in markdown
    assert "5.0 minutes on unknown cores" in markdown
    # 6 s of CPU over 113 warm-up requests (22.6 req/s x 5 s) and 100 measured: 28.17 ms, 0.64 cores.
    assert "| relay | 22.6 | 213 | 23.47 | 4.69 | 0.00 | 0.00 | 0.00 | 28.17 |" in markdown
    assert "| relay | 22.6 | 28.17 | 0.64 | n/a | 0.60 | 0.25 | n/a |" in markdown


def test_the_report_command_renders_a_runs_report_again_and_leaves_its_results_as_they_were(tmp_path):
    written = json.dumps(envelope.wrap("run", results()), indent=2)  # not as `Run.write` writes it
    (tmp_path / "results.json").write_text(written)
    report_command.main(["--results-dir", str(tmp_path), "--plots", "false"])
    assert (tmp_path / "results.json").read_text() == written
    assert (tmp_path / "report.md").read_text() == report.render_markdown(run())
    assert not list(tmp_path.glob("*.png"))
