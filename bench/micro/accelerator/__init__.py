"""`python -m bench accelerator`: the ranker's device path measured in process, and what each DRAM precision
does to its scores.

`--measures` picks what runs, in the order given: `device` (the default) measures, for one preset on
`--device`, the cached rank's error against the full recomputation, the DRAM → HBM reload against a pinned
copy's peak, the cached rank's latency one user and `--batch` users at a time, and its CUDA graphs against
the eager path, and writes results.json and report.md to `--out` (`device`); `dram-precision` prints, for
every CPU preset and an imported recsys-examples checkpoint, each DRAM precision's bytes against fp32's and
its largest score error against the full fp32 pass, measured on CPU whatever `--device` (`dram_precision`).
Both print what they measure. The package, by role: `config` (the settings), `device`, `dram_precision`.
"""
