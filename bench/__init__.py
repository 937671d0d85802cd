"""RelayGR's benchmarks: one front door, `python -m bench <command>` (`bench.commands`, docs/benchmark.md).

The package is a library, `bench.lib`, and the commands over it. The library: the settings (`config`,
and the groups in `fleets`), the modes and their fleets (`fleets`) and the driver of `run`'s points over
them (`driving`, `points`, `sweep`), the one open-loop Recommend driver (`recommends`), the arms' turn
orders (`orders`), the users (`workload`), the statistics (`stats`, `intervals`), the metrics scraper
(`probes`), where a run ran (`context`, `gpu_monitor`), the results' schema and codec (`schema`,
`schema_context`, `schema_gpu`, `codec`) and the in-process floor (`floor`). The commands: the table in
`commands`, and the packages `run`, `headline` (with `reproduce`), `ab`, `report` (with `readme`),
`rollout`, `tracing`, `mlperf` and `micro` (serving, shared-device, accelerator, floors). The library never
imports a command. bench/results/ holds data only.
"""
