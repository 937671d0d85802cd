"""HSTU-style generative-recommendation ranker with exact prefix-KV reuse, for any closed member of the
model family (`family.ModelConfig`: our presets, converted recsys-examples checkpoints).

Contract
--------
A request is laid out ``[prefix (L events) | short-term (S events) | candidates (C)]`` as tokens: one token
per event (`token_layout="event"`), or an item token then an action token per event ("item_action"); one
token per candidate. Tokens are numbered forward from the start of the prefix: token i of the history sits at
position i, and every candidate at the position after the last history token (positions past the table's end
use its last row when `position_clamp`). Each layer attends pointwise (SiLU, no softmax) under the mask M: a
history token sees the history tokens up to itself; a candidate sees every history token and itself, never
another candidate.

*Prefix closure* makes reuse exact: nothing in a prefix token depends on anything after the prefix, on the
request time, the total length or the batch (positions count forward, N_norm is a constant; `family.py`
refuses the options that would break this). Hence:

* ``pre_infer`` / ``extend`` / ``PrefixBuilder`` compute the per-layer keys and values of prefix tokens
  alone (`PrefixKV`, one row per token), in one pass, in chunks, or incrementally as events are appended —
  all equal to float rounding;
* ``rank(pre_infer(prefix), short, candidates)`` equals the reference ``full_forward(prefix, short,
  candidates)`` to float rounding (fp32: ``torch.testing.assert_close`` defaults), for any candidate
  microbatching, candidate order or subset; ``rank_batch`` and ``score_padded`` batch users of different
  lengths without changing any user's scores.

Tokens are (item row, action row, position) triples — row -1: the token has no item (an action token) or no
action (an item-only token) — made from events by `history_tokens` and `candidate_tokens`; every path embeds
them with `_embed`, so the layouts differ in one place only.

Weights come from a generator seeded with ``config.seed`` (or a checkpoint), so every process builds the
same model on any device. The code is device-agnostic: move the model with ``.to(device)`` and pass inputs on
that device. Item ids are int64 (`layers.ItemIndex` maps them to rows; an imported table refuses an id without
a row), action types lie in [0, num_action_types). Scores are float32 whatever the compute dtype. The model
keeps no state between calls (a `PrefixBuilder` does, and is stepped by one thread at a time).

The contract above binds the token layout, the attention, the prefix builder and the reference forward
together, and exactness is proved across them (`tests/ranker/model/test_model.py`, `test_family.py`), so they
live in this file. The tests' own variants of the reference (every token's keys and values, a padded batch of
whole passes) are built from `full_inputs` and `full_pass` in `tests/ranker/model/reference.py`. The
weight-holding pieces that compute token-local things (layer, head, item index) are in `layers.py`, the
options in `family.py`. The KV they produce and consume, `PrefixKV`, lives apart (`prefix_kv.py`): it is the
prefix cache's currency, and the cache and the device code need it, not the model.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from services.ranker.model.family import ModelConfig
from services.ranker.model.layers import HSTULayer, ItemIndex, build_head, head_logits
from services.ranker.model.prefix_kv import PrefixKV

# Scale of the embedding tables at initialisation; LayerNorm follows, so only the ratio to the residual
# updates matters.
_EMBED_STD = 0.5

# Per layer, the key/value blocks that new tokens see in full (no mask).
_VisibleBlocks = list[list[tuple[Tensor, Tensor]]]
# Last hidden states [B, n, D], then per-layer keys and values [B, H, n, d].
_LayerOutputs = tuple[Tensor, list[Tensor], list[Tensor]]


class Tokens(NamedTuple):
    """Tokens as the layers take them: item rows and action rows [B, n] (-1: none) and positions ([n] or
    [B, n], or a 0-d tensor shared by all)."""

    items: Tensor
    actions: Tensor
    positions: Tensor


class CachedRank(NamedTuple):
    """One user's cached rank for `HSTURanker.rank_batch`: its prefix (B == 1) and 1-D tensors of its
    short-term events (S may be 0) and candidates."""

    prefix: PrefixKV
    short_items: Tensor
    short_actions: Tensor
    candidates: Tensor


class HSTURanker(nn.Module):
    """HSTU ranker: `pre_infer`/`extend` build a prefix's KV, `rank` scores against it, `full_forward` is
    the reference that recomputes everything in one pass.

    There is no relative attention bias: HSTU buckets timestamp gaps measured from the request's time, which
    would make prefix states depend on when the request arrives. Absolute positions carry the order instead.
    """

    def __init__(self, preset: ModelConfig) -> None:
        super().__init__()
        self.preset = preset  # the model's config (a preset, or a converted checkpoint's model.json)
        # The cache's model version; a checkpoint's contents are folded in by `from_checkpoint`.
        self.version = preset.version
        dim = preset.embed_dim
        self.tokens_per_event = preset.tokens_per_event
        # Some token lacks an item or an action: embeddings are selected, not only summed.
        self._partial_tokens = preset.token_layout == "item_action" or preset.candidate_token == "item"
        self._target_action = preset.num_action_types if preset.candidate_token == "target_action" else -1
        # Built empty and filled from a seeded generator below: identical in every process, and the global
        # RNG is left untouched.
        with torch.device("meta"):
            self.item_embedding = nn.Embedding(preset.item_buckets, dim)
            # With target-action candidates the extra last row is the learned "target" action.
            self.action_embedding = nn.Embedding(preset.num_action_types + (self._target_action >= 0), dim)
            self.position_embedding = nn.Embedding(preset.max_positions, dim) if preset.positions else None
            self.layers = nn.ModuleList(HSTULayer(preset) for _ in range(preset.num_layers))
            self.final_norm, self.head = build_head(preset)
        self.item_index = ItemIndex(preset)
        self.to_empty(device="cpu")
        self._init_weights(torch.Generator().manual_seed(preset.seed))
        self.to(preset.dtype)
        self.eval()

    @torch.no_grad()
    def _init_weights(self, generator: torch.Generator) -> None:
        # Module order is fixed by construction, so the draws are too.
        for module in self.modules():
            if isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, _EMBED_STD, generator=generator)
            elif isinstance(module, nn.Linear):
                module.weight.normal_(0.0, module.in_features**-0.5, generator=generator)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.LayerNorm) and module.weight is not None:
                module.weight.fill_(1.0)
                module.bias.zero_()
        if self.preset.item_ids == "keys":
            self.item_index.keys.copy_(torch.arange(self.preset.item_buckets))

    @classmethod
    def from_checkpoint(cls, preset: ModelConfig, path: str | Path) -> HSTURanker:
        """The model with the weights of a saved state_dict (strict: every tensor must match the preset)."""
        data = Path(path).read_bytes()
        model = cls(preset)
        state = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        model.load_state_dict(state, strict=True)
        model.version = f"{preset.version}-{hashlib.sha256(data).hexdigest()[:12]}"
        return model

    @property
    def device(self) -> torch.device:
        return self.item_embedding.weight.device

    # ---- tokens: the one place the layouts differ ----

    def history_tokens(self, item_ids: Tensor, action_types: Tensor, start: int) -> Tokens:
        """Tokens of events [B, n] whose first token sits at position `start`."""
        if item_ids.shape != action_types.shape:
            raise ValueError(f"{list(item_ids.shape)} item ids but {list(action_types.shape)} action types")
        rows = self.item_index(item_ids)
        batch, n = rows.shape
        count = n * self.tokens_per_event
        positions = torch.arange(start, start + count, device=rows.device)
        if self.tokens_per_event == 1:
            return Tokens(rows, action_types, positions)
        none = torch.full_like(rows, -1)
        items = torch.stack([rows, none], dim=2).view(batch, count)
        actions = torch.stack([none, action_types], dim=2).view(batch, count)
        return Tokens(items, actions, positions)

    def candidate_tokens(self, candidates: Tensor, position: int | Tensor) -> Tokens:
        """Tokens of candidates [B, C], all at `position` (the one after the last history token)."""
        rows = self.item_index(candidates)
        position = torch.as_tensor(position, device=rows.device)
        return Tokens(rows, torch.full_like(rows, self._target_action), position.expand(rows.shape[-1]))

    def _embed(self, tokens: Tokens) -> Tensor:
        items, actions, positions = tokens
        if self._partial_tokens:
            item = self.item_embedding(items.clamp(min=0)).masked_fill_((items < 0)[..., None], 0.0)
            action = self.action_embedding(actions.clamp(min=0)).masked_fill_((actions < 0)[..., None], 0.0)
            x = item + action
        else:
            x = self.item_embedding(items) + self.action_embedding(actions)
        if self.preset.embed_scale != 1.0:
            x = x * self.preset.embed_scale
        if self.position_embedding is not None:
            if self.preset.position_clamp:
                positions = positions.clamp(max=self.preset.max_positions - 1)
            x = x + self.position_embedding(positions)
        return x

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        """One block of pointwise attention, not normalised: SiLU(alpha q k^T) [masked] @ v, [B, H, n_q, dv].

        The [n_q, n_k] weights are the largest tensor of a layer, so they get one elementwise pass (SiLU, in
        place) and the mask's: alpha scales q (n_q x d) before the product, and the caller divides the sum
        of its blocks by N_norm once, on the [n_q, dv] output (exact for a power-of-two N_norm).
        """
        weights = F.silu((q * self.preset.head_dim**-0.5) @ k.transpose(-2, -1), inplace=True)
        if mask is not None:
            weights.masked_fill_(~mask, 0.0)
        return weights @ v

    def task_logits(self, hidden: Tensor, item_rows: Tensor) -> Tensor:
        """Task logits [B, C, T] (float32) from the candidates' last hidden states [B, C, D] and item rows."""
        item = self.item_embedding(item_rows) if self.final_norm is not None else None
        return head_logits(self.final_norm, self.head, hidden, item)

    def _causal_mask(self, n: int) -> Tensor:
        return torch.ones(n, n, dtype=torch.bool, device=self.device).tril()

    def _request_mask(self, head: int, num_candidates: int) -> Tensor:
        """M over `head` causal tokens followed by candidates that see all of them and themselves."""
        mask = self._causal_mask(head + num_candidates)
        mask[head:, head:] = torch.eye(num_candidates, dtype=torch.bool, device=self.device)
        return mask

    def _check_events(self, events: int) -> None:
        if events > self.preset.max_events:
            raise ValueError(
                f"sequence has {events} prefix + short-term events; model {self.preset.name!r} takes at most "
                f"{self.preset.max_events} (its {self.preset.max_positions} positions)"
            )

    # ---- the cached path ----

    def _run_new(
        self,
        x: Tensor,
        self_mask: Tensor,
        prefix: PrefixKV | None = None,
        seen: _VisibleBlocks | None = None,
    ) -> _LayerOutputs:
        """Runs new tokens x through every layer: against each other through `self_mask` [n, n], and in full
        against the prefix's keys (layer l waited for just before layer l runs) and the blocks `seen[l]`
        (already computed). Returns their last hidden states and their per-layer keys and values."""
        keys, values = [], []
        for index, layer in enumerate(self.layers):
            u, q, k, v = layer.project(x)
            o = self._attend(q, k, v, self_mask)
            if prefix is not None:
                o = o + self._attend(q, *prefix.layer(index))
            for block_keys, block_values in seen[index] if seen else ():
                o = o + self._attend(q, block_keys, block_values)
            x = layer.finish(x, u, o.div_(self.preset.attn_norm))
            keys.append(k)
            values.append(v)
        return x, keys, values

    def _fill(self, buffer: Tensor, start: int, item_ids: Tensor, action_types: Tensor) -> None:
        """Computes the tokens of events [B, n] from token `start` on into a PrefixKV buffer whose first
        `start` tokens are done."""
        x = self._embed(self.history_tokens(item_ids, action_types, start))
        n = x.shape[1]
        # The tokens before `start` are seen in full, through views of the buffer (nothing is copied).
        done = [[(layer[0, :, :, :start], layer[1, :, :, :start])] for layer in buffer] if start else None
        _, new_keys, new_values = self._run_new(x, self._causal_mask(n), seen=done)
        for index, (k, v) in enumerate(zip(new_keys, new_values, strict=True)):
            buffer[index, 0, :, :, start : start + n] = k
            buffer[index, 1, :, :, start : start + n] = v

    @torch.inference_mode()
    def prefix_builder(
        self,
        item_ids: Tensor,
        action_types: Tensor,
        chunk_size: int | None = None,
        past: PrefixKV | None = None,
    ) -> PrefixBuilder:
        """A `PrefixBuilder` for the events [B, n] appended to `past` (None: from the start), computed
        `chunk_size` events per step (None: all in one step)."""
        if chunk_size is not None and chunk_size < 1:
            raise ValueError("chunk_size must be positive")
        if past is not None and past.batch_size != item_ids.shape[0]:
            raise ValueError("the prefix and the new events must have the same batch size")
        start = 0 if past is None else past.length
        self._check_events(start // self.tokens_per_event + item_ids.shape[1])
        return PrefixBuilder(self, item_ids, action_types, chunk_size or max(item_ids.shape[1], 1), past)

    @torch.inference_mode()
    def pre_infer(self, item_ids: Tensor, action_types: Tensor, chunk_size: int | None = None) -> PrefixKV:
        """The PrefixKV of the events [B, L], computed `chunk_size` events at a time (None: all at once)."""
        return self.prefix_builder(item_ids, action_types, chunk_size).run()

    @torch.inference_mode()
    def extend(self, past: PrefixKV | None, item_ids: Tensor, action_types: Tensor) -> PrefixKV:
        """A new PrefixKV: `past` (None: empty) followed by the events [B, n]."""
        return self.prefix_builder(item_ids, action_types, past=past).run()

    def rank_tokens(
        self, length: int, short_items: Tensor, short_actions: Tensor, candidates: Tensor
    ) -> tuple[Tokens, Tokens]:
        """The short-term and candidate tokens of a rank after a prefix of `length` tokens."""
        short = self.history_tokens(short_items, short_actions, length)
        return short, self.candidate_tokens(candidates, length + short.items.shape[-1])

    @torch.inference_mode()
    def rank(
        self,
        prefix: PrefixKV,
        short_items: Tensor,
        short_actions: Tensor,
        candidates: Tensor,
        candidate_microbatch: int | None = None,
    ) -> Tensor:
        """Task logits [B, C, T] (float32) of candidates [B, C] after short-term events [B, S] (S may be 0),
        against a prefix's cached KV (moved to the model's device and dtype if it is elsewhere).

        Per layer the new tokens see the whole prefix through one mask-free block; the masked
        (S+C)x(S+C) block is causal among short-term tokens, and candidates see all short-term tokens and
        themselves. Short-term tokens are computed once; candidates then go in microbatches of
        `candidate_microbatch` (None: all at once), which cannot change any score because candidates never
        see each other.
        """
        prefix = prefix.to(self.device, self.preset.dtype)
        self.check_request(prefix.batch_size, short_items, candidates, prefix.length)
        if candidate_microbatch is not None and candidate_microbatch < 1:
            raise ValueError("candidate_microbatch must be positive")
        short, cands = self.rank_tokens(prefix.length, short_items, short_actions, candidates)
        num_short = short.items.shape[1]
        seen = None
        if num_short:
            _, short_keys, short_values = self._run_new(
                self._embed(short), self._causal_mask(num_short), prefix
            )
            seen = [[(k, v)] for k, v in zip(short_keys, short_values, strict=True)]
        step = candidate_microbatch or candidates.shape[1]
        logits = []
        for start in range(0, candidates.shape[1], step):
            chunk = Tokens(cands.items[:, start : start + step], cands.actions[:, start : start + step],
                           cands.positions[start : start + step])  # fmt: skip
            itself = torch.eye(chunk.items.shape[1], dtype=torch.bool, device=self.device)
            hidden, _, _ = self._run_new(self._embed(chunk), itself, prefix, seen)
            logits.append(self.task_logits(hidden, chunk.items))
        return torch.cat(logits, dim=1)

    @torch.inference_mode()
    def score(
        self,
        prefix: PrefixKV,
        short_items: Tensor,
        short_actions: Tensor,
        candidates: Tensor,
        candidate_microbatch: int | None = None,
    ) -> Tensor:
        """The scores [B, C] the service returns: sigmoid of the score task's logit of `rank`."""
        logits = self.rank(prefix, short_items, short_actions, candidates, candidate_microbatch)
        return torch.sigmoid(logits[..., self.preset.score_task])

    @torch.inference_mode()
    def rank_batch(self, requests: Sequence[CachedRank]) -> list[Tensor]:
        """Task logits [C_i, T] (float32) of several users' cached ranks in one pass, each against its own
        prefix: equal to `rank` one user at a time (to float rounding).

        The users' short-term and candidate tokens are packed into one sequence, so every projection, norm
        and MLP runs once for all of them; attention runs per user, over its own tokens (under M) and its
        own prefix, so no user sees another and nothing is padded.
        """
        if not requests:
            return []
        prefixes = [request.prefix.to(self.device, self.preset.dtype) for request in requests]
        parts: list[Tokens] = []
        spans, masks = [], []
        offset = 0
        for request, prefix in zip(requests, prefixes, strict=True):
            if prefix.batch_size != 1:
                raise ValueError("rank_batch takes one user per prefix (B == 1)")
            self.check_request(1, request.short_items[None], request.candidates[None], prefix.length)
            short, cands = self.rank_tokens(
                prefix.length,
                request.short_items[None],
                request.short_actions[None],
                request.candidates[None],
            )
            num_short, num_candidates = short.items.shape[1], cands.items.shape[1]
            parts += [short, cands]
            spans.append((offset, offset + num_short, offset + num_short + num_candidates))
            masks.append(self._request_mask(num_short, num_candidates))
            offset += num_short + num_candidates
        tokens = Tokens(
            *(torch.cat([getattr(part, name) for part in parts], dim=-1) for name in Tokens._fields)
        )
        x = self._embed(tokens)
        for index, layer in enumerate(self.layers):
            u, q, k, v = layer.project(x)
            outputs = []
            for (begin, _, end), mask, prefix in zip(spans, masks, prefixes, strict=True):
                q_user = q[:, :, begin:end]
                own = self._attend(q_user, k[:, :, begin:end], v[:, :, begin:end], mask)
                outputs.append(own + self._attend(q_user, *prefix.layer(index)))
            x = layer.finish(x, u, torch.cat(outputs, dim=2).div_(self.preset.attn_norm))
        return [self.task_logits(x[:, first:end], tokens.items[:, first:end])[0] for _, first, end in spans]

    @torch.inference_mode()
    def score_batch(self, requests: Sequence[CachedRank]) -> list[Tensor]:
        """The scores [C_i] of `rank_batch`: sigmoid of each user's score task logit."""
        return [torch.sigmoid(logits[:, self.preset.score_task]) for logits in self.rank_batch(requests)]

    @torch.inference_mode()
    def score_padded(self, kv: Tensor, tokens: Tensor, mask: Tensor, num_short: int) -> Tensor:
        """Scores [B, C] (float32) of B users' cached ranks in fixed shapes, for a CUDA graph to capture:
        equal to `score` one user at a time (to float rounding), whatever the padding.

        `kv` [layers, 2, B, H, L, d] holds each user's prefix at the start of its row and zeros after it: a
        zero key scores SiLU(0) = 0 against any query, so padding adds nothing. `tokens` [3, B, n] are the
        item rows, action rows and positions (`Tokens`, from `rank_tokens`) of `num_short` short-term token
        slots then n - num_short candidate slots; `mask` [B, 1, n, n] is each user's M over its real tokens
        (padding sees only itself, and nothing real sees padding).
        """
        x = self._embed(Tokens(*tokens))
        for index, layer in enumerate(self.layers):
            u, q, k, v = layer.project(x)
            o = self._attend(q, k, v, mask) + self._attend(q, kv[index, 0], kv[index, 1])
            x = layer.finish(x, u, o.div_(self.preset.attn_norm))
        logits = self.task_logits(x[:, num_short:], tokens[0, :, num_short:].clamp(min=0))
        return torch.sigmoid(logits[..., self.preset.score_task])

    def check_request(self, batch: int, short_items: Tensor, candidates: Tensor, length: int) -> None:
        """`length`: the prefix's tokens."""
        if short_items.shape[0] != batch or candidates.shape[0] != batch:
            raise ValueError("prefix, short-term events and candidates must have the same batch size")
        if candidates.shape[1] < 1:
            raise ValueError("at least one candidate is needed")
        self._check_events(length // self.tokens_per_event + short_items.shape[1])

    # ---- the reference path: one attention per layer over the whole sequence ----

    def full_pass(self, tokens: Tokens, mask: Tensor) -> _LayerOutputs:
        """Hidden states [B, n, D] and per-layer keys and values of a whole sequence under `mask`
        (broadcastable to [B, H, n, n])."""
        x = self._embed(tokens)
        keys, values = [], []
        for layer in self.layers:
            u, q, k, v = layer.project(x)
            x = layer.finish(x, u, self._attend(q, k, v, mask).div_(self.preset.attn_norm))
            keys.append(k)
            values.append(v)
        return x, keys, values

    def full_inputs(
        self,
        long_items: Tensor,
        long_actions: Tensor,
        short_items: Tensor,
        short_actions: Tensor,
        candidates: Tensor,
    ) -> tuple[Tokens, Tensor]:
        """The whole sequence's tokens and its mask M [n, n]."""
        self.check_request(long_items.shape[0], short_items, candidates, 0)
        self._check_events(long_items.shape[1] + short_items.shape[1])
        history = self.history_tokens(
            torch.cat([long_items, short_items], dim=1), torch.cat([long_actions, short_actions], dim=1), 0
        )
        head = history.items.shape[1]
        cands = self.candidate_tokens(candidates, head)
        tokens = Tokens(*(torch.cat([a, b], dim=-1) for a, b in zip(history, cands, strict=True)))
        return tokens, self._request_mask(head, candidates.shape[1])

    @torch.inference_mode()
    def full_forward(
        self,
        long_items: Tensor,
        long_actions: Tensor,
        short_items: Tensor,
        short_actions: Tensor,
        candidates: Tensor,
    ) -> Tensor:
        """Reference task logits [B, C, T] (float32): the whole sequence, each layer one masked attention."""
        tokens, mask = self.full_inputs(long_items, long_actions, short_items, short_actions, candidates)
        hidden, _, _ = self.full_pass(tokens, mask)
        num_candidates = candidates.shape[1]
        return self.task_logits(hidden[:, -num_candidates:], tokens.items[:, -num_candidates:])


class PrefixBuilder:
    """Computes a prefix's KV one chunk per `step()`, so that the caller can run other work between chunks
    (the ranker's device thread serves a waiting Rank there). All chunks write into one contiguous
    `PrefixKV` buffer allocated once, so chunking copies nothing. Made by `HSTURanker.prefix_builder`; one
    thread steps it at a time.
    """

    def __init__(
        self,
        model: HSTURanker,
        item_ids: Tensor,
        action_types: Tensor,
        chunk_size: int,
        past: PrefixKV | None,
    ) -> None:
        self._model = model
        self._items = item_ids
        self._actions = action_types
        self._chunk_size = chunk_size
        self._per_event = model.tokens_per_event
        self._offset = 0 if past is None else past.length  # tokens
        self._next = 0  # events
        self.length = self._offset + item_ids.shape[1] * self._per_event
        preset = model.preset
        self._kv = PrefixKV.empty(
            preset.num_layers, item_ids.shape[0], preset.num_heads, self.length, preset.head_dim,
            preset.dtype, model.device,
        )  # fmt: skip
        if past is not None:  # one copy of the whole past buffer
            self._kv.buffer[:, :, :, :, : self._offset] = past.to(model.device, preset.dtype).wait().buffer

    @property
    def done(self) -> bool:
        return self._next >= self._items.shape[1]

    @property
    def computed(self) -> int:
        """Tokens whose KV is complete, `past` included."""
        return self._offset + self._next * self._per_event

    @torch.inference_mode()
    def step(self) -> None:
        """Computes the next chunk; does nothing once `done` (so an empty extension needs no special case)."""
        if self.done:
            return
        begin, end = self._next, min(self._next + self._chunk_size, self._items.shape[1])
        items, actions = self._items[:, begin:end], self._actions[:, begin:end]
        self._model._fill(self._kv.buffer, self._offset + begin * self._per_event, items, actions)
        self._next = end

    def result(self) -> PrefixKV:
        if not self.done:
            raise RuntimeError(f"the prefix is incomplete: {self.computed} of {self.length} tokens")
        return self._kv

    def run(self) -> PrefixKV:
        """Steps to the end and returns the PrefixKV."""
        while not self.done:
            self.step()
        return self.result()
