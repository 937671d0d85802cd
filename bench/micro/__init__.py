"""Micro-benchmarks: the floors under the fleet's numbers (`floors`: a gRPC call and one hop through the
router), the ranker's device path and its DRAM precisions' error (`accelerator`), its serving path
(`serving`, with the stand-ins it starts as processes: `null_ranker`, the server stack with nothing behind
it, and `null_model`, a ranker whose passes are free) and K rankers on one device (`shared_device`, whose
rankers are `simulated_device`). Each drives rankers with `pairs.Driver`, the one open-loop driver.
"""
