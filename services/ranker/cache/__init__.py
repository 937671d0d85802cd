"""The prefix cache: where a request's prefix KV comes from, and the lifecycle of every entry.

- `prefix_cache`: `PrefixCache`, which decides for each request (lookup, produce or join, lease, consume).
- `index`: the entries by key, their miss reasons and owned pins.
- `productions`: single-flight productions (compute, reload, extension) that concurrent requests join.
- `leases`: consume-bound HBM leases.
- `moves`: the moves between tiers (demotion after consumption or lease expiry, eviction).
- `tiers`: the byte-budgeted HBM and DRAM tiers, LRU + TTL.
"""
