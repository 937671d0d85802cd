"""bench.micro.serving end to end: a real ranker, the serving floor and the null-model ranker in child
processes, driven by relayed pairs from a load generator of its own; the rates follow each process's measured
capacity and what it reads back adds up (no timing is asserted: figures are the benchmark's)."""

from __future__ import annotations

import os

import pytest

from bench.lib import envelope
from bench.micro.pairs import BATCH_MAX, admit_bytes, batch_bytes, windows
from bench.micro.serving.__main__ import main
from bench.micro.serving.point import THREAD_GROUPS, classify, stage_shares
from bench.micro.serving.summary import summary
from relaygr.v1 import common_pb2, ranker_pb2, trigger_pb2

HBM = "CACHE_SOURCE_HBM"


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("serving")
    before = os.sched_getaffinity(0)
    main(
        [
            "--lengths", "48,96", "--pairs", "12", "--warmup-pairs", "2", "--rate", "20",
            "--candidates", "32", "--point-seconds", "0.5", "--capacity-seconds", "0.3",
            "--capacity-start", "40", "--capacity-growth", "4", "--capacity-refine", "1",
            "--idle-pairs", "3", "--windows-ms", "20", "--out", str(out),
        ]
    )  # fmt: skip
    written = envelope.read(out / "results.json", "serving")
    written["affinity"] = (before, os.sched_getaffinity(0))
    written["summary"] = (out / "summary.md").read_text()
    return written


def test_each_process_is_driven_at_the_low_rate_half_its_capacity_and_its_capacity(result):
    for name, rows in (("null_model", result["null_model"]), ("ranker", result["points"])):
        for length in (48, 96):
            found = result["capacity"][name][str(length)]
            steps = found["search"]
            held = [s["rate"] for s in steps if _held(s)]
            # The search grew by 4 from its start until a rate was not held, then halved the interval once;
            # real passes start at a quarter of the rate their passes alone would fill the device at.
            start = 40 if name == "null_model" else min(40, 250 / steps[0]["in_process_model_ms"])
            assert steps[0]["rate"] == pytest.approx(start, abs=0.01)
            assert found["pairs_per_s"] == pytest.approx(max(held, default=0.5), abs=0.01)
            assert all(s["rate"] > found["pairs_per_s"] for s in steps if not _held(s))
            at = {r["load"]: r for r in rows if r["length"] == length}
            assert at["low"]["rate"] == pytest.approx(min(20, 0.6 * found["pairs_per_s"]), abs=0.01)
            assert at["capacity"]["rate"] == pytest.approx(found["pairs_per_s"], abs=0.01)
            assert at["half"]["rate"] == pytest.approx(found["pairs_per_s"] / 2, abs=0.01)
    # The floor's own capacity is searched too, and it ran again at every rate a ranker did.
    assert set(result["capacity"]["floor"]) == {"48", "96"}
    floor_rates = {(f["length"], f["rate"]) for f in result["floor"]}
    assert {(r["length"], r["rate"]) for r in result["points"] + result["null_model"]} <= floor_rates


def _held(step: dict) -> bool:
    """The search's rule: every Rank an HBM hit, within 25 ms at P99 (plus twice a pair's real passes), at
    95 % of the rate."""
    return (
        not step["errors"]
        and step["sources"] == {HBM: step["pairs"]}
        and step["rank_p99_ms"] <= 25 + 2 * step["in_process_model_ms"]
        and step["achieved_rate"] >= 0.95 * step["rate"]
    )


def test_every_rank_is_answered_and_the_low_rate_ranks_are_hbm_hits(result):
    for row in result["points"] + result["null_model"] + result["floor"]:
        assert sum(row["sources"].values()) + sum(row["errors"].values()) == row["pairs"]
        if row["load"] == "low":
            assert row["sources"] == {HBM: row["pairs"]} and row["errors"] == {}
    for idle in result["idle"].values():
        assert idle["sources"] == {HBM: 3}


def test_the_load_generator_runs_on_cpus_of_its_own_and_its_cpu_is_reported(result):
    before, after = result["affinity"]
    assert after == before  # the benchmark ran beside the generator, and gave this thread its CPUs back
    provenance = result["provenance"]
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        assert provenance["generator_cpus"] == cpus[-1:]
        assert provenance["ranker_cpus"] == cpus[:-1]
    for row in result["points"] + result["null_model"]:
        # The generator sent every pair: it took some CPU, and never more than its CPUs hold.
        assert 0 < row["generator_cores"] <= len(provenance["generator_cpus"] or cpus) + 0.05


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
        floor = next(f for f in result["floor"] if (f["length"], f["rate"]) == (row["length"], row["rate"]))
        assert row["floor_ms"] == floor["cpu_ms"]["total"]
        floor_ticks = row["floor_ms"] * row["pairs"] * os.sysconf("SC_CLK_TCK") / 1000
        assert floor_ticks >= 0 and floor_ticks == pytest.approx(round(floor_ticks), abs=0.05)
    # Free passes: the null-model ranker's model time is a small fraction of the ranker's.
    real = {(r["length"], r["load"]): r for r in result["points"]}
    for free in result["null_model"]:
        assert free["model_ms"] < real[(free["length"], free["load"])]["model_ms"] / 2


def test_the_summary_tells_each_table_and_the_slopes(result):
    summary = result["summary"]
    for heading in (
        "## The ranker's own code beyond the serving floor",
        "## Capacities",
        "## The ranker",
        "## The ranker with free model passes",
    ):
        assert heading in summary
    assert "ns per history event" in summary
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
    assert ranker[0].endswith("| GPU busy |") and all(row.endswith("| 42 % |") for row in ranker[2:8])
    free = lines[lines.index("## The ranker with free model passes (`bench.micro.null_model`)") + 2]
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


@pytest.mark.parametrize(("flag", "value"), [("--lengths", ""), ("--lengths", "256,x"), ("--lengths", "-5")])
def test_a_bad_list_is_refused_naming_its_flag(flag, value, capsys):
    with pytest.raises(SystemExit):
        main([flag, value])
    assert f"{flag}: {value!r} must list" in capsys.readouterr().err


@pytest.mark.parametrize("cpus", ["x", "9999", ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))])
def test_generator_cpus_the_process_may_not_use_or_that_leave_the_ranker_none_are_refused(cpus, capsys):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: the generator and the ranker share it, nothing is split")
    with pytest.raises(SystemExit):
        main(["--generator-cpus", cpus])
    assert "--generator-cpus" in capsys.readouterr().err


def test_coalesced_pre_infers_are_measured_straight_and_through_a_trigger_against_single_calls(result):
    coalescing = result["coalescing"]
    for name in ("null_model", "ranker", "floor"):
        rows = coalescing[name]
        expected_rows = [("ranks_alone", 0), ("direct", 0), ("through_trigger", 0), ("direct", 20)]
        expected_rows += [("through_trigger", 20)]
        if name == "floor":  # the floor has no latency curve for a trigger to admit by
            expected_rows = [row for row in expected_rows if row[0] != "through_trigger"]
        assert [(r["how"], r["window_ms"]) for r in rows] == expected_rows
        capacity = next(
            r for r in result["points" if name == "ranker" else "null_model"] if r["load"] == "capacity"
        )
        ranks = rows[0]
        for row in rows:
            assert row["rate"] == capacity["rate"] and row["length"] == 48 and not row["errors"]
            assert sum(row["sources"].values()) == row["pairs"]  # every Rank answered
        # The Ranks alone found every prefix in HBM, pre-inferred before the clock; no PreInfer within it.
        assert ranks["sources"] == {HBM: ranks["pairs"]} and ranks["pre_infer_ms"] is None
        assert ranks["calls"] == 0
        direct = [r for r in rows if r["how"] == "direct"]
        # Single calls carry one PreInfer each; in 20 ms windows, the PreInfers sent within each.
        windows_sent = windows(direct[1]["pairs"], direct[1]["rate"], 0.02)
        assert direct[0]["per_call"] == 1.0
        assert direct[1]["per_call"] == pytest.approx(direct[1]["pairs"] / len(windows_sent), abs=0.01)
        for row in direct:  # a PreInfer's own CPU: the pair's less the Ranks' alone
            assert row["pre_infer_ms"] == pytest.approx(
                row["non_model_ms"] - ranks["non_model_ms"], abs=0.002
            )
        for row in (r for r in rows if r["how"] == "through_trigger"):
            assert row["admit_p99_ms"] is not None and 0 <= row["ready"] <= row["pairs"]
    assert "## Coalesced PreInfers" in result["summary"]


def test_a_window_holds_the_prefers_sent_within_it_of_its_first_and_is_sent_that_long_after():
    # 1000 a second, 3.5 ms windows: 0-3 ms, 4-7 ms, 8-9 ms, each by its first pair's index.
    sent = windows(10, 1000.0, 0.0035)
    assert {first: group for first, (_, group) in sent.items()} == {
        0: [0, 1, 2, 3], 4: [4, 5, 6, 7], 8: [8, 9]
    }  # fmt: skip
    assert [at for at, _ in sent.values()] == pytest.approx([0.0035, 0.0075, 0.0115])
    # No window: each alone, at its own time.
    alone = windows(10, 1000.0, 0.0)
    assert [len(group) for _, group in alone.values()] == [1] * 10 and alone[3][0] == pytest.approx(0.003)
    # A window that fills is sent when its last PreInfer arrives, and the next one starts after it.
    full = windows(BATCH_MAX + 2, 1000.0, 1.0)
    assert [(len(group), at) for at, group in full.values()] == [
        (BATCH_MAX, pytest.approx((BATCH_MAX - 1) / 1000)), (2, pytest.approx(BATCH_MAX / 1000 + 1.0))
    ]  # fmt: skip


def test_a_batch_and_an_admit_are_built_from_serialized_prefers_as_the_contract_reads_them():
    one = ranker_pb2.PreInferRequest(user_id="u1", long_term=common_pb2.BehaviorSequence(item_ids=[1, 2]))
    two = ranker_pb2.PreInferRequest(user_id="u2", long_term=common_pb2.BehaviorSequence(item_ids=[3] * 300))
    batch = ranker_pb2.PreInferBatchRequest.FromString(
        batch_bytes([one.SerializeToString(), two.SerializeToString()])
    )
    assert list(batch.requests) == [one, two]
    admit = trigger_pb2.AdmitRequest.FromString(admit_bytes(two.SerializeToString(), 16, 512))
    assert (admit.user_id, list(admit.long_term.item_ids)) == ("u2", [3] * 300)
    assert (admit.short_term_length, admit.num_candidates) == (16, 512)


def test_stage_shares_count_the_sampled_stacks_and_skip_lines_that_are_not_one(tmp_path):
    raw = tmp_path / "raw.txt"
    device = "thread (2): device;Scheduler._loop (services/ranker/engine/scheduler.py:1)"
    raw.write_text(
        f"{device};silu (torch/nn/functional.py:2) 3\n"
        "thread (1): MainThread;run (uvloop/__init__.py:92) 1\n"
        f"{device};Condition.wait (threading.py:327) 5\n"
        "a note py-spy wrote 0.0\n"
    )
    assert stage_shares(str(raw)) == {"model": 0.75, "gRPC server and event loop": 0.25}
    assert not raw.exists()
