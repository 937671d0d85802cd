"""bench.micro.grpc_floor runs end to end: a real echo server in a child process, calls at a rate and in a
closed loop, and a table of per-call CPU that adds up (no timing is asserted: figures are the benchmark's)."""

from __future__ import annotations

import re

from bench.micro import grpc_floor


def test_the_floor_benchmark_prints_a_row_per_rate_whose_sides_add_up(capsys):
    grpc_floor.main(["--rates", "40,0", "--seconds", "0.5", "--calls", "30", "--idle-seconds", "0.2"])
    out = capsys.readouterr().out
    rows = re.findall(r"^\| ([^|]+) \| (\d+) \| (-?\d+) \| (-?\d+) \| (-?\d+) \|$", out, re.MULTILINE)
    assert [(label, int(calls)) for label, calls, *_ in rows] == [("40", 20), ("closed loop", 30)]
    for _, _, client, server, both in rows:
        assert int(client) > 0 and abs(int(client) + int(server) - int(both)) <= 1
