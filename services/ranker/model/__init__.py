"""The model: an HSTU ranker with exact prefix-KV reuse, its presets and its inputs.

- `hstu`: `HSTURanker` and `PrefixBuilder` (the contract of exactness is in its docstring).
- `prefix_kv`: `PrefixKV`, the per-layer keys and values the cache holds.
- `presets`: the named model shapes of the CLI.
- `events`: `Events`, a behaviour sequence as the model takes it.
"""
