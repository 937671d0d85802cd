"""`python -m bench accelerator` runs its whole device path on CPU (the host pool forced): figures that must
hold on any device, and the files it writes; its times mean something only on an accelerator. With
`--measures dram-precision` it measures every model it names (the CPU presets and an imported
recsys-examples checkpoint) at every DRAM precision: exact to float rounding, bf16 and fp8 within their
rounding and in that order, at a half and about a quarter of fp32's bytes."""

from __future__ import annotations

import pytest
import torch

from bench.lib import envelope
from bench.micro.accelerator import dram_precision
from bench.micro.accelerator.__main__ import main
from bench.micro.accelerator.config import AcceleratorBenchConfig
from services.common.config import load
from services.ranker.model.hstu import HSTURanker
from services.ranker.model.presets import get_preset


def test_the_accelerator_bench_measures_every_figure_on_cpu(tmp_path, capsys):
    argv = ["--device", "cpu", "--model-preset", "cpu-tiny", "--lengths", "64,256", "--short-term", "4",
            "--candidates", "16", "--repeats", "5", "--batch", "3", "--chunk-tokens", "32",
            "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    results = envelope.read(tmp_path / "results.json", "accelerator")
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
        main(["--device", "cpu", "--lengths", "0,64", "--out", str(tmp_path)])
    assert "--lengths" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--measures", "device,bogus", "--out", str(tmp_path)])
    assert "--measures" in capsys.readouterr().err


def test_every_model_is_measured_at_every_dram_precision(tmp_path, capsys):
    argv = ["--measures", "dram-precision", "--dram-users", "2", "--dram-lengths", "16,48",
            "--dram-candidates", "8", "--out", str(tmp_path / "not-written")]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| cpu-tiny | fp8 |" in out and "| cpu-small | bf16 |" in out and "| recsys-examples" in out
    assert "DRAM → HBM reload" not in out and not (tmp_path / "not-written").exists()  # no device path
    config = load(AcceleratorBenchConfig, argv)
    torch.manual_seed(0)
    rows = dram_precision.measure("cpu-tiny", HSTURanker(get_preset("cpu-tiny")).eval(), None, config)
    by = {row.precision: row for row in rows}
    assert by["exact"].bytes_vs_fp32 == 1 and by["exact"].max_abs < 1e-5
    assert by["bf16"].bytes_vs_fp32 == 0.5 and 0 < by["bf16"].max_abs < by["fp8"].max_abs < 1e-2
    # fp8: a quarter of the bytes, and a float32 scale a layer, keys or values and head (2 x 2 x 2 here).
    fp32_bytes = 2 * (16 + 48) * 512
    assert by["fp8"].bytes_vs_fp32 == (fp32_bytes / 4 + 2 * 2 * (2 * 2 * 2 * 4)) / fp32_bytes
