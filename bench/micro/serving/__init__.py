"""`python -m bench serving`: what one ranker's serving path costs the host beyond its model.

Three processes answer the same open-loop PreInfer + Rank pairs, one at a time, on the same CPUs: the
serving floor (`bench.micro.null_ranker`: the services' server stack, nothing behind it), the ranker with
free model passes (`bench.micro.null_model`) and the ranker (`--model-preset`, `--torch-threads` 1). A pair
is a fresh user with a long-term history of L events, then `--relay-window-ms` later a Rank with the relay
hint (so every Rank is an HBM hit) of `--short-term` events and C candidates. The load generator is a
process of its own on CPUs of its own (`generator`), so the measured process's figures are its own.

Each ranker is driven at each length at three loads: `--rate`, half its capacity and its capacity. A
capacity is searched (`run.search_capacity`): the highest rate at which every Rank is answered from its
prefix in HBM, within `--capacity-p99-ms` at P99 (plus twice a pair's real passes), at 95 % of the rate.
The floor's own capacity is searched and reported as well, and the floor then answers the same pairs at
every rate a ranker was driven at. Around each point's measured pairs it reads:

- the process's CPU time by thread from /proc/<pid>/task: the event loop (the main thread, where gRPC's
  server, decoding, validation, the cache's bookkeeping and the responses run), the device and copy
  threads (named so by the ranker), and the rest (gRPC's own threads, the metrics server);
- the CPU time the device thread spent inside model passes, from the ranker's own counter
  (`relaygr_model_cpu_seconds`, thread CPU time around each pass): the model is subtracted by what its
  passes took in the service, not by a start-up profile;
- the same passes in this process (`ModelRunner`, same preset and threads, thread CPU time), so the model's
  cost in the service can be compared with its cost alone;
- each Rank's latency from its intended send time, where its prefix came from, and the CPU the load
  generator took.

Non-model CPU per pair = (process CPU - model-pass CPU) / pairs; beyond the floor = that, less the floor's
CPU per pair at the same length and rate. An idle sequence of pairs gives the cached Rank's latency through
the service against the in-process rank. `--stages` samples the rankers with py-spy (a dev dependency) and
splits their CPU by where it goes.

On CPU the ratios and the split are what count; on an accelerator the absolute figures do too. With
`--device cuda` the ranker and the in-process passes run on the GPU, and each point also reads the busiest
GPU's utilization over its measured pairs (`bench.lib.gpu_monitor`: NVML, else nvidia-smi). A CUDA synchronize
spin-waits, so there the host's CPU counts waiting for the GPU as work: the waits inside a model pass (the
scores' copy back ends every rank) fall within the pass's thread CPU time and are subtracted with the model;
what remains, the event loop, the copy thread and the rest, is the serving path's own.

With `--in-turn-against`, it drives no sweep: this checkout's ranker and its contenders (`stand-ins`: the
serving floor and the free-pass ranker; `before`: the ranker of another checkout, `--before-tree`) are up at
once and answer the same pairs in turn, `--rounds` rounds whose order rotates, at each of `--shapes`, and it
prints a table of each one's CPU a pair that is not the model (`in_turn`). Figures measured minutes apart on
a shared machine do not compare; figures measured in turn do.

The package, by role: `config` (the settings), `pairs` (the requests, the driver, one point), `generator`
(the driver in a process of its own), `cpu` (the ranker's CPU by thread and its model passes'),
`in_process` (the same passes in this process), `stages` (py-spy's split), `run` (the processes, the
capacity searches and the loads), `summary` (results.json and summary.md), `in_turn` (the contenders
driven in turn and their table).
"""
