"""`python -m bench floors` runs end to end: `--floors` picks which floors run (both by default, unknown
names refused); the grpc floor starts a real echo server in a child process, calls it at a rate and in a
closed loop, and prints a table of per-call CPU that adds up; the router hop starts a ranker and a router
and prints both paths and the hop (no timing is asserted: figures are the benchmark's)."""

from __future__ import annotations

import re

import pytest

from bench.micro import floors
from services.common.config import listed, load


def test_both_floors_run_by_default_and_an_unknown_one_is_refused(capsys):
    assert listed(load(floors.FloorsConfig, [], environ={}), "floors") == ["grpc", "router-hop"]
    picked = load(floors.FloorsConfig, ["--floors", "router-hop"], environ={})
    assert listed(picked, "floors") == ["router-hop"]
    for bad in ("grpc,bogus", "grpc,grpc", ""):
        with pytest.raises(SystemExit):
            load(floors.FloorsConfig, ["--floors", bad], environ={})
        assert "--floors" in capsys.readouterr().err


def test_the_grpc_floor_prints_a_row_per_rate_whose_sides_add_up(capsys):
    floors.main(
        ["--floors", "grpc", "--rates", "40,0", "--seconds", "0.5", "--calls", "30", "--idle-seconds", "0.2"]
    )
    out = capsys.readouterr().out
    rows = re.findall(r"^\| ([^|]+) \| (\d+) \| (-?\d+) \| (-?\d+) \| (-?\d+) \|$", out, re.MULTILINE)
    assert [(label, int(calls)) for label, calls, *_ in rows] == [("40", 20), ("closed loop", 30)]
    for _, _, client, server, both in rows:
        assert int(client) > 0 and abs(int(client) + int(server) - int(both)) <= 1
    assert "paired hop" not in out  # the router hop was not picked


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_router_hop_times_both_paths_and_their_pairs(capsys):
    floors.main(["--floors", "router-hop", "--iterations", "6", "--warmup", "2", "--long-term-events", "256"])
    out = capsys.readouterr().out
    assert "Rank request: 256 long-term events, 16 short-term, 8 candidates" in out
    rows = re.findall(r"^(direct|router|hop) +(-?[\d.]+) +(-?[\d.]+)", out, re.MULTILINE)
    assert [name for name, *_ in rows] == ["direct", "router", "hop"]
    figures = {name: (float(p50), float(p99)) for name, p50, p99 in rows}
    assert all(0 < p50 <= p99 for p50, p99 in (figures["direct"], figures["router"]))
    for i in (0, 1):  # the hop is the router's figure less the direct one's
        hop = figures["router"][i] - figures["direct"][i]
        assert figures["hop"][i] == pytest.approx(hop, abs=0.002)
    assert re.search(r"^paired hop: median -?[\d.]+ ms over 6 adjacent pairs$", out, re.MULTILINE)
    assert "| rate, calls/s |" not in out  # the grpc floor was not picked
