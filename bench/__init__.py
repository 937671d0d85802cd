"""RelayGR's benchmark: baseline and RelayGR fleets side by side (`python -m bench`, `make bench`).

The top-level modules are that benchmark: its settings (`config`), its runs (`experiments`; `gpu` for the
gpu profile), the one sweep they share (`sweep`), one point and its cost (`points`, `probes`), the modes
and their fleets (`fleets`), the users (`workload`), where a run ran (`context`, for every command), the
results' schema and codec (`schema`, `codec`) and a run's record (`record`). The other commands have
packages of their own: `report`, `tracing`, `mlperf`, `micro` (micro-benchmarks) and `studies` (the
one-off studies behind records in bench/results/, which holds data only).
"""
