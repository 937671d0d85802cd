"""The ranker's engine: all model work on one device thread, in priority order.

- `scheduler`: the device thread and its priorities (Ranks, awaited prefixes, reloads, pre-inference).
- `runner`: `ModelRunner`, the model's paths as scheduler jobs (chunked prefixes, batched cached ranks).
- `load`: the load the ranker reports (backlogs, leased bytes, consumed and wasted pre-inference).
- `latency_curve`: the three paths' latency, measured at warm-up.
"""
