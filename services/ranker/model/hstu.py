"""HSTU-style generative-recommendation ranker with exact prefix-KV reuse.

Contract
--------
A request is one token per behaviour event, laid out ``[prefix (L) | short-term (S) | candidates (C)]``.
Prefix token i sits at absolute position i, short-term token j at L + j, and every candidate at L + S.
Each layer attends pointwise (SiLU, no softmax) under the mask M: a prefix or short-term token sees the
prefix and short-term tokens up to itself; a candidate sees every prefix and short-term token and itself,
never another candidate.

*Prefix closure* makes reuse exact: nothing in a prefix token depends on anything after the prefix, on the
request time, the total length or the batch (positions count forward, N_norm is a constant). Hence:

* ``pre_infer`` / ``extend`` / ``PrefixBuilder`` compute the per-layer keys and values of prefix tokens
  alone (`PrefixKV`), in one pass, in chunks, or incrementally as events are appended — all equal to
  float rounding;
* ``rank(pre_infer(prefix), short, candidates)`` equals the reference ``full_forward(prefix, short,
  candidates)`` to float rounding (fp32: ``torch.testing.assert_close`` defaults), for any candidate
  microbatching, candidate order or subset; ``full_forward_batch`` batches users of different lengths
  without changing any user's scores.

Weights come from a generator seeded with ``preset.seed`` (or a checkpoint), so every process builds the
same model on any device. The code is device-agnostic: move the model with ``.to(device)`` and pass inputs on
that device. Item ids are int64 (any value), action types lie in [0, num_action_types). Scores are float32
whatever the compute dtype. The model keeps no state between calls (a `PrefixBuilder` does, and is stepped
by one thread at a time).

One file on purpose: the contract above binds the attention, the layer, the prefix builder and the reference
forward together, and exactness is proved across them (`tests/ranker/model/test_model.py`); split, each part
would restate the mask and position rules it relies on. The KV they produce and consume, `PrefixKV`, lives
apart (`prefix_kv.py`): it is the prefix cache's currency, and the cache and the device code need it, not the
model.
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

from services.ranker.model.prefix_kv import PrefixKV
from services.ranker.model.presets import ModelPreset

# Scale of the embedding tables at initialisation; LayerNorm follows, so only the ratio to the residual
# updates matters.
_EMBED_STD = 0.5
# LayerNorm eps on the attention output, as in HSTU: N_norm makes that output small for short sequences and
# the default 1e-5 would then swamp its variance.
_ATTN_OUT_EPS = 1e-6

# Per layer, the key/value blocks that new tokens see in full (no mask).
_VisibleBlocks = list[list[tuple[Tensor, Tensor]]]
# Last hidden states [B, n, D], then per-layer keys and values [B, H, n, d].
_LayerOutputs = tuple[Tensor, list[Tensor], list[Tensor]]


class UserSequence(NamedTuple):
    """One user's request as 1-D tensors, for `HSTURanker.full_forward_batch`."""

    long_items: Tensor
    long_actions: Tensor
    short_items: Tensor
    short_actions: Tensor
    candidates: Tensor


class CachedRank(NamedTuple):
    """One user's cached rank for `HSTURanker.rank_batch`: its prefix (B == 1) and 1-D tensors of its
    short-term events (S may be 0) and candidates."""

    prefix: PrefixKV
    short_items: Tensor
    short_actions: Tensor
    candidates: Tensor


class _HSTULayer(nn.Module):
    """One HSTU layer, split around its attention so the full and the cached paths share the weights."""

    def __init__(self, preset: ModelPreset) -> None:
        super().__init__()
        self.num_heads = preset.num_heads
        self.head_dim = preset.head_dim
        width = preset.num_heads * preset.head_dim
        self.input_norm = nn.LayerNorm(preset.embed_dim)
        self.uvqk = nn.Linear(preset.embed_dim, 4 * width)
        self.attn_out_norm = nn.LayerNorm(width, eps=_ATTN_OUT_EPS)
        self.output = nn.Linear(width, preset.embed_dim)

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """u [B, n, H·dv] and q, k, v [B, H, n, d] of tokens x [B, n, D]."""
        batch, n, _ = x.shape
        u, v, q, k = F.silu(self.uvqk(self.input_norm(x))).chunk(4, dim=-1)

        def heads(t: Tensor) -> Tensor:
            return t.view(batch, n, self.num_heads, self.head_dim).transpose(1, 2)

        return u, heads(q), heads(k), heads(v)

    def finish(self, x: Tensor, u: Tensor, o: Tensor) -> Tensor:
        """The residual update of x from its gate u and its attention output o [B, H, n, dv]."""
        batch, n, _ = x.shape
        o = o.transpose(1, 2).reshape(batch, n, self.num_heads * self.head_dim)
        return x + self.output(u * self.attn_out_norm(o))


class HSTURanker(nn.Module):
    """HSTU ranker: `pre_infer`/`extend` build a prefix's KV, `rank` scores against it, `full_forward` is
    the reference that recomputes everything in one pass.

    There is no relative attention bias: HSTU buckets timestamp gaps measured from the request's time, which
    would make prefix states depend on when the request arrives. Absolute positions carry the order instead.
    """

    def __init__(self, preset: ModelPreset) -> None:
        super().__init__()
        self.preset = preset
        # The cache's model version; a checkpoint's contents are folded in by `from_checkpoint`.
        self.version = preset.version
        dim = preset.embed_dim
        # Built empty and filled from a seeded generator below: identical in every process, and the global
        # RNG is left untouched.
        with torch.device("meta"):
            self.item_embedding = nn.Embedding(preset.item_buckets, dim)
            # The extra last row is the learned "target" action that marks candidates.
            self.action_embedding = nn.Embedding(preset.num_action_types + 1, dim)
            self.position_embedding = nn.Embedding(preset.max_positions, dim)
            self.layers = nn.ModuleList(_HSTULayer(preset) for _ in range(preset.num_layers))
            self.final_norm = nn.LayerNorm(dim)
            self.head = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, preset.num_tasks))
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
                module.bias.zero_()
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()

    @classmethod
    def from_checkpoint(cls, preset: ModelPreset, path: str | Path) -> HSTURanker:
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

    # ---- small helpers shared by the cached and the reference paths ----

    def _embed(self, item_ids: Tensor, action_types: Tensor, positions: Tensor) -> Tensor:
        if item_ids.shape != action_types.shape:
            raise ValueError(f"{list(item_ids.shape)} item ids but {list(action_types.shape)} action types")
        # Item ids are bucketed by remainder modulo a prime: exact on int64 on every backend, unlike a
        # multiplicative hash whose int64 overflow is not guaranteed to wrap the same way everywhere.
        return (
            self.item_embedding(torch.remainder(item_ids, self.preset.item_buckets))
            + self.action_embedding(action_types)
            + self.position_embedding(positions)
        )

    def _target_actions(self, candidates: Tensor) -> Tensor:
        return torch.full_like(candidates, self.preset.num_action_types)

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

    def _head(self, hidden: Tensor, candidates: Tensor) -> Tensor:
        """Task logits [B, C, T] (float32) from the candidates' last hidden states [B, C, D]."""
        item = self.item_embedding(torch.remainder(candidates, self.preset.item_buckets))
        return self.head(self.final_norm(hidden) * item).float()

    def _causal_mask(self, n: int) -> Tensor:
        return torch.ones(n, n, dtype=torch.bool, device=self.device).tril()

    def _request_mask(self, head: int, num_candidates: int) -> Tensor:
        """M over `head` causal tokens followed by candidates that see all of them and themselves."""
        mask = self._causal_mask(head + num_candidates)
        mask[head:, head:] = torch.eye(num_candidates, dtype=torch.bool, device=self.device)
        return mask

    def _check_positions(self, needed: int) -> None:
        if needed > self.preset.max_positions:
            raise ValueError(
                f"sequence needs {needed} positions; preset {self.preset.name!r} has "
                f"{self.preset.max_positions} (at most {self.preset.max_events} prefix + short-term events)"
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
        """Computes prefix tokens start .. start+n-1 into a PrefixKV buffer whose first `start` are done."""
        n = item_ids.shape[1]
        x = self._embed(item_ids, action_types, torch.arange(start, start + n, device=self.device))
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
        """A `PrefixBuilder` for the events [B, n] appended to `past` (None: from position 0), computed
        `chunk_size` events per step (None: all in one step)."""
        if chunk_size is not None and chunk_size < 1:
            raise ValueError("chunk_size must be positive")
        if past is not None and past.batch_size != item_ids.shape[0]:
            raise ValueError("the prefix and the new events must have the same batch size")
        start = 0 if past is None else past.length
        self._check_positions(start + item_ids.shape[1])
        return PrefixBuilder(self, item_ids, action_types, chunk_size or max(item_ids.shape[1], 1), past)

    @torch.inference_mode()
    def pre_infer(self, item_ids: Tensor, action_types: Tensor, chunk_size: int | None = None) -> PrefixKV:
        """The PrefixKV of the events [B, L], computed `chunk_size` events at a time (None: all at once)."""
        return self.prefix_builder(item_ids, action_types, chunk_size).run()

    @torch.inference_mode()
    def extend(self, past: PrefixKV | None, item_ids: Tensor, action_types: Tensor) -> PrefixKV:
        """A new PrefixKV: `past` (None: empty) followed by the events [B, n] at positions past.length on."""
        return self.prefix_builder(item_ids, action_types, past=past).run()

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
        length, num_short = prefix.length, short_items.shape[1]
        self.check_request(prefix.batch_size, short_items, candidates, length)
        if candidate_microbatch is not None and candidate_microbatch < 1:
            raise ValueError("candidate_microbatch must be positive")
        seen = None
        if num_short:
            positions = torch.arange(length, length + num_short, device=self.device)
            x = self._embed(short_items, short_actions, positions)
            _, short_keys, short_values = self._run_new(x, self._causal_mask(num_short), prefix)
            seen = [[(k, v)] for k, v in zip(short_keys, short_values, strict=True)]
        step = candidate_microbatch or candidates.shape[1]
        position = torch.full((), length + num_short, device=self.device)
        logits = []
        for start in range(0, candidates.shape[1], step):
            chunk = candidates[:, start : start + step]
            x = self._embed(chunk, self._target_actions(chunk), position)
            itself = torch.eye(chunk.shape[1], dtype=torch.bool, device=self.device)
            hidden, _, _ = self._run_new(x, itself, prefix, seen)
            logits.append(self._head(hidden, chunk))
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
        """The scores [B, C] the service returns: sigmoid of the first task's logit of `rank`."""
        logits = self.rank(prefix, short_items, short_actions, candidates, candidate_microbatch)
        return torch.sigmoid(logits[..., 0])

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
        items, actions, positions, spans, masks = [], [], [], [], []
        offset = 0
        for request, prefix in zip(requests, prefixes, strict=True):
            if prefix.batch_size != 1:
                raise ValueError("rank_batch takes one user per prefix (B == 1)")
            short, candidates = request.short_items, request.candidates
            num_short, num_candidates, length = short.shape[0], candidates.shape[0], prefix.length
            self.check_request(1, short[None], candidates[None], length)
            head = length + num_short
            items += [short, candidates]
            actions += [request.short_actions, self._target_actions(candidates)]
            positions += [
                torch.arange(length, head, device=self.device),
                torch.full((num_candidates,), head, device=self.device),
            ]
            spans.append((offset, offset + num_short, offset + num_short + num_candidates))
            masks.append(self._request_mask(num_short, num_candidates))
            offset += num_short + num_candidates
        x = self._embed(torch.cat(items)[None], torch.cat(actions)[None], torch.cat(positions))
        for index, layer in enumerate(self.layers):
            u, q, k, v = layer.project(x)
            outputs = []
            for (begin, _, end), mask, prefix in zip(spans, masks, prefixes, strict=True):
                q_user = q[:, :, begin:end]
                own = self._attend(q_user, k[:, :, begin:end], v[:, :, begin:end], mask)
                outputs.append(own + self._attend(q_user, *prefix.layer(index)))
            x = layer.finish(x, u, torch.cat(outputs, dim=2).div_(self.preset.attn_norm))
        return [
            self._head(x[:, first:end], request.candidates[None])[0]
            for (_, first, end), request in zip(spans, requests, strict=True)
        ]

    @torch.inference_mode()
    def score_batch(self, requests: Sequence[CachedRank]) -> list[Tensor]:
        """The scores [C_i] of `rank_batch`: sigmoid of each user's first task logit."""
        return [torch.sigmoid(logits[:, 0]) for logits in self.rank_batch(requests)]

    @torch.inference_mode()
    def score_padded(self, kv: Tensor, tokens: Tensor, mask: Tensor, num_short: int) -> Tensor:
        """Scores [B, C] (float32) of B users' cached ranks in fixed shapes, for a CUDA graph to capture:
        equal to `score` one user at a time (to float rounding), whatever the padding.

        `kv` [layers, 2, B, H, L, d] holds each user's prefix at the start of its row and zeros after it: a
        zero key scores SiLU(0) = 0 against any query, so padding adds nothing. `tokens` [3, B, n] are the
        item ids, action types and positions of `num_short` short-term slots then n - num_short candidate
        slots; `mask` [B, 1, n, n] is each user's M over its real tokens (padding sees only itself, and
        nothing real sees padding).
        """
        items, actions, positions = tokens
        x = self._embed(items, actions, positions)
        for index, layer in enumerate(self.layers):
            u, q, k, v = layer.project(x)
            o = self._attend(q, k, v, mask) + self._attend(q, kv[index, 0], kv[index, 1])
            x = layer.finish(x, u, o.div_(self.preset.attn_norm))
        return torch.sigmoid(self._head(x[:, num_short:], items[:, num_short:])[..., 0])

    def check_request(self, batch: int, short_items: Tensor, candidates: Tensor, length: int) -> None:
        if short_items.shape[0] != batch or candidates.shape[0] != batch:
            raise ValueError("prefix, short-term events and candidates must have the same batch size")
        if candidates.shape[1] < 1:
            raise ValueError("at least one candidate is needed")
        self._check_positions(length + short_items.shape[1] + 1)

    # ---- the reference path: one attention per layer over the whole sequence ----

    def _full_pass(self, items: Tensor, actions: Tensor, positions: Tensor, mask: Tensor) -> _LayerOutputs:
        """Hidden states [B, n, D] and per-layer keys and values of a whole sequence under `mask`
        (broadcastable to [B, H, n, n])."""
        x = self._embed(items, actions, positions)
        keys, values = [], []
        for layer in self.layers:
            u, q, k, v = layer.project(x)
            x = layer.finish(x, u, self._attend(q, k, v, mask).div_(self.preset.attn_norm))
            keys.append(k)
            values.append(v)
        return x, keys, values

    def _full_inputs(
        self,
        long_items: Tensor,
        long_actions: Tensor,
        short_items: Tensor,
        short_actions: Tensor,
        candidates: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Tokens [B, n], actions [B, n], positions [n] and the mask M [n, n] of the whole sequence."""
        length, num_short, num_candidates = long_items.shape[1], short_items.shape[1], candidates.shape[1]
        self.check_request(long_items.shape[0], short_items, candidates, length)
        head = length + num_short
        items = torch.cat([long_items, short_items, candidates], dim=1)
        actions = torch.cat([long_actions, short_actions, self._target_actions(candidates)], dim=1)
        positions = torch.cat([
            torch.arange(head, device=self.device),
            torch.full((num_candidates,), head, device=self.device),
        ])  # fmt: skip
        return items, actions, positions, self._request_mask(head, num_candidates)

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
        inputs = self._full_inputs(long_items, long_actions, short_items, short_actions, candidates)
        hidden, _, _ = self._full_pass(*inputs)
        return self._head(hidden[:, long_items.shape[1] + short_items.shape[1] :], candidates)

    @torch.inference_mode()
    def full_kv(
        self,
        long_items: Tensor,
        long_actions: Tensor,
        short_items: Tensor,
        short_actions: Tensor,
        candidates: Tensor,
    ) -> PrefixKV:
        """Per-layer keys and values of every token (L + S + C) of the reference pass; its first L tokens
        are what `pre_infer` must reproduce."""
        inputs = self._full_inputs(long_items, long_actions, short_items, short_actions, candidates)
        _, keys, values = self._full_pass(*inputs)
        return PrefixKV(torch.stack([torch.stack(pair) for pair in zip(keys, values, strict=True)]))

    @torch.inference_mode()
    def full_forward_batch(self, users: Sequence[UserSequence | tuple[Tensor, ...]]) -> list[Tensor]:
        """Reference task logits [C_i, T] of users of different lengths, in one padded pass.

        Each user's tokens are packed at the start of its row and its mask M fills the top-left corner of the
        padded mask: padding neither sees nor is seen by real tokens, and with a fixed N_norm nothing depends
        on the padded length, so a user's scores do not depend on who else is in the batch.
        """
        if not users:
            return []
        requests = [UserSequence(*(t.unsqueeze(0) for t in user)) for user in users]
        inputs = [self._full_inputs(*request) for request in requests]
        width = max(items.shape[1] for items, _, _, _ in inputs)
        items = torch.zeros(len(users), width, dtype=torch.long, device=self.device)
        actions = torch.zeros_like(items)
        positions = torch.zeros_like(items)
        mask = torch.zeros(len(users), 1, width, width, dtype=torch.bool, device=self.device)
        for row, (user_items, user_actions, user_positions, user_mask) in enumerate(inputs):
            n = user_items.shape[1]
            items[row, :n] = user_items[0]
            actions[row, :n] = user_actions[0]
            positions[row, :n] = user_positions
            mask[row, 0, :n, :n] = user_mask
        hidden, _, _ = self._full_pass(items, actions, positions, mask)
        logits = []
        for row, request in enumerate(requests):
            end = inputs[row][0].shape[1]
            start = end - request.candidates.shape[1]
            logits.append(self._head(hidden[row : row + 1, start:end], request.candidates)[0])
        return logits


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
        self._offset = 0 if past is None else past.length
        self._next = 0
        self.length = self._offset + item_ids.shape[1]
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
        return self._offset + self._next

    @torch.inference_mode()
    def step(self) -> None:
        """Computes the next chunk; does nothing once `done` (so an empty extension needs no special case)."""
        if self.done:
            return
        begin, end = self._next, min(self._next + self._chunk_size, self._items.shape[1])
        items, actions = self._items[:, begin:end], self._actions[:, begin:end]
        self._model._fill(self._kv.buffer, self._offset + begin, items, actions)
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
