"""Micro-benchmarks, each a `python -m bench.micro.<name>` of its own: the floors under the fleet's numbers
(`floor`: the model in process; `grpc_floor`: a gRPC call; `router_hop`: one hop through the router),
the ranker's device path (`accelerator`) and its serving path (`serving`, with the stand-ins it drives:
`null_ranker`, the server stack with nothing behind it, and `null_model`, a ranker whose passes are free).
"""
