"""`python -m bench rollout` for real, short: a fleet of two cpu-tiny rankers and a spare, a few seconds a
phase, one seed with the handoff off and one with it on. Every planned change happens in order, every
arrival of the seed's schedule is sent and answered, the spare serves once started, the handoff moves
bytes only when on, what it writes reads back, and no process is left behind."""

from __future__ import annotations

import gzip
import itertools
import json
import math

import numpy as np
import pytest

from bench.lib import envelope
from bench.rollout.__main__ import main
from services.loadgen.schedule import RateSchedule, poisson_arrivals
from tests.support.processes import fleet_children

# The spare warms up for about 6 s here before it serves: its 12 s before the SIGTERM leave it time to take
# users and demote some of them to DRAM, which its drain must then hold.
FLAGS = [
    "--seeds", "1", "--load-seed", "3", "--rankers", "2", "--rate", "10",
    "--warmup-s", "3", "--steady-s", "4", "--restart-slot-s", "8", "--scale-out-s", "12", "--scale-in-s", "6",
    "--tail-s", "2", "--startup-timeout-s", "60",
]  # fmt: skip
DURATION_S = 3 + 4 + 2 * 8 + 12 + 6 + 2


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["off", "on"])
def test_a_short_real_rollout_makes_every_change_answers_every_call_and_leaves_nothing_running(
    tmp_path, capsys, mode
):
    out = tmp_path / "rollout"
    assert main(["--output", str(out), "--modes", mode, *FLAGS]) == 0
    assert fleet_children() == []
    printed = capsys.readouterr().out
    assert (
        printed.startswith(f"plan: {DURATION_S} s of load a run")
        and "restart order ranker-1 → ranker-0" in printed
    )

    results = envelope.read(out / "results.json", "rollout")
    (run,) = results["runs"]
    assert (run["mode"], run["seed"]) == (mode, 3)
    changes = run["changes"]
    assert [(c["action"], c["ranker"]) for c in changes] == [
        ("restart", "ranker-1"), ("restart", "ranker-0"), ("start", "ranker-2"), ("stop", "ranker-2")
    ]  # fmt: skip
    for change in changes:
        assert change["began_s"] >= change["planned_s"]
        if change["action"] != "start":  # SIGTERMed: drained and gone with status 0, a restart Ready after
            assert change["signalled_s"] < change["exited_s"] and change["exit_code"] == 0
            assert change["resident_bytes"]["dram"] > 0  # what it held, read from its metrics
        if change["action"] != "stop":
            assert change["ready_s"] > change["began_s"]

    with gzip.open(out / "raw" / f"{mode}-s3-calls.jsonl.gz", "rt") as lines:
        calls = [json.loads(line) for line in lines]
    arrivals = poisson_arrivals(RateSchedule.constant(10.0), np.random.default_rng(3))
    planned = [round(t, 4) for t in itertools.takewhile(lambda t: t < DURATION_S, arrivals)]
    assert [call["intended_s"] for call in calls] == planned  # the seed's schedule, every arrival sent
    assert all(call["code"] == "OK" for call in calls)  # a drained ranker fails no call
    assert {call["instance"] for call in calls} == {"ranker-0", "ranker-1", "ranker-2"}
    spare = results["plan"]["changes"][2]["at_s"], results["plan"]["changes"][3]["at_s"]
    assert any(c["instance"] == "ranker-2" and spare[0] <= c["intended_s"] < spare[1] for c in calls)

    phases = {stats["phase"]: stats for stats in run["phases"]}
    assert sum(stats["calls"] for stats in phases.values()) == len(calls)
    assert phases["steady"]["sources"]["dram"] > 0 and phases["rollout"]["device_s"]["rank"] > 0
    received = sum(stats["rankers"].get("handoff_received_bytes", 0.0) for stats in phases.values())
    assert received > 0 if mode == "on" else received == 0.0  # drains pushed only with the handoff on
    (figures,) = results["figures"]["modes"]
    assert figures["failed"] == 0 and figures["drained"]["of"] > 0
    assert not math.isnan(figures["rollout_p99_ms"]["value"]) and results["figures"]["comparison"] is None
    assert "| (2) failed calls, measured phases | 0 (none) |" in (out / "summary.md").read_text()
    assert len((out / "timeline.csv").read_text().splitlines()) == 1 + DURATION_S
    assert (out / "timeline.png").stat().st_size > 0
