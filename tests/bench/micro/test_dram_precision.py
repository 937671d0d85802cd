"""`python -m bench dram-precision` measures every model it names (the CPU presets and an imported
recsys-examples checkpoint) at every DRAM precision: exact to float rounding, bf16 and fp8 within their
rounding and in that order, at a half and about a quarter of fp32's bytes."""

from __future__ import annotations

import torch

from bench.micro import dram_precision
from services.common.config import load
from services.ranker.model.hstu import HSTURanker
from services.ranker.model.presets import get_preset


def test_every_model_is_measured_at_every_precision(capsys):
    argv = ["--users", "2", "--lengths", "16,48", "--candidates", "8"]
    assert dram_precision.main(argv) == 0
    out = capsys.readouterr().out
    assert "| cpu-tiny | fp8 |" in out and "| cpu-small | bf16 |" in out and "| recsys-examples" in out
    config = load(dram_precision.DramPrecisionConfig, argv)
    torch.manual_seed(0)
    rows = dram_precision.measure("cpu-tiny", HSTURanker(get_preset("cpu-tiny")).eval(), None, config)
    by = {row.precision: row for row in rows}
    assert by["exact"].bytes_vs_fp32 == 1 and by["exact"].max_abs < 1e-5
    assert by["bf16"].bytes_vs_fp32 == 0.5 and 0 < by["bf16"].max_abs < by["fp8"].max_abs < 1e-2
    # fp8: a quarter of the bytes, and a float32 scale a layer, keys or values and head (2 x 2 x 2 here).
    fp32_bytes = 2 * (16 + 48) * 512
    assert by["fp8"].bytes_vs_fp32 == (fp32_bytes / 4 + 2 * 2 * (2 * 2 * 2 * 4)) / fp32_bytes
