"""Affinity routing to the rankers, as a library: who the members are and whether they are healthy
(`membership`, `discovery`), which member serves a request and why (`routing`, over `services.affinity.ring`),
and the calls themselves (`client.AffinityClient`: decision, in-flight count, failover, hedge).

The router runs it for its clients; a trigger or retrieval stub given `--rankers`/`--rankers-srv` runs it
in process (direct routing). Service-neutral: it imports no service.
"""
