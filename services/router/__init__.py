"""The affinity router: serves `relaygr.v1.RankerService` in front of N rankers.

The routing itself is `services.affinity`'s (the ring, the membership and its health, the policy, the
client that calls the chosen member), shared with the trigger and the retrieval stub when they route
directly; `proxy` serves it to the router's clients, forwarding the raw request bytes, `app` wires them
behind one gRPC server, and `__main__` runs it (`python -m services.router`).
"""
