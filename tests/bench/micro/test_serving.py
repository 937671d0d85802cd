"""bench.micro.serving end to end: a real ranker, the serving floor and the null-model ranker in child
processes, driven by relayed pairs; what it reads back adds up (no timing is asserted: figures are the
benchmark's)."""

from __future__ import annotations

import json
import os

import pytest

from bench.micro.serving.__main__ import main
from bench.micro.serving.cpu import THREAD_GROUPS
from bench.micro.serving.stages import classify
from bench.micro.serving.summary import summary

HBM = "CACHE_SOURCE_HBM"


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("serving")
    main(
        [
            "--lengths", "48,96", "--pairs", "12", "--warmup-pairs", "2", "--rate", "20",
            "--candidates", "32", "--candidate-counts", "8", "--capacity-rates", "40",
            "--capacity-seconds", "0.5", "--idle-pairs", "3", "--out", str(out),
        ]
    )  # fmt: skip
    written = json.loads((out / "results.json").read_text())
    written["summary"] = (out / "summary.md").read_text()
    return written


def test_every_rank_of_every_process_is_answered_and_the_rankers_are_hbm_hits(result):
    for row in result["points"] + result["null_model"]:
        assert row["sources"] == {HBM: row["pairs"]} and row["errors"] == {}
    (capacity,) = result["capacity"]
    assert capacity["rate"] == 40 and capacity["pairs"] == 20
    assert sum(capacity["sources"].values()) + sum(capacity["errors"].values()) == 20
    assert [(r["length"], r["candidates"]) for r in result["points"]] == [(48, 32), (96, 32), (48, 8)]
    for idle in result["idle"].values():
        assert idle["sources"] == {HBM: 3}


def test_the_model_is_subtracted_by_its_own_cpu_time_and_the_parts_add_up(result):
    for row in result["points"]:
        cpu = row["cpu_ms"]
        # The passes run on the device thread, whose /proc time moves in clock ticks (two per reading).
        ticks_ms = 2 * 1000 / os.sysconf("SC_CLK_TCK") / row["pairs"]
        assert 0 < row["model_ms"] <= cpu["device"] + ticks_ms
        assert row["in_process_model_ms"] > 0
        assert cpu["total"] == pytest.approx(sum(cpu[g] for g in THREAD_GROUPS), abs=0.01)
        assert row["non_model_ms"] == pytest.approx(cpu["total"] - row["model_ms"], abs=0.01)
        assert row["ranker_own_ms"] == pytest.approx(row["non_model_ms"] - row["floor_ms"], abs=0.01)
        # The floor's CPU is read in clock ticks as well: at a dozen pairs of about a millisecond each it
        # may read none, so what it must be is a whole number of ticks over the pairs, never below zero.
        floor_ticks = row["floor_ms"] * row["pairs"] * os.sysconf("SC_CLK_TCK") / 1000
        assert floor_ticks >= 0 and floor_ticks == pytest.approx(round(floor_ticks), abs=0.05)
    # Free passes: the null-model ranker's model time is a small fraction of the ranker's.
    for real, free in zip(result["points"], result["null_model"], strict=True):
        assert free["model_ms"] < real["model_ms"] / 2


def test_the_summary_tells_each_table_and_the_slopes(result):
    summary = result["summary"]
    for heading in ("## The ranker", "## The ranker with free model passes", "## Capacity"):
        assert heading in summary
    assert "ns per history event" in summary and "ns per candidate" in summary
    assert result["provenance"]["cores"] == os.cpu_count()


def test_a_gpu_busy_share_is_a_column_only_where_a_point_read_one(result):
    # On a CPU no point reads a GPU: no column, and the device is named.
    assert all(row["gpu_busy"] is None for row in result["points"] + result["null_model"])
    assert "GPU busy" not in result["summary"] and "on cpu" in result["summary"]
    # With `--device cuda` each point carries the busiest GPU's share over its measured pairs.
    on_gpu = {**result, "configuration": {**result["configuration"], "device": "cuda"}}
    on_gpu["points"] = [{**row, "gpu_busy": 0.42} for row in result["points"]]
    on_gpu["null_model"] = [{**row, "gpu_busy": None} for row in result["null_model"]]
    lines = summary(on_gpu).splitlines()
    ranker = lines[lines.index("## The ranker") + 2 :]
    assert ranker[0].endswith("| GPU busy |") and all(row.endswith("| 42 % |") for row in ranker[2:5])
    free = lines[
        lines.index("## The ranker with free model passes (`bench.micro.null_model`), same shapes and rates")
        + 2
    ]
    assert "GPU busy" not in free and "on cuda" in summary(on_gpu)


def test_a_device_other_than_cpu_or_cuda_is_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        main(["--device", "tpu"])
    assert "--device" in capsys.readouterr().err


def test_a_sampled_stack_goes_to_the_stage_of_its_innermost_known_frame():
    loop = "thread (1): MainThread;run (uvloop/__init__.py:92);Runner.run (asyncio/runners.py:118)"
    assert classify(loop) == "gRPC server and event loop"
    servicer = "RankerServicer.Rank (services/ranker/servicer.py:9)"
    decode = f"{loop};{servicer};sequence_arrays (services/common/validation.py:7)"
    assert classify(decode) == "decoding and validation"
    device = "thread (2): device;Scheduler._loop (services/ranker/engine/scheduler.py:1)"
    model = f"{device};silu (torch/nn/functional.py:2)"
    assert classify(model) == "model"
    assert classify("thread (2): device;Scheduler._loop (x);Condition.wait (threading.py:327)") == "waiting"
    assert classify("thread (3): Thread-1 (_poll_wrapper);Thread.run (threading.py:982)") == (
        "gRPC server and event loop"
    )


@pytest.mark.parametrize(
    ("flag", "value"), [("--lengths", ""), ("--lengths", "256,x"), ("--capacity-rates", "-5")]
)
def test_a_bad_list_is_refused_naming_its_flag(flag, value, capsys):
    with pytest.raises(SystemExit):
        main([flag, value])
    assert f"{flag}: {value!r} must list" in capsys.readouterr().err
