"""`python -m bench serving`: what one ranker's serving path costs the host beyond its model
(docs/benchmark.md, "The ranker's serving path").

The serving floor (`bench.micro.null_ranker`), the ranker with free passes (`bench.micro.null_model`) and the
ranker answer open-loop PreInfer + Rank pairs in turn, from a load generator on CPUs of its own, at the low
rate, half their capacity and their capacity (searched), the floor again at every rate a ranker was driven
at; each point reads the process's CPU by thread and its model passes' CPU, which is subtracted. With
`--in-turn-against`, rankers are driven in turn by the same pairs instead (`in_turn`).

The package: `config` (the settings), `generator` (what sends the pairs), `point` (one measured point and
what it reads, py-spy's split of the CPU too), `in_process` (the same passes in this process), `run` (the
processes, the capacity searches, the loads and coalesced PreInfers), `summary` (results.json and
summary.md), `in_turn`.
"""
