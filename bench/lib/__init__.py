"""The benchmark's library, which every command under bench/ imports and which imports no command: the run's
settings, the fleets and the points it drives, the sweep and the statistics, the results' schema and codec,
and the in-process floor that times the host's unit (docs/benchmark.md, "The code")."""
