"""`python -m bench accelerator`: the ranker's device path in process (`--measures device`, the default), and
each DRAM precision's score error against the full pass (`--measures dram-precision`)."""

from __future__ import annotations

from collections.abc import Sequence

from bench.micro.accelerator import device, dram_precision
from bench.micro.accelerator.config import AcceleratorBenchConfig
from services.common.config import listed, load


def main(argv: Sequence[str] | None = None) -> int:
    config = load(AcceleratorBenchConfig, argv, prog="python -m bench accelerator", description=__doc__)
    for i, measure in enumerate(listed(config, "measures")):
        if i:
            print()
        if measure == "device":
            print(device.report(device.run(config)))
        else:
            print(dram_precision.run(config))
    return 0
