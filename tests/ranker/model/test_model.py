"""The HSTU ranker's contract: cached ranking is exact, and nothing a cache relies on can drift.

Everything runs on the `cpu-tiny` preset in fp32, where "equal" means `torch.testing.assert_close` defaults.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import NamedTuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from services.common.presets import MODEL_PRESET_NAMES
from services.ranker.model.hstu import HSTURanker
from services.ranker.model.prefix_kv import PrefixKV
from services.ranker.model.presets import PRESETS, get_preset
from tests.ranker.model.reference import UserSequence, full_forward_batch, full_kv

TINY = get_preset("cpu-tiny")
MAX_ITEM_ID = 2**63 - 1
# Well above float32 rounding of logits of order one (assert_close's atol is 1e-5).
DETECTABLE = 1e-4

examples = settings(max_examples=15, deadline=None)


class Request(NamedTuple):
    """A batch of requests of equal lengths: tensors [B, ...]."""

    long_items: torch.Tensor
    long_actions: torch.Tensor
    short_items: torch.Tensor
    short_actions: torch.Tensor
    candidates: torch.Tensor


def make_request(seed: int, batch: int, length: int, num_short: int, num_candidates: int) -> Request:
    generator = torch.Generator().manual_seed(seed)

    def items(n: int) -> torch.Tensor:
        return torch.randint(0, MAX_ITEM_ID, (batch, n), generator=generator)

    def actions(n: int) -> torch.Tensor:
        return torch.randint(0, TINY.num_action_types, (batch, n), generator=generator)

    long_items, long_actions = items(length), actions(length)
    return Request(long_items, long_actions, items(num_short), actions(num_short), items(num_candidates))


def cached_rank(model: HSTURanker, request: Request, **kwargs: int) -> torch.Tensor:
    prefix = model.pre_infer(request.long_items, request.long_actions)
    return model.rank(prefix, request.short_items, request.short_actions, request.candidates, **kwargs)


def assert_kv_close(actual: PrefixKV, expected: PrefixKV) -> None:
    assert actual.length == expected.length
    assert len(actual.keys) == len(expected.keys) == TINY.num_layers
    for layer in range(len(expected.keys)):
        assert_close(actual.keys[layer], expected.keys[layer])
        assert_close(actual.values[layer], expected.values[layer])


@pytest.fixture(scope="module")
def model() -> HSTURanker:
    return HSTURanker(TINY)


# ---- prefix closure and exact reuse ----


@examples
@given(
    length=st.integers(1, 40),
    num_short=st.integers(0, 5),
    num_candidates=st.integers(1, 6),
    batch=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
def test_pre_infer_kv_equals_the_prefix_rows_of_the_full_pass(
    model: HSTURanker, length: int, num_short: int, num_candidates: int, batch: int, seed: int
) -> None:
    request = make_request(seed, batch, length, num_short, num_candidates)
    full = full_kv(model, *request)
    prefix = model.pre_infer(request.long_items, request.long_actions)

    assert full.length == length + num_short + num_candidates
    for layer in range(TINY.num_layers):
        assert prefix.keys[layer].shape == (batch, TINY.num_heads, length, TINY.head_dim)
        assert prefix.keys[layer].is_contiguous() and prefix.values[layer].is_contiguous()
        assert_close(prefix.keys[layer], full.keys[layer][:, :, :length])
        assert_close(prefix.values[layer], full.values[layer][:, :, :length])
    # Short-term tokens follow the prefix's causal rule, so they too are computable without the candidates.
    head = model.extend(prefix, request.short_items, request.short_actions)
    for layer in range(TINY.num_layers):
        assert_close(head.keys[layer], full.keys[layer][:, :, : length + num_short])
        assert_close(head.values[layer], full.values[layer][:, :, : length + num_short])


@pytest.mark.parametrize("num_candidates", [1, 3, 17])
@pytest.mark.parametrize("num_short", [0, 1, 5])
@pytest.mark.parametrize("length", [1, 7, 64, 129])
def test_cached_rank_equals_full_forward(
    model: HSTURanker, length: int, num_short: int, num_candidates: int
) -> None:
    request = make_request(length + num_short + num_candidates, 2, length, num_short, num_candidates)
    expected = model.full_forward(*request)

    actual = cached_rank(model, request)

    assert actual.shape == (2, num_candidates, TINY.num_tasks)
    assert actual.dtype == torch.float32
    assert_close(actual, expected)


def test_cached_rank_equals_full_forward_on_cpu_small() -> None:
    small = HSTURanker(get_preset("cpu-small"))
    request = make_request(7, 1, 300, 16, 64)

    assert_close(cached_rank(small, request, candidate_microbatch=24), small.full_forward(*request))


def test_score_is_the_sigmoid_of_the_first_task(model: HSTURanker) -> None:
    request = make_request(3, 2, 20, 2, 5)
    prefix = model.pre_infer(request.long_items, request.long_actions)

    scores = model.score(prefix, request.short_items, request.short_actions, request.candidates)

    assert scores.shape == (2, 5)
    assert_close(scores, torch.sigmoid(model.full_forward(*request)[..., 0]))


# ---- candidates are scored independently ----


@examples
@given(data=st.data(), num_candidates=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_candidate_order_subset_and_microbatch_do_not_change_scores(
    model: HSTURanker, data: st.DataObject, num_candidates: int, seed: int
) -> None:
    request = make_request(seed, 2, 19, 3, num_candidates)
    prefix = model.pre_infer(request.long_items, request.long_actions)

    def rank(candidates: torch.Tensor, microbatch: int | None = None) -> torch.Tensor:
        return model.rank(prefix, request.short_items, request.short_actions, candidates, microbatch)

    everyone = rank(request.candidates)
    order = torch.tensor(data.draw(st.permutations(range(num_candidates))))
    subset = torch.tensor(data.draw(st.lists(st.integers(0, num_candidates - 1), min_size=1, unique=True)))
    microbatch = data.draw(st.integers(1, num_candidates + 2))

    assert_close(rank(request.candidates[:, order]), everyone[:, order])
    assert_close(rank(request.candidates[:, subset]), everyone[:, subset])
    assert_close(rank(request.candidates, microbatch), everyone)
    reordered = request._replace(candidates=request.candidates[:, order])
    assert_close(model.full_forward(*reordered), everyone[:, order])


def test_candidates_are_scored_differently(model: HSTURanker) -> None:
    logits = cached_rank(model, make_request(5, 1, 30, 2, 10))

    assert logits[0, :, 0].std() > 0.05


# ---- batching ----


def test_a_users_scores_do_not_depend_on_the_batch(model: HSTURanker) -> None:
    shapes = [(5, 0, 3), (40, 7, 11), (1, 2, 1), (23, 1, 6)]
    users = [UserSequence(*(t[0] for t in make_request(i, 1, *shape))) for i, shape in enumerate(shapes)]
    alone = [model.full_forward(*(t.unsqueeze(0) for t in user))[0] for user in users]

    batched = full_forward_batch(model, users)
    reversed_batch = full_forward_batch(model, users[::-1])[::-1]

    for user, expected, got, got_reversed in zip(users, alone, batched, reversed_batch, strict=True):
        assert got.shape == (len(user.candidates), TINY.num_tasks)
        assert_close(got, expected)
        assert_close(got_reversed, expected)
        assert_close(cached_rank(model, Request(*(t.unsqueeze(0) for t in user)))[0], expected)


def test_batched_pre_infer_and_rank_equal_per_user_ones(model: HSTURanker) -> None:
    request = make_request(11, 3, 25, 4, 6)
    batched = model.pre_infer(request.long_items, request.long_actions)
    users = [model.pre_infer(request.long_items[[i]], request.long_actions[[i]]) for i in range(3)]

    for i, user in enumerate(users):
        assert_kv_close(batched.user(i), user)
    restacked = PrefixKV.stack([batched.user(i) for i in range(3)])
    assert_close(
        model.rank(restacked, request.short_items, request.short_actions, request.candidates),
        model.full_forward(*request),
    )
    with pytest.raises(ValueError, match="one length"):
        PrefixKV.stack([users[0], model.pre_infer(request.long_items[:1, :5], request.long_actions[:1, :5])])


# ---- a stale prefix must be visible ----


@pytest.mark.parametrize("field", ["item", "action"])
@pytest.mark.parametrize("position", [0, 24, 47])
def test_a_stale_prefix_changes_the_scores(model: HSTURanker, field: str, position: int) -> None:
    request = make_request(13, 1, 48, 3, 8)
    items, actions = request.long_items.clone(), request.long_actions.clone()
    if field == "item":
        items[0, position] += 1
    else:
        actions[0, position] = (actions[0, position] + 1) % TINY.num_action_types
    fresh = model.pre_infer(items, actions)
    stale = model.pre_infer(request.long_items, request.long_actions)

    def rank(prefix: PrefixKV) -> torch.Tensor:
        return model.rank(prefix, request.short_items, request.short_actions, request.candidates)

    assert (rank(fresh) - rank(stale)).abs().max() > DETECTABLE


# ---- building a prefix: chunks, extension, the builder ----


@pytest.mark.parametrize("chunk_size", [1, 3, 16, 37, 50])
def test_chunked_pre_infer_equals_unchunked(model: HSTURanker, chunk_size: int) -> None:
    request = make_request(17, 2, 37, 0, 1)

    chunked = model.pre_infer(request.long_items, request.long_actions, chunk_size=chunk_size)

    assert_kv_close(chunked, model.pre_infer(request.long_items, request.long_actions))


@pytest.mark.parametrize("split", [[0], [1], [20], [39], [5, 17, 30]])
def test_extending_a_prefix_equals_pre_inferring_all_of_it(model: HSTURanker, split: list[int]) -> None:
    request = make_request(19, 1, 40, 0, 1)
    items, actions = request.long_items, request.long_actions
    bounds = [*split, 40]
    prefix = model.pre_infer(items[:, : bounds[0]], actions[:, : bounds[0]])
    first_keys = prefix.keys[0].clone()

    extended = prefix
    for begin, end in itertools.pairwise(bounds):
        extended = model.extend(extended, items[:, begin:end], actions[:, begin:end])

    assert_kv_close(extended, model.pre_infer(items, actions))
    assert torch.equal(prefix.keys[0], first_keys), "extend must not modify the prefix it extends"
    assert_kv_close(model.extend(None, items, actions), model.pre_infer(items, actions))


def test_the_builder_computes_one_chunk_per_step(model: HSTURanker) -> None:
    request = make_request(23, 1, 10, 0, 1)
    past = model.pre_infer(request.long_items[:, :3], request.long_actions[:, :3])
    items, actions = request.long_items[:, 3:], request.long_actions[:, 3:]
    builder = model.prefix_builder(items, actions, chunk_size=3, past=past)

    progress = [builder.computed]
    with pytest.raises(RuntimeError, match="incomplete"):
        builder.result()
    while not builder.done:
        builder.step()
        progress.append(builder.computed)

    assert progress == [3, 6, 9, 10]
    assert_kv_close(builder.result(), model.pre_infer(request.long_items, request.long_actions))
    builder.step()
    assert builder.computed == 10


def test_an_empty_extension_is_a_copy_of_the_prefix(model: HSTURanker) -> None:
    request = make_request(27, 1, 6, 0, 1)
    past = model.pre_infer(request.long_items, request.long_actions)
    builder = model.prefix_builder(request.long_items[:, :0], request.long_actions[:, :0], past=past)

    assert builder.done
    builder.step()
    assert_kv_close(builder.result(), past)


def test_a_prefix_stored_lossily_still_ranks_close(model: HSTURanker) -> None:
    request = make_request(29, 1, 64, 4, 9)
    prefix = model.pre_infer(request.long_items, request.long_actions)
    stored = prefix.to(dtype=torch.bfloat16)

    assert stored.nbytes() * 2 == prefix.nbytes()
    lossy = model.rank(stored, request.short_items, request.short_actions, request.candidates)
    exact = model.rank(prefix, request.short_items, request.short_actions, request.candidates)
    assert lossy.dtype == torch.float32
    assert_close(lossy, exact, atol=2e-2, rtol=0)


# ---- inputs and limits ----


def test_item_ids_are_hashed_by_remainder_and_any_int64_is_accepted(model: HSTURanker) -> None:
    request = make_request(31, 1, 12, 2, 4)
    candidates = torch.tensor([[5, 5 + TINY.item_buckets, MAX_ITEM_ID, MAX_ITEM_ID % TINY.item_buckets]])

    logits = cached_rank(model, request._replace(candidates=candidates))

    assert_close(logits[0, 0], logits[0, 1])
    assert_close(logits[0, 2], logits[0, 3])
    assert (logits[0, 0] - logits[0, 2]).abs().max() > DETECTABLE


def test_sequences_beyond_the_position_table_are_refused() -> None:
    short_table = HSTURanker(dataclasses.replace(TINY, max_positions=16))
    request = make_request(37, 1, 15, 1, 2)

    with pytest.raises(ValueError, match="positions"):
        short_table.full_forward(*request)
    prefix = short_table.pre_infer(request.long_items, request.long_actions)
    with pytest.raises(ValueError, match="positions"):
        short_table.rank(prefix, request.short_items, request.short_actions, request.candidates)
    # 15 events and the candidates' position fit exactly.
    no_short = request.short_items[:, :0]
    assert short_table.rank(prefix, no_short, no_short, request.candidates).shape == (1, 2, TINY.num_tasks)


def test_bf16_compute_tracks_fp32_and_returns_float32() -> None:
    bf16 = HSTURanker(dataclasses.replace(TINY, dtype=torch.bfloat16))
    request = make_request(41, 1, 32, 3, 5)

    cached = cached_rank(bf16, request)

    assert cached.dtype == torch.float32
    assert bf16.pre_infer(request.long_items, request.long_actions).dtype == torch.bfloat16
    assert_close(cached, bf16.full_forward(*request), atol=5e-2, rtol=0)
    assert_close(cached, HSTURanker(TINY).full_forward(*request), atol=1e-1, rtol=0)


# ---- weights and presets ----


def test_weights_come_from_the_seed_and_leave_the_global_rng_alone() -> None:
    rng = torch.random.get_rng_state()
    first, second = HSTURanker(TINY).state_dict(), HSTURanker(TINY).state_dict()
    other = HSTURanker(dataclasses.replace(TINY, seed=1)).state_dict()

    assert torch.equal(torch.random.get_rng_state(), rng)
    assert first.keys() == second.keys() == other.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert not torch.equal(first["item_embedding.weight"], other["item_embedding.weight"])
    assert not torch.equal(first["layers.0.uvqk.weight"], other["layers.0.uvqk.weight"])


def test_from_checkpoint_round_trips_a_state_dict(tmp_path) -> None:
    trained = HSTURanker(dataclasses.replace(TINY, seed=5))
    path = tmp_path / "ranker.pt"
    torch.save(trained.state_dict(), path)
    request = make_request(43, 1, 9, 2, 4)

    loaded = HSTURanker.from_checkpoint(TINY, path)

    expected = trained.state_dict()
    assert all(torch.equal(tensor, expected[name]) for name, tensor in loaded.state_dict().items())
    assert torch.equal(cached_rank(loaded, request), cached_rank(trained, request))
    assert loaded.version.startswith(TINY.version) and loaded.version != TINY.version
    state = trained.state_dict()
    del state["final_norm.bias"]
    torch.save(state, path)
    with pytest.raises(RuntimeError, match=r"final_norm\.bias"):
        HSTURanker.from_checkpoint(TINY, path)


def test_presets_have_the_briefs_shapes() -> None:
    shapes = {
        name: (p.embed_dim, p.num_heads, p.head_dim, p.num_layers, p.dtype) for name, p in PRESETS.items()
    }

    assert shapes == {
        "cpu-tiny": (32, 2, 16, 2, torch.float32),
        "cpu-small": (64, 2, 32, 2, torch.float32),
        "gpu-dlrmv3": (512, 4, 128, 5, torch.bfloat16),
    }
    assert [p.kv_bytes_per_token for p in PRESETS.values()] == [512, 1024, 10240]
    assert get_preset("cpu-small").max_events >= 8192 + 512
    # The names the launcher and bench/ accept (and refuse others by) before they start a ranker.
    assert tuple(PRESETS) == MODEL_PRESET_NAMES


def test_kv_bytes_per_token_is_what_a_prefix_occupies(model: HSTURanker) -> None:
    request = make_request(47, 2, 21, 0, 1)
    prefix = model.pre_infer(request.long_items, request.long_actions)

    assert prefix.nbytes() == 2 * 21 * TINY.kv_bytes_per_token


def test_preset_version_is_stable_and_tracks_every_field() -> None:
    assert TINY.version == dataclasses.replace(TINY).version
    assert TINY.version.startswith("cpu-tiny-")
    assert dataclasses.replace(TINY, seed=1).version != TINY.version
    assert dataclasses.replace(TINY, attn_norm=512.0).version != TINY.version
    assert len({p.version for p in PRESETS.values()}) == len(PRESETS)


def test_an_unknown_preset_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="cpu-tiny, cpu-small, gpu-dlrmv3"):
        get_preset("gpu-large")
