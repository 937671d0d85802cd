"""`python -m bench serving --in-turn-against …`: its settings refuse contenders it does not know, a
`--before-tree` without `before` (and `before` without one) and shapes that are not events:rate within the
rankers' longest history; a real run on loopback drives every contender once a round, in an order that
rotates, and tells each ranker's CPU beyond the serving floor driven beside it."""

from __future__ import annotations

import asyncio
import re

import pytest

from bench.micro.pairs import HBM
from bench.micro.serving import in_turn
from bench.micro.serving.config import ServingConfig
from bench.micro.serving.in_turn import AFTER, FLOOR, FREE
from services.common.config import listed, load


def test_settings_need_known_contenders_and_shapes_of_events_and_rate():
    assert listed(load(ServingConfig, [], environ={}), "in_turn_against") == []  # the sweep
    for wrong in (["--in-turn-against", "bogus"], ["--in-turn-against", "before"], ["--before-tree", "/tmp"]):
        with pytest.raises(SystemExit):
            load(ServingConfig, wrong, environ={})
    both = ["--in-turn-against", "stand-ins,before", "--before-tree", "/tmp/before"]
    assert listed(load(ServingConfig, both, environ={}), "in_turn_against") == ["stand-ins", "before"]
    for bad in ("256", "256:0", "x:20", "256:20,:5", "8192:5"):  # 8192: past the longest of --lengths
        with pytest.raises(SystemExit):
            load(ServingConfig, ["--in-turn-against", "stand-ins", "--shapes", bad], environ={})
    settings = load(
        ServingConfig, ["--in-turn-against", "stand-ins", "--shapes", "64:50,1024:12.5"], environ={}
    )
    assert settings.shape_list() == [(64, 50.0), (1024, 12.5)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_real_run_drives_every_contender_in_rotating_turns(capsys):
    settings = load(
        ServingConfig,
        ["--in-turn-against", "stand-ins", "--shapes", "64:40", "--rounds", "3", "--pairs", "12",
         "--warmup-pairs", "2"],
        environ={},
    )  # fmt: skip
    rows = asyncio.run(in_turn.compare(settings))
    assert [(length, rate, name) for length, rate, name, _ in rows] == [
        (64, 40.0, FLOOR), (64, 40.0, FREE), (64, 40.0, AFTER)
    ]  # fmt: skip
    for _, _, name, points in rows:
        assert len(points) == 3, name
        assert all(p.pairs == 12 and not p.errors and p.sources == {HBM: 12} for p in points), name
        assert all(p.non_model_ms > 0 for p in points), name
    # Each round's first contender is the next one's: the order rotates.
    driven = re.findall(r"^# (.+?) L=64:", capsys.readouterr().err, flags=re.MULTILINE)
    assert driven == [FLOOR, FREE, AFTER, FREE, AFTER, FLOOR, AFTER, FLOOR, FREE]
    table = in_turn.table(rows, settings).splitlines()
    assert len(table) == 2 + 3
    cells = {line.split(" | ")[3]: line.split(" | ") for line in table[2:]}
    assert all(line.split(" | ")[1] == "512" for line in table[2:])  # the candidates, --candidates' default
    floor_median = float(cells[FLOOR][5])
    assert cells[FLOOR][6] == "-"
    for name in (FREE, AFTER):
        assert float(cells[name][6]) == pytest.approx(float(cells[name][5]) - floor_median, abs=0.011)
