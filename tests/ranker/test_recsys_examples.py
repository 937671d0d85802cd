"""NVIDIA recsys-examples HSTU checkpoints, converted and served with relay, equal THEIR math.

A random checkpoint in their layout (`bench.lib.recsys_checkpoints` writes it: static
model-parallel tables, a fused data-parallel table, a dynamicemb dump; bf16 dense weights) is converted with
`python -m services.ranker.convert`, served by an in-process ranker behind an in-process router (gRPC over
loopback), and every score equals the independent fp32 reference of their inference forward
(tests/ranker/recsys_examples.py) at `assert_close` defaults — from HBM, DRAM, extended and miss paths
alike. Malformed checkpoints and configs, non-closed options and unknown item ids are refused by name.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest
import torch
from torch.testing import assert_close

from bench.lib.recsys_checkpoints import cfg_for, write_checkpoint
from relaygr.v1 import common_pb2, ranker_pb2, ranker_pb2_grpc
from services.ranker import convert
from services.ranker.model import recsys_examples
from services.ranker.model.store import load_model_dir
from services.router.config import RouterConfig
from tests.ranker.harness import running_ranker
from tests.ranker.recsys_examples import reference_scores
from tests.router.harness import running_router
from tests.support.polling import eventually

HBM, DRAM = common_pb2.CACHE_SOURCE_HBM, common_pb2.CACHE_SOURCE_DRAM
EXTENDED, MISS = common_pb2.CACHE_SOURCE_EXTENDED, common_pb2.CACHE_SOURCE_MISS


def convert_args(tmp_path: Path, out: Path) -> list[str]:
    ckpt, cfg = str(tmp_path / "ckpt"), str(tmp_path / "cfg.json")
    return ["--source", ckpt, "--source-config", cfg, "--model-dir", str(out)]


def converted(tmp_path: Path, cfg: dict, **writer) -> tuple[Path, dict]:
    checkpoint = write_checkpoint(tmp_path / "ckpt", cfg, **writer)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    out = tmp_path / "model"
    args = convert_args(tmp_path, out)
    assert convert.main(args) == 0
    return out, checkpoint


def sequence(pairs: list[tuple[int, int]]) -> common_pb2.BehaviorSequence:
    return common_pb2.BehaviorSequence(item_ids=[i for i, _ in pairs], action_types=[a for _, a in pairs])


async def serve_and_check(model_dir: Path, cfg: dict, checkpoint: dict, ids: list[int]) -> None:
    """PreInfer/Rank through a router to a ranker serving `model_dir`: HBM, DRAM, extended, miss."""
    actions = cfg["vocab"]["action"]
    long = [(ids[(7 * i) % len(ids)], i % actions) for i in range(25)]  # 50 tokens: past a 40-row table
    short = [(ids[3], 1), (ids[5], 0)]
    cands = [ids[1], ids[2], ids[8], ids[1]]

    def expected(history):
        return reference_scores(checkpoint, cfg, history, cands)

    async with running_ranker(checkpoint=str(model_dir), profile_lengths="8,16") as ranker:
        members = f"ranker-a=127.0.0.1:{ranker.app.grpc.port}"
        config = RouterConfig(
            port=0, metrics_port=-1, rankers=members, health_interval_s=0.05, drain_grace_s=0.5
        )
        async with running_router(config) as router, grpc.aio.insecure_channel(router.address) as channel:
            await asyncio.wait_for(router.wait_serving(), 5)
            await eventually(lambda: len(router.membership.routable()) == 1)
            client = ranker_pb2_grpc.RankerServiceStub(channel)

            async def rank(user: str, history, source) -> None:
                request = ranker_pb2.RankRequest(
                    user_id=user, request_id=f"r-{user}-{len(history)}", long_term=sequence(history),
                    short_term=sequence(short), candidate_item_ids=cands,
                )  # fmt: skip
                answer = await client.Rank(request, timeout=30)
                assert answer.cache_source == source, (user, answer.cache_source, source)
                assert_close(torch.tensor(list(answer.scores)), expected(history + short))

            await client.PreInfer(
                ranker_pb2.PreInferRequest(user_id="u1", long_term=sequence(long)), timeout=30
            )
            await ranker.settle()
            await rank("u1", long, HBM)
            await ranker.settle()
            await rank("u1", long, DRAM)
            await ranker.settle()
            longer = [*long, (ids[4], 2), (ids[6], 3), (ids[9], 1)]
            await rank("u1", longer, EXTENDED)
            await rank("u2", long[:20], MISS)


@pytest.mark.parametrize("tables", ["model_parallel", "data_parallel", "dynamic"])
def test_a_converted_checkpoint_served_through_the_router_equals_their_forward_from_every_path(
    tmp_path, tables
):
    cfg = cfg_for(extra={"other": 7} if tables == "data_parallel" else None)
    model_dir, checkpoint = converted(tmp_path, cfg, tables=tables)
    ids = (
        list(range(cfg["vocab"]["item"]))
        if checkpoint["keys"] is None
        else [int(k) for k in checkpoint["keys"]]
    )
    asyncio.run(serve_and_check(model_dir, cfg, checkpoint, ids))


def test_a_gpu_dlrmv3_sized_checkpoint_converts_and_serves_equal_to_their_forward(tmp_path):
    # gpu-dlrmv3's shape: D 512, 4 heads of 128, 5 layers; bf16 dense weights, served in fp32.
    cfg = cfg_for(heads=4, scaling_seqlen=8192, act="gelu", items=300, actions=8)
    model_dir, checkpoint = converted(
        tmp_path, cfg, dim=512, head_dim=128, layers=5, positions=40, head=(256, 64, 3), seed=3
    )
    asyncio.run(serve_and_check(model_dir, cfg, checkpoint, list(range(300))))


def test_model_level_equality_without_positions_and_without_learnable_input_norm(tmp_path):
    cfg = cfg_for(eps=1e-6)
    model_dir, checkpoint = converted(tmp_path, cfg, positions=0, learnable_input_norm=False, head=(1,))
    model = load_model_dir(model_dir)
    history = [(i * 3 % 50, i % 6) for i in range(12)]
    items = torch.tensor([[i for i, _ in history]])
    acts = torch.tensor([[a for _, a in history]])
    cands = torch.tensor([[4, 9, 31]])
    empty = torch.zeros(1, 0, dtype=torch.long)
    scores = model.score(model.pre_infer(items, acts), empty, empty, cands)[0]
    assert_close(scores, reference_scores(checkpoint, cfg, history, [4, 9, 31]))


def refused(tmp_path: Path, cfg: dict, mutate=None, **writer) -> str:
    write_checkpoint(tmp_path / "ckpt", cfg, **writer)
    if mutate is not None:
        file = tmp_path / "ckpt" / "torch_module" / "model.0.pth"
        saved = torch.load(file, weights_only=True)
        mutate(saved["model_state_dict"])
        torch.save(saved, file)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    args = convert_args(tmp_path, tmp_path / "model")
    with pytest.raises(ValueError) as caught:
        config = recsys_examples.read_config(tmp_path / "cfg.json")
        recsys_examples.convert_recsys_examples(tmp_path / "ckpt", config)
    assert convert.main(args) == 2
    assert not (tmp_path / "model" / "model.json").exists()
    return str(caught.value)


LAYER0 = "_hstu_block._attention_layers.0."
PREPROCESSOR = "_hstu_block._preprocessor._positional_encoder"
TABLE = "_embedding_collection._model_parallel_embedding_collection.embeddings.{}.weight"


@pytest.mark.parametrize(
    ("change", "mutate", "message"),
    [
        (dict(scaling_seqlen=-1), None, "'scaling_seqlen' = -1"),
        (dict(contextual_tables=["user_age"]), None, "'contextual_tables'"),
        (dict(colour="red"), None, "unknown field(s) colour"),
        (dict(act="tanh"), None, "field 'act'"),
        (
            {},
            lambda s: s.__setitem__(TABLE.format("action"), torch.zeros(7, 16)),
            "is [7, 16], expected [6, 16]",
        ),
        ({}, lambda s: s.pop(LAYER0 + "_linear_proj_weight"), f"missing key '{LAYER0}_linear_proj_weight'"),
        (
            {},
            lambda s: s.__setitem__(LAYER0 + "_linear_uvqk_bias", torch.zeros(3)),
            "_linear_uvqk_bias' is [3]",
        ),
        ({}, lambda s: s.__setitem__(LAYER0 + "_linear_uvqk.weight", torch.zeros(2)), "native (unfused"),
        (
            {},
            lambda s: s.__setitem__(f"{PREPROCESSOR}._timestamp_embeddings_weight", torch.zeros(2)),
            "time encoding",
        ),
        (
            {},
            lambda s: s.pop(TABLE.format("item")),
            "table 'item' not found",
        ),
    ],
)
def test_malformed_checkpoints_and_configs_are_refused_by_name(tmp_path, change, mutate, message):
    cfg = {**cfg_for(), **change}
    assert message in refused(tmp_path, cfg, mutate)


def test_a_fused_table_of_the_wrong_size_is_refused_naming_the_key(tmp_path):
    cfg = cfg_for(extra={"other": 7})
    write_checkpoint(tmp_path / "ckpt", cfg, tables="data_parallel")
    cfg["vocab"]["other"] = 8
    with pytest.raises(ValueError, match="action/other/item_weights' has"):
        recsys_examples.convert_recsys_examples(tmp_path / "ckpt", cfg)


def test_unknown_item_ids_are_refused_by_name_over_grpc(tmp_path):
    cfg = cfg_for()
    model_dir, _ = converted(tmp_path, cfg)

    async def main() -> None:
        async with running_ranker(checkpoint=str(model_dir), profile_lengths="8") as ranker:
            request = ranker_pb2.RankRequest(
                user_id="u", request_id="r", long_term=sequence([(1, 0), (2, 1)]), candidate_item_ids=[3, 50]
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await ranker.stub.Rank(request, timeout=10)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "candidate_item_ids: holds item id 50" in caught.value.details()
            bad = ranker_pb2.PreInferRequest(user_id="u", long_term=sequence([(1, 0), (77, 1)]))
            with pytest.raises(grpc.aio.AioRpcError, match=r"long_term\.item_ids: holds item id 77"):
                await ranker.stub.PreInfer(bad, timeout=10)

    asyncio.run(main())


def test_make_run_passes_a_converted_checkpoint_to_every_ranker(tmp_path):
    from services.launcher.fleet import Fleet, FleetConfig

    config = FleetConfig(checkpoint=str(tmp_path / "model"), ranker_args="", log_dir=str(tmp_path / "logs"))
    args = Fleet(config)._ranker_args("ranker-0")
    assert args[args.index("--checkpoint") + 1] == str(tmp_path / "model")
    seeded = FleetConfig(ranker_args="", log_dir=str(tmp_path / "l"))
    assert "--checkpoint" not in Fleet(seeded)._ranker_args("ranker-0")
