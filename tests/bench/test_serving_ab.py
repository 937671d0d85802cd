"""`python -m bench serving-ab`: its settings refuse a run with nothing to compare and shapes that are not
events:rate, and a real run on loopback drives every contender once a round, in an order that rotates, and
tells each ranker's CPU beyond the serving floor driven beside it."""

from __future__ import annotations

import asyncio
import re

import pytest

from bench.micro.serving.pairs import HBM
from bench.studies import serving_ab
from bench.studies.serving_ab import AFTER, FLOOR, FREE, ServingAb
from services.common.config import load


def test_settings_need_a_contender_and_shapes_of_events_and_rate():
    with pytest.raises(SystemExit):
        load(ServingAb, [], environ={})
    for bad in ("256", "256:0", "x:20", "256:20,:5"):
        with pytest.raises(SystemExit):
            load(ServingAb, ["--stand-ins", "true", "--shapes", bad], environ={})
    settings = load(ServingAb, ["--stand-ins", "true", "--shapes", "64:50,1024:12.5"], environ={})
    assert settings.shape_list() == [(64, 50.0), (1024, 12.5)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_real_run_drives_every_contender_in_rotating_turns(capsys):
    settings = load(
        ServingAb,
        ["--stand-ins", "true", "--shapes", "64:40", "--rounds", "3", "--pairs", "12", "--warmup-pairs", "2"],
        environ={},
    )
    rows = asyncio.run(serving_ab.compare(settings))
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
    table = serving_ab.table(rows, settings.rounds).splitlines()
    assert len(table) == 2 + 3
    cells = {line.split(" | ")[3]: line.split(" | ") for line in table[2:]}
    floor_median = float(cells[FLOOR][5])
    assert cells[FLOOR][6] == "-"
    for name in (FREE, AFTER):
        assert float(cells[name][6]) == pytest.approx(float(cells[name][5]) - floor_median, abs=0.011)
