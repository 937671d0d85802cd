"""The one open-loop driver's schedule (`bench.micro.pairs.open_loop`): open loop, each send starts at its
intended time, one every 1/rate s, whatever the answers; closed loop (rate 0), each once the one before is
answered. (The driver's pairs against real processes are tested by the commands that drive them.)"""

from __future__ import annotations

import asyncio
import itertools

import pytest

from bench.micro.pairs import LEAD_S, open_loop


def drive(rate: float) -> tuple[list[tuple[float, float, float]], float, float]:
    """(intended, started, answered) of five sends that each take 30 ms; the run's wall; when it began."""

    async def go() -> tuple[list[tuple[float, float, float]], float, float]:
        loop, sends = asyncio.get_running_loop(), []

        async def send(i: int, at: float) -> None:
            started = loop.time()
            await asyncio.sleep(0.03)
            sends.append((at, started, loop.time()))

        began = loop.time()
        return sends, await open_loop(5, rate, send), began

    return asyncio.run(go())


def test_open_loop_sends_at_their_intended_times_without_waiting_for_answers():
    sends, wall, began = drive(100.0)
    intended = sorted(at for at, _, _ in sends)
    assert intended[0] == pytest.approx(began + LEAD_S, abs=0.005)
    assert intended == pytest.approx([intended[0] + i / 100 for i in range(5)])
    assert all(started >= at for at, started, _ in sends)
    first, second = sorted(sends)[:2]
    assert second[1] < first[2]  # the second went before the first was answered
    assert wall >= 0.04 + 0.03 - 0.001  # to the last answer, from the first intended time


def test_a_closed_loop_sends_each_once_the_one_before_is_answered():
    sends, wall, _ = drive(0.0)
    for (_, _, answered), (at, started, _) in itertools.pairwise(sends):
        assert started >= answered and at >= answered
    assert wall >= 5 * 0.03
