"""Micro-benchmarks: the floors under the fleet's numbers (`floor`: the model in process; `grpc_floor`: a
gRPC call, `python -m bench grpc-floor`; `router_hop`: one hop through the router, `python -m bench
router-hop`), the ranker's device path (`accelerator`, `python -m bench accelerator`) and its serving path
(`serving`, `python -m bench serving`, with the stand-ins it starts as processes of their own: `null_ranker`,
the server stack with nothing behind it, and `null_model`, a ranker whose passes are free).
"""
