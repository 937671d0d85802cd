"""`python -m bench accelerator` runs its whole path on CPU (the host pool forced): figures that must
hold on any device, and the files it writes. Its times mean something only on an accelerator."""

from __future__ import annotations

import json

import pytest

from bench.micro import accelerator
from services.ranker.model.presets import get_preset


def test_the_accelerator_bench_measures_every_figure_on_cpu(tmp_path, capsys):
    argv = ["--device", "cpu", "--model-preset", "cpu-tiny", "--lengths", "64,256", "--short-term", "4",
            "--candidates", "16", "--repeats", "5", "--batch", "3", "--chunk-tokens", "32",
            "--out", str(tmp_path)]  # fmt: skip
    assert accelerator.main(argv) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [row["length"] for row in results["epsilon"]] == [64, 256]
    assert all(row["max_abs"] < 1e-5 for row in results["epsilon"])  # fp32: exact to rounding
    reload = results["reload"]
    assert reload["bytes"] == 256 * get_preset("cpu-tiny").kv_bytes_per_token
    assert reload["reload_median_gb_s"] > 0 and reload["pinned_h2d_peak_gb_s"] > 0
    assert [row["length"] for row in results["ranks"]] == [64, 256]
    for row in results["ranks"]:
        assert 0 < row["rank_p50_ms"] <= row["rank_p99_ms"]
        assert row["batch"] == 3 and row["batch_per_user_ms"] == pytest.approx(row["batch_p50_ms"] / 3)
    graphs = results["graphs"]
    assert [(row["length"], row["bucket"], row["captured"]) for row in graphs] == [
        (64, 512, False),
        (256, 512, False),
    ]
    assert all(row["max_abs_vs_eager"] < 1e-5 and row["batch"] == 3 for row in graphs)  # padded: exact
    report = (tmp_path / "report.md").read_text()
    assert "DRAM → HBM reload" in report and "| 256 |" in report
    assert "CUDA graphs of the cached rank (not captured off CUDA" in report
    assert report in capsys.readouterr().out


def test_bad_lengths_are_refused_naming_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit):
        accelerator.main(["--device", "cpu", "--lengths", "0,64", "--out", str(tmp_path)])
    assert "--lengths" in capsys.readouterr().err
