"""`python -m bench accelerator`: the ranker's device path in process (`device`) and what each DRAM precision
does to its scores (`dram_precision`); `--measures` picks them, in its order (docs/benchmark.md, "The device
path"). The settings are `config`'s."""
