"""RelayGR's benchmarks: one front door, `python -m bench <command>` (`bench.commands`, docs/benchmark.md).

The package is a library and the commands over it. The library: a run's settings (`config`), its
experiments (`experiments`; `gpu` for the gpu profile) over the fleets they drive (`driving`), the one
sweep they share (`sweep`), one point and its cost (`points`, `probes`), the modes and their fleets
(`fleets`), the users (`workload`), the statistics (`stats`, `intervals`), where a run ran (`context`),
the results' schema and codec (`schema`, `schema_context`, `schema_gpu`, `codec`) and a run's record
(`record`). The commands: `commands` (the table, and
`run`, the benchmark itself), `reproduce`, and the packages `ab`, `report`, `tracing`, `mlperf` and `micro`
(micro-benchmarks). The library never imports a command.
bench/results/ holds data only.
"""
