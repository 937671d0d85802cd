"""MLCommons LoadGen as the benchmark's driver: `python -m bench mlperf` (`__main__`, its settings in
`config`). LoadGen schedules the queries and judges the run, as in MLPerf Inference; `run` gives it a QSL of
DLRMv3-shaped streaming users and a SUT over the services' open-loop driver, a Recommend a sample; `results`
is what a run writes, `tally` what its answers say of the cache, `report` its summary.md. Synthetic weights
and users: not an MLPerf submission.
"""
