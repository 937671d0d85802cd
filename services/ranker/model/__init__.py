"""The model: an HSTU ranker with exact prefix-KV reuse, the family it belongs to, its presets and inputs.

- `hstu`: `HSTURanker` and `PrefixBuilder` (the contract of exactness is in its docstring).
- `family`: `ModelConfig`, the options of a family member and the closure check.
- `layers`: the weight-holding pieces (layer, head, item index) the contract composes.
- `prefix_kv`: `PrefixKV`, the per-layer keys and values the cache holds.
- `presets`: the named model shapes of the CLI (family configs at the defaults).
- `events`: `Events`, a behaviour sequence as the model takes it.
"""
