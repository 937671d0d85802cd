"""Micro-benchmarks: the floors under the fleet's numbers (`floors`, `python -m bench floors`: a gRPC call
and one hop through the router; the model in process is the library's `bench.lib.floor`), the ranker's
device path and its DRAM precisions' error (`accelerator`, `python -m bench accelerator`), its serving path
(`serving`, `python -m bench serving`, with the stand-ins it starts as processes of their own: `null_ranker`,
the server stack with nothing behind it, and `null_model`, a ranker whose passes are free) and K rankers on
one device (`shared_device`, `python -m bench shared-device`, whose rankers are `simulated_device`).
"""
