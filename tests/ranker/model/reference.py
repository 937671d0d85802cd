"""The reference path's variants only the exactness tests use, built from the model's whole pass
(`HSTURanker.full_inputs`, `full_pass`): the keys and values of every token, and users of different lengths
in one padded pass."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from services.ranker.model.hstu import HSTURanker, Tokens
from services.ranker.model.prefix_kv import PrefixKV


class UserSequence(NamedTuple):
    """One user's request as 1-D tensors, for `full_forward_batch`."""

    long_items: Tensor
    long_actions: Tensor
    short_items: Tensor
    short_actions: Tensor
    candidates: Tensor


@torch.inference_mode()
def full_kv(
    model: HSTURanker,
    long_items: Tensor,
    long_actions: Tensor,
    short_items: Tensor,
    short_actions: Tensor,
    candidates: Tensor,
) -> PrefixKV:
    """Per-layer keys and values of every token of the reference pass; its first L events' tokens are what
    `pre_infer` must reproduce."""
    tokens, mask = model.full_inputs(long_items, long_actions, short_items, short_actions, candidates)
    _, keys, values = model.full_pass(tokens, mask)
    return PrefixKV(torch.stack([torch.stack(pair) for pair in zip(keys, values, strict=True)]))


@torch.inference_mode()
def full_forward_batch(model: HSTURanker, users: Sequence[UserSequence | tuple[Tensor, ...]]) -> list[Tensor]:
    """Reference task logits [C_i, T] of users of different lengths, in one padded pass.

    Each user's tokens are packed at the start of its row and its mask M fills the top-left corner of the
    padded mask: padding neither sees nor is seen by real tokens, and with a fixed N_norm nothing depends on
    the padded length, so a user's scores do not depend on who else is in the batch.
    """
    if not users:
        return []
    requests = [UserSequence(*(t.unsqueeze(0) for t in user)) for user in users]
    inputs = [model.full_inputs(*request) for request in requests]
    width = max(tokens.items.shape[1] for tokens, _ in inputs)
    items = torch.zeros(len(users), width, dtype=torch.long, device=model.device)
    actions = torch.zeros_like(items)
    positions = torch.zeros_like(items)
    mask = torch.zeros(len(users), 1, width, width, dtype=torch.bool, device=model.device)
    for row, (tokens, user_mask) in enumerate(inputs):
        n = tokens.items.shape[1]
        items[row, :n] = tokens.items[0]
        actions[row, :n] = tokens.actions[0]
        positions[row, :n] = tokens.positions
        mask[row, 0, :n, :n] = user_mask
    hidden, _, _ = model.full_pass(Tokens(items, actions, positions), mask)
    logits = []
    for row, request in enumerate(requests):
        end = inputs[row][0].items.shape[1]
        start = end - request.candidates.shape[1]
        logits.append(model.task_logits(hidden[row : row + 1, start:end], items[row : row + 1, start:end])[0])
    return logits
