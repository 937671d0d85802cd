"""The ranker: owns one accelerator, runs the GR model, holds prefix KV caches in HBM and DRAM.

A request travels top-down, each layer importing only those below it (`tests/test_architecture.py`):

- `servicer.py` (protobuf in and out) → `dataplane.py` (shedding, the cache once, the runner once), wired
  by `app.py` with `config.py`, `budgets.py` and `metrics.py` beside them;
- `cache/`: where a request's prefix comes from, and every entry's lifecycle;
- `engine/`: the device thread that runs all model work in priority order, and what it measures;
- `device/`: streams, events and the copies between HBM and DRAM;
- `model/`: the HSTU model, its `PrefixKV`, presets and inputs.
"""
