"""MLCommons LoadGen as the benchmark's driver: `python -m bench mlperf`.

LoadGen (the `mlcommons-loadgen` package, module `mlperf_loadgen`) schedules the queries and judges the
run, as in MLPerf Inference; this package gives it a system under test that sends each sample to the
fleet's `RecommendService.Recommend` (`sut`), a QSL of DLRMv3-shaped streaming users (`workload`),
TestSettings for the Server and Offline scenarios (`run`), a local fleet (`fleet`, the benchmark's own
`bench.lib.fleets`), the search for the highest VALID target QPS per mode (`search`), and reads back LoadGen's
verdict (`summary`) beside what the answers say of the cache (`tally`), into result.json and summary.md
(`results`, `report`). Synthetic weights and users: not an MLPerf submission.
"""
