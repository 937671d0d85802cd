"""Fixed-load A/B (`python -m bench ab`): two or more modes at the same loads, with the same users and
arrivals, every mode's fleet up at once and driven in turn, several load seeds, no early stop; per mode
and load the Ranks and Recommends over the SLO and the P99, per pair of modes their differences, each
with a confidence interval (`bench.lib.intervals`).

- `bench.ab.config`: the settings (`AbConfig`) and the modes that may be named;
- `bench.ab.run`: the order of the runs (`schedule`) and their driving (`AbBench`);
- `bench.ab.analysis`: the statistics of the runs (`Cell`, `Comparison`, verdicts);
- `bench.ab.schema`: results.json (`AbResults`); `bench.ab.report`: report.md.
"""
