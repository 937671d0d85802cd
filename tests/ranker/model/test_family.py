"""The model family: every combination of options keeps the exactness contract, presets keep their versions,
options that break prefix closure are refused by name, model.json round-trips and refuses what does not fit.

Exactness, for random option combinations (hypothesis), fp32 `assert_close` defaults:
cached (chunked pre-infer, extension, microbatched rank) = full; rank_batch = rank one user at a time;
score_padded (the CUDA-graph packing) = score; full_forward_batch = full_forward one at a time.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from services.ranker.device.accelerator import Accelerator
from services.ranker.device.graphs import RankGraphs
from services.ranker.model.family import ModelConfig, NotClosedError
from services.ranker.model.hstu import CachedRank, HSTURanker
from services.ranker.model.layers import UnknownItemError
from services.ranker.model.presets import PRESETS
from tests.ranker.model.reference import full_forward_batch, full_kv

BASE = dict(name="family", embed_dim=16, num_heads=2, head_dim=8, num_layers=2, dtype=torch.float32,
            attn_norm=64.0, item_buckets=97, num_action_types=5)  # fmt: skip


@st.composite
def configs(draw) -> ModelConfig:
    head = draw(st.sampled_from(["hstu", "l2_mlp"]))
    num_tasks = draw(st.integers(1, 3))
    clamp = draw(st.booleans())
    return ModelConfig(
        **BASE,
        num_tasks=num_tasks,
        score_task=draw(st.integers(0, num_tasks - 1)),
        # A short table when clamping, so that clamped positions occur.
        max_positions=24 if clamp else 256,
        position_clamp=clamp,
        event_limit=100 if clamp else 0,
        item_ids=draw(st.sampled_from(["hashed", "rows", "keys"])),
        input_norm_eps=draw(st.sampled_from([1e-5, 1e-6, 1e-3])),
        input_norm_affine=draw(st.booleans()),
        attn_out_norm_eps=draw(st.sampled_from([1e-6, 1e-5])),
        embed_scale=draw(st.sampled_from([1.0, 4.0])),
        uvqk_bias=draw(st.booleans()),
        output_bias=draw(st.booleans()),
        silu=draw(st.sampled_from(["uvqk", "u", "uv", "qk", "vqk"])),
        output=draw(st.sampled_from(["gated", "concat"])),
        residual=draw(st.booleans()),
        token_layout=draw(st.sampled_from(["event", "item_action"])),
        positions=draw(st.booleans()),
        candidate_token=draw(st.sampled_from(["target_action", "item"])),
        head=head,
        head_hidden=tuple(draw(st.lists(st.integers(4, 12), max_size=2))) if head == "l2_mlp" else (),
        head_act=draw(st.sampled_from(["relu", "gelu"])),
        head_bias=draw(st.booleans()),
        seed=draw(st.integers(0, 1000)),
    )


def events(config: ModelConfig, generator: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    high = 2**40 if config.item_ids == "hashed" else config.item_buckets
    return (
        torch.randint(0, high, (1, n), generator=generator),
        torch.randint(0, config.num_action_types, (1, n), generator=generator),
    )


def candidates(config: ModelConfig, generator: torch.Generator, n: int) -> torch.Tensor:
    return events(config, generator, n)[0]


@settings(max_examples=40, deadline=None)
@given(
    config=configs(),
    length=st.integers(1, 30),
    appended=st.integers(0, 6),
    num_short=st.integers(0, 5),
    num_candidates=st.integers(1, 9),
    chunk=st.integers(1, 12),
    seed=st.integers(0, 2**16),
)
def test_cached_equals_full_for_every_option_combination(
    config, length, appended, num_short, num_candidates, chunk, seed
):
    model = HSTURanker(config)
    generator = torch.Generator().manual_seed(seed)
    long_items, long_actions = events(config, generator, length + appended)
    short_items, short_actions = events(config, generator, num_short)
    cands = candidates(config, generator, num_candidates)
    full = model.full_forward(long_items, long_actions, short_items, short_actions, cands)
    assert full.shape == (1, num_candidates, config.num_tasks) and full.dtype == torch.float32
    # Chunked pre-inference of the first `length` events, then extension by the rest.
    base = model.pre_infer(long_items[:, :length], long_actions[:, :length], chunk_size=chunk)
    prefix = model.extend(base, long_items[:, length:], long_actions[:, length:])
    assert prefix.length == (length + appended) * config.tokens_per_event
    reference_kv = full_kv(model, long_items, long_actions, short_items, short_actions, cands)
    assert_close(prefix.buffer, reference_kv.buffer[..., : prefix.length, :])
    assert_close(model.rank(prefix, short_items, short_actions, cands), full)
    assert_close(model.rank(prefix, short_items, short_actions, cands, candidate_microbatch=2), full)
    one = CachedRank(prefix, short_items[0], short_actions[0], cands[0])
    scores = model.score(prefix, short_items, short_actions, cands)[0]
    assert_close(scores, torch.sigmoid(full[0, :, config.score_task]))
    # Batched with another user of another length = one at a time, cached and full.
    other_items, other_actions = events(config, generator, 3)
    other_short = events(config, generator, 2)
    other_cands = candidates(config, generator, 4)
    other = CachedRank(
        model.pre_infer(other_items, other_actions), other_short[0][0], other_short[1][0], other_cands[0]
    )
    batched = model.rank_batch([one, other])
    assert_close(batched[0], full[0])
    assert_close(batched[1], model.rank(other.prefix, other_short[0], other_short[1], other_cands)[0])
    full_batch = full_forward_batch(model, [
        (long_items[0], long_actions[0], short_items[0], short_actions[0], cands[0]),
        (other_items[0], other_actions[0], other_short[0][0], other_short[1][0], other_cands[0]),
    ])  # fmt: skip
    assert_close(full_batch[0], full[0])
    # The CUDA-graph packing (run eagerly on CPU) = the eager score.
    graphs = RankGraphs(model, Accelerator(torch.device("cpu")), (64, 256), 4, capture=False)
    padded = graphs.scores([one, other])
    assert padded is not None
    assert_close(padded[0], scores)
    assert_close(padded[1], model.score(other.prefix, other_short[0], other_short[1], other_cands)[0])


def test_presets_are_configs_of_the_family_with_unchanged_versions():
    # The versions the presets had before the family existed: caches, GPU results and checkpoints use them.
    assert PRESETS["cpu-tiny"].version == "cpu-tiny-a19cbdd9722c"
    assert PRESETS["cpu-small"].version == "cpu-small-d30dbc1e1b1f"
    assert PRESETS["gpu-dlrmv3"].version == "gpu-dlrmv3-703b778a7ef3"
    tiny = PRESETS["cpu-tiny"]
    assert all(isinstance(p, ModelConfig) for p in PRESETS.values())
    # Any family option away from its default changes the version.
    changes = [
        dict(embed_scale=2.0), dict(silu="u"), dict(token_layout="item_action"), dict(head="l2_mlp"),
        dict(input_norm_eps=1e-6), dict(output_bias=False), dict(position_clamp=True),
    ]  # fmt: skip
    for change in changes:
        assert dataclasses.replace(tiny, **change).version != tiny.version, change


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("position_origin", "end"),
        ("time_features", "request_relative"),
        ("attn_norm", "batch_max"),
        ("contextual_tokens", 2),
    ],
)
def test_options_that_break_prefix_closure_are_refused_by_name(option, value):
    with pytest.raises(NotClosedError, match=f"cannot relay: {option}="):
        ModelConfig(**{**BASE, option: value})
    document = {**ModelConfig(**BASE).to_json(), option: value}
    with pytest.raises(NotClosedError, match=option):
        ModelConfig.from_json(document)


def test_model_json_round_trips_and_names_what_does_not_fit():
    config = ModelConfig(**BASE, token_layout="item_action", head="l2_mlp", head_hidden=(8, 4), silu="uq")
    again = ModelConfig.from_json(json.loads(config.dumps()))
    assert again == config and again.version == config.version
    document = config.to_json()
    with pytest.raises(ValueError, match=r"unknown field.*colour"):
        ModelConfig.from_json({**document, "colour": "red"})
    with pytest.raises(ValueError, match=r"missing field.*embed_dim"):
        ModelConfig.from_json({k: v for k, v in document.items() if k != "embed_dim"})
    with pytest.raises(ValueError, match="'num_heads' has the wrong type"):
        ModelConfig.from_json({**document, "num_heads": "two"})
    with pytest.raises(ValueError, match="dtype must be one of"):
        ModelConfig.from_json({**document, "dtype": "int8"})
    with pytest.raises(ValueError, match="token_layout must be one of"):
        ModelConfig.from_json({**document, "token_layout": "action_item"})


@pytest.mark.parametrize("item_ids", ["rows", "keys"])
def test_an_imported_table_refuses_an_unknown_item_id_by_name(item_ids):
    model = HSTURanker(ModelConfig(**BASE, item_ids=item_ids))
    if item_ids == "keys":
        model.item_index.keys.copy_(torch.arange(97) * 10)
    known = 960 if item_ids == "keys" else 96
    unknown = 961 if item_ids == "keys" else 97
    prefix = model.pre_infer(torch.tensor([[known]]), torch.tensor([[0]]))
    with pytest.raises(UnknownItemError, match=f"unknown item id {unknown}"):
        model.score(prefix, torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 0, dtype=torch.long),
                    torch.tensor([[known, unknown]]))  # fmt: skip
    with pytest.raises(UnknownItemError, match="unknown item id -1"):
        model.pre_infer(torch.tensor([[-1]]), torch.tensor([[0]]))
    assert model.item_index.unknown([known, unknown]) == unknown
    assert model.item_index.unknown([known]) is None
