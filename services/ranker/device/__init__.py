"""The accelerator path: streams and events, the pinned host arena, copies between HBM and DRAM.

- `accelerator`: `Accelerator` (rank, pre-infer and copy streams; CPU stand-ins), `InflightWindow`.
- `host_pool`: `HostPool`, one pinned arena of first-fit coalescing slabs.
- `copier`: `TierCopier`, the HBM <-> DRAM copies of a `PrefixKV` through the pool.
"""
