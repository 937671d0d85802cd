"""The affinity router: serves `relaygr.v1.RankerService` in front of N rankers.

`ring` places users on members (consistent hashing, bounded load), `membership` keeps the members and
their health, `routing` picks the member for each request (relay hint, ring, failover), `proxy` forwards
the raw request bytes, `server` wires them behind one gRPC server, and `__main__` runs it
(`python -m services.router`).
"""
