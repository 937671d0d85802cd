"""`python -m bench serving`: what one ranker's serving path costs the host beyond its model.

One ranker process (`--model-preset`, `--torch-threads` 1) is driven open loop by PreInfer + Rank pairs
at a fixed rate, from this process: a fresh user each pair, a long-term history of L events, then
`--relay-window-ms` later a Rank with the relay hint (so every Rank is an HBM hit) of `--short-term` events
and C candidates. Around each point's measured pairs it reads:

- the ranker's CPU time by thread from /proc/<pid>/task: the event loop (the main thread, where gRPC's
  server, decoding, validation, the cache's bookkeeping and the responses run), the device and copy
  threads (named so by the ranker), and the rest (gRPC's own threads, the metrics server);
- the CPU time the device thread spent inside model passes, from the ranker's own counter
  (`relaygr_model_cpu_seconds`, thread CPU time around each pass): the model is subtracted by what its
  passes took in the service, not by a start-up profile;
- the same passes in this process (`ModelRunner`, same preset and threads, thread CPU time), so the model's
  cost in the service can be compared with its cost alone;
- each Rank's latency from its intended send time, and where its prefix came from.

Non-model CPU per pair = (process CPU - model-pass CPU) / pairs; its slope per history event and per
candidate is a least-squares fit over the points. `--capacity-rates` drives a near-free model (few
events, few candidates) at production rates: the pairs a second one ranker sustains with its Rank P99.
An idle sequence of pairs gives the cached Rank's latency through the service against the in-process
rank. `--stages` samples the ranker with py-spy (a dev dependency) and splits its CPU by where it goes.

On CPU the ratios and the split are what count; on an accelerator the absolute figures do too. With
`--device cuda` the ranker and the in-process passes run on the GPU, and each point also reads the busiest
GPU's utilization over its measured pairs (`bench.lib.gpu_monitor`: NVML, else nvidia-smi). A CUDA synchronize
spin-waits, so there the host's CPU counts waiting for the GPU as work: the waits inside a model pass (the
scores' copy back ends every rank) fall within the pass's thread CPU time and are subtracted with the model;
what remains, the event loop, the copy thread and the rest, is the serving path's own.

The package, by role: `config` (the settings), `pairs` (the requests, the driver, one point), `cpu` (the
ranker's CPU by thread and its model passes'), `in_process` (the same passes in this process), `stages`
(py-spy's split), `run` (the processes and the shapes driven), `summary` (results.json and summary.md).
"""
