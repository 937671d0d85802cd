"""results.json's schema, and the report and plots rendered from it alone."""

from __future__ import annotations

import json

import grpc
import pytest

from bench import report
from bench.points import PointSpec, summarize
from relaygr.v1 import common_pb2, recommend_pb2
from services.loadgen.openloop import CallRecord

SLO_MS = 100.0


def point(rate: float, rank_ms: float, source: int, **extra: object) -> dict:
    """A summarized point of 100 calls that all took `rank_ms`, with a made-up cost."""
    spec = PointSpec(
        rate, warmup=0, measured=100, timeout_s=1, slo_ms=SLO_MS, max_error_fraction=0.001, seed=0
    )
    answer = recommend_pb2.RecommendResponse(rank_latency_ms=rank_ms, cache_source=source, long_term_length=8)
    calls = [
        CallRecord(i, i / rate, i / rate, rank_ms / 1000, grpc.StatusCode.OK, "", answer) for i in range(100)
    ]
    cost = {
        "cpu_s": {"ranker-0": 3.0, "ranker-1": 2.0, "router": 1.0},
        "rankers": {"productions": {"compute": 50}, "joins": 4},
        "wall_s": 10.0,
        "foreign_cores": 0.25,
    }
    return {**summarize(calls, spec, aborted=False, wall_s=10.0).as_json(), "cost": cost, **extra}


def sweep(points: list[dict], best: float | None) -> dict:
    return {"points": points, "best": best, "at_grid_top": False}


def results() -> dict:
    hbm, miss = common_pb2.CACHE_SOURCE_HBM, common_pb2.CACHE_SOURCE_MISS
    floor = [
        {"prefix_length": n, "full_ms": n / 10, "pre_infer_ms": n / 20, "rank_ms": 2.0}
        for n in (1024, 2048, 4096)
    ]
    base_length = [point(8, 50, miss, long_term=1024), point(8, 150, miss, long_term=2048)]
    relay_length = [point(8, 20, hbm, long_term=2048), point(8, 300, hbm, long_term=4096)]
    return {
        "name": "unit",
        "throughput_ratio": 4.0,
        "length_ratio": 2.0,
        "started_at": "2026-01-01T00:00:00+00:00",
        "duration_s": 300.0,
        "machine": {
            "cores": 2,
            "cpu_model": "test CPU",
            "memory_gib": 8.0,
            "platform": "Linux",
            "python": "3",
        },
        "versions": {"torch": "2.x", "git_commit": "abc1234"},
        "configuration": {
            "profile": "quick",
            "model_preset": "cpu-small",
            "rankers": 2,
            "torch_threads": 1,
            "slo_ms": SLO_MS,
            "preprocess_delay_ms": 100.0,
            "warmup_s": 5.0,
            "revisit_probability": 0.5,
            "revisit_window_s": 5.0,
            "lengths": "1024,2048,4096",
            "loads": "4,8,16",
            "max_error_fraction": 0.001,
            "short_term": 16,
            "mix_median": 512,
            "mix_sigma": 1.0,
            "mix_max": 2048,
        },
        "profile": {"measured": 100},
        "floor": floor,
        "cached_rank": [{"prefix_length": 2048, "rank_ms_p50": 6.0, "rank_ms_p99": 9.0, "request_kib": 40.0}],
        "length_sweep": {
            "rate": 8.0,
            "baseline": sweep(base_length, 1024),
            "relay": sweep(relay_length, 2048),
        },
        "throughput_sweep": {
            "universe": "mix",
            "baseline": sweep([point(4, 40, miss), point(8, 120, miss)], 4),
            "relay": sweep([point(16, 30, hbm), point(32, 130, hbm)], 16),
        },
        "window_sensitivity": {"200": sweep([point(8, 60, hbm, long_term=4096)], 4096)},
        "ablations": {"rate": 16, "points": {"relay": point(16, 30, hbm), "no-dram": point(16, 140, miss)}},
        "modes": {"relay": {"name": "relay", "description": "RelayGR"}},
        "fleet": {},
        "mix_universe": {},
    }


def test_results_json_holds_the_ratios_machine_and_points_and_the_report_and_plots_are_written(tmp_path):
    report.write(results(), tmp_path)
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["throughput_ratio"] == 4.0 and written["length_ratio"] == 2.0
    assert written["machine"]["cpu_model"] == "test CPU"
    assert written["length_sweep"]["relay"]["points"][0]["rank_ms"]["p99"] == 20.0
    markdown = (tmp_path / "report.md").read_text()
    assert "only the ratios between the two modes are meaningful" in markdown
    headline = markdown.split("## Headline")[1].split("##")[0]
    assert "| 1024 | 2048 | x2.00 |" in headline and "| 4 | 16 | x4.00 |" in headline
    # What stopped RelayGR's length sweep is named from its first failing point, against the floor.
    assert "- Length, relay: at 4096 events the ranking P99 was 300.0 ms" in markdown
    assert "pre-inferring 4096 events takes 205 ms, against a relay window of 100 ms" in markdown
    assert "| 200 | 4096 | x4.00 |" in markdown  # the window sensitivity table
    for name in report.PLOTS.values():
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")


def test_a_result_without_a_headline_ratio_or_a_point_field_is_refused(tmp_path):
    incomplete = results()
    del incomplete["throughput_ratio"]
    with pytest.raises(ValueError, match="throughput_ratio"):
        report.write(incomplete, tmp_path)
    broken = results()
    del broken["throughput_sweep"]["relay"]["points"][0]["cost"]
    with pytest.raises(ValueError, match=r"throughput_sweep\.relay lacks cost"):
        report.check(broken)
    assert not (tmp_path / "results.json").exists()
